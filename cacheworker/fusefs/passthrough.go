package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Opens of one-block files are answered with FUSE passthrough when the block is in a local
// tier. The kernel fails an open (EIO) that asks for a mode the inode cannot be in: while a
// file is open in passthrough mode every new open must be passthrough with the same backing
// id, and while it is open in cached mode none may be passthrough. So every file's outstanding
// opens are counted by mode, with the backing id, in the opens table; it is shared memory
// that a process taking over the mount inherits, because the kernel keeps the modes of opens
// made before the handover, and an open's mode is in its handle number, because the RELEASE
// of an open made before the handover reaches the new process. A failed registration leaves
// that open (and only it) in cached mode.
//
// The counts never undercount the kernel's: the kernel drops an open's mode before it sends
// RELEASE, and the counts drop when RELEASE arrives. So "no cached opens here" implies none
// in the kernel, and likewise for passthrough.

// openMode decides the mode of a new open of file id, filling out, and counts it. It reports
// whether the open is passed through.
func (fsys *fileSystem) openMode(id uint64, n *node, out *fuse.OpenOut) bool {
	if !fsys.passthrough {
		return false
	}
	lock := &fsys.locks[id%uint64(len(fsys.locks))]
	lock.Lock()
	defer lock.Unlock()
	c, unlock := fsys.opens.at(id)
	defer unlock()
	if c.backingID == 0 && c.cached == 0 {
		c.backingID = fsys.register(n)
	}
	if c.backingID == 0 {
		c.cached++
		return false
	}
	out.BackingID = c.backingID
	out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
	// The page cache of the FUSE inode is not used in passthrough mode; the backing file's is.
	out.OpenFlags &^= fuse.FOPEN_KEEP_CACHE
	c.passthrough++
	fsys.m.passthroughOpens.Inc()
	return true
}

// released counts the release of an open of file id in the given mode, giving the backing id
// back with the last passthrough open.
func (fsys *fileSystem) released(id uint64, n *node, passthrough bool) {
	if fsys.opens == nil || n.dir {
		return
	}
	lock := &fsys.locks[id%uint64(len(fsys.locks))]
	lock.Lock()
	defer lock.Unlock()
	c, unlock := fsys.opens.at(id)
	defer unlock()
	switch {
	case !passthrough:
		if c.cached > 0 {
			c.cached--
		}
	case c.passthrough > 0:
		c.passthrough--
		if c.passthrough == 0 {
			// Files still open keep their reference in the kernel; the id only goes.
			if errno := fsys.conn.CloseBacking(c.backingID); errno != 0 && errno != syscall.EBADF {
				fsys.log.Error(errno, "releasing a passthrough backing file", "file", n.path)
			}
			c.backingID = 0
		}
	}
}

// register hands the kernel the local copy of n's only block as its backing file, and
// returns the backing id, or 0 if n cannot be passed through now.
func (fsys *fileSystem) register(n *node) int32 {
	if n.size == 0 || n.size > fsys.blockSize || fsys.local == nil {
		return 0 // more than one block (see doc.go), or nothing to read
	}
	// Opening the block counts as an access for the tier's eviction order, the only one the
	// worker sees: the reads that follow go from the kernel to the block file directly.
	file, err := fsys.local.OpenBlock(context.Background(), n.path, n.etag, 0)
	if err != nil {
		return 0 // not in a local tier (yet): cached mode, and the read fetches it
	}
	defer func() { _ = file.Close() }() // the kernel holds its own reference once registered
	st, err := file.Stat()
	if err != nil || st.Size() != n.size {
		return 0 // changed since the listing: the cached path reports it
	}
	id, errno := fsys.conn.OpenBacking(file)
	if errno != 0 {
		if fsys.warned.CompareAndSwap(false, true) {
			fsys.log.Error(errno, "the kernel refused a passthrough backing file; such files are served through the worker",
				"file", n.path, "hint", "passthrough needs CAP_SYS_ADMIN and a tier file system that is not itself stacked (overlayfs)")
		}
		return 0
	}
	return id
}
