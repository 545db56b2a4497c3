package fusefs

import (
	"context"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// passthroughState is what one file's opens share; fileNode.mu guards it.
type passthroughState struct {
	// backingID is the kernel's id of the file's backing file while passthrough opens of it
	// are outstanding, 0 otherwise.
	backingID int32
	// passthrough and cached count the outstanding opens in each mode.
	passthrough, cached int
	// opens records the mode of every outstanding open by its handle number.
	opens map[uint64]bool
}

// rawFS wraps go-fuse's node file system to answer opens of one-block files with FUSE
// passthrough when the block is in a local tier, and count the modes of the opens.
//
// It decides here rather than through go-fuse's fs.FilePassthroughFder because the kernel
// fails an open with EIO if it asks for a mode the inode cannot be in: while a file is open
// in passthrough mode every new open must be passthrough with the same backing file, and
// while it is open in cached mode none may be passthrough. go-fuse keeps the backing id per
// inode but does not say whether an open got one, and after one failed registration it stops
// passthrough for the whole mount, so that a later open of a file that still has a backing
// file would fail. Here every open's mode is known, and a failed registration leaves the
// open (and only it) in cached mode.
//
// The counts never undercount the kernel's: the kernel drops an open's mode before it sends
// RELEASE, and the counts drop when RELEASE arrives. So "no cached opens here" implies none
// in the kernel, and likewise for passthrough.
type rawFS struct {
	fuse.RawFileSystem
	fsys *fileSystem
	// files are the file nodes by inode number, which is also their FUSE node id
	// (fs.Options.ExternalNodeID). Written before the mount, only read afterwards.
	files map[uint64]*fileNode
	// enabled is set once the kernel has agreed to passthrough.
	enabled bool
	server  *fuse.Server
	// warned is set once a failed registration has been logged.
	warned atomic.Bool
}

// Init implements fuse.RawFileSystem, remembering the server for the backing-file calls.
func (r *rawFS) Init(s *fuse.Server) {
	r.server = s
	r.RawFileSystem.Init(s)
}

// Open implements fuse.RawFileSystem.
func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := r.RawFileSystem.Open(cancel, in, out)
	f := r.files[in.NodeId]
	if !st.Ok() || !r.enabled || f == nil || out.Fh == 0 {
		return st
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	pt := &f.pt
	if pt.backingID == 0 && pt.cached == 0 {
		pt.backingID = r.register(f)
	}
	if pt.opens == nil {
		pt.opens = map[uint64]bool{}
	}
	if pt.backingID == 0 {
		pt.cached++
		pt.opens[out.Fh] = false
		return st
	}
	out.BackingID = pt.backingID
	out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
	// The page cache of the FUSE inode is not used in passthrough mode; the backing file's is.
	out.OpenFlags &^= fuse.FOPEN_KEEP_CACHE
	pt.passthrough++
	pt.opens[out.Fh] = true
	r.fsys.m.passthroughOpens.Inc()
	return st
}

// register hands the kernel the local copy of f's only block as its backing file, and
// returns the backing id, or 0 if f cannot be passed through now. f.mu is held.
func (r *rawFS) register(f *fileNode) int32 {
	if f.size == 0 || f.size > r.fsys.blockSize || r.fsys.local == nil {
		return 0 // more than one block (see doc.go), or nothing to read
	}
	// Opening the block counts as an access for the tier's eviction order, the only one the
	// worker sees: the reads that follow go from the kernel to the block file directly.
	file, err := r.fsys.local.OpenBlock(context.Background(), f.path, 0)
	if err != nil {
		return 0 // not in a local tier (yet): cached mode, and the read fetches it
	}
	defer func() { _ = file.Close() }() // the kernel holds its own reference once registered
	st, err := file.Stat()
	if err != nil || st.Size() != f.size {
		return 0 // changed since the listing: the cached path reports it
	}
	id, errno := r.server.RegisterBackingFd(&fuse.BackingMap{Fd: int32(file.Fd())})
	if errno != 0 {
		if r.warned.CompareAndSwap(false, true) {
			r.fsys.log.Error(errno, "the kernel refused a passthrough backing file; such files are served through the worker",
				"file", f.path, "hint", "passthrough needs CAP_SYS_ADMIN and a tier file system that is not itself stacked (overlayfs)")
		}
		return 0
	}
	return id
}

// Release implements fuse.RawFileSystem. The count is updated before go-fuse releases the
// handle, because go-fuse may hand its number to a new open as soon as it has.
func (r *rawFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	if f := r.files[in.NodeId]; f != nil && r.enabled {
		f.mu.Lock()
		pt := &f.pt
		if passthrough, ok := pt.opens[in.Fh]; ok {
			delete(pt.opens, in.Fh)
			if passthrough {
				pt.passthrough--
				if pt.passthrough == 0 {
					// Files still open keep their reference in the kernel; the id only goes.
					if errno := r.server.UnregisterBackingFd(pt.backingID); errno != 0 && errno != syscall.EBADF {
						r.fsys.log.Error(errno, "releasing a passthrough backing file", "file", f.path)
					}
					pt.backingID = 0
				}
			} else {
				pt.cached--
			}
		}
		f.mu.Unlock()
	}
	r.RawFileSystem.Release(cancel, in)
}
