package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/strata-cache/strata/cacheworker/understore"
)

// Modes of what the file systems show: read-only for everyone, since pods run as any user.
const (
	fileMode = 0o444
	dirMode  = 0o555
	// ioSize is the st_blksize the files report: the largest FUSE request the mounts ask for,
	// so that tools which size their reads by it make one request per read.
	ioSize = maxRead
)

// fileSystem is what every node of one mount shares.
type fileSystem struct {
	blocks    BlockReader
	local     LocalBlocks
	blockSize int64
	m         *Metrics
	log       logr.Logger
	files     int
	bytes     int64
}

func (fsys *fileSystem) statfs(out *fuse.StatfsOut) {
	const bsize = 4096
	*out = fuse.StatfsOut{}
	out.Bsize, out.Frsize = bsize, bsize
	out.Blocks = uint64((fsys.bytes + bsize - 1) / bsize)
	out.Files = uint64(fsys.files)
	out.NameLen = maxNameLen
}

func setTimes(a *fuse.Attr, t time.Time) { a.SetTimes(&t, &t, &t) }

// rootNode is the Dataset's top folder; it turns the listing into inodes when it is added.
type rootNode struct {
	dirNode
	tree *tree
	// files receives every file node by inode number, for passthrough (see rawFS).
	files map[uint64]*fileNode
}

var _ = (fs.NodeOnAdder)((*rootNode)(nil))

// OnAdd makes an inode for every folder and file of the listing. They are persistent: the
// tree never changes while mounted, so go-fuse never needs to look anything up again.
func (r *rootNode) OnAdd(ctx context.Context) {
	ino := uint64(fuse.FUSE_ROOT_ID)
	var add func(parent *fs.Inode, dir *entry, prefix string)
	add = func(parent *fs.Inode, dir *entry, prefix string) {
		for _, name := range sortedNames(dir) {
			e := dir.children[name]
			ino++
			if e.isDir() {
				d := &dirNode{fsys: r.fsys, mtime: e.mtime}
				ch := parent.NewPersistentInode(ctx, d, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino})
				parent.AddChild(name, ch, false)
				add(ch, e, prefix+name+"/")
				continue
			}
			f := &fileNode{fsys: r.fsys, path: prefix + name, size: e.size, mtime: e.mtime}
			ch := parent.NewPersistentInode(ctx, f, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino})
			parent.AddChild(name, ch, false)
			r.files[ino] = f
		}
	}
	add(&r.Inode, r.tree.root, "")
	r.tree = nil // the inodes hold what is needed now
}

// dirNode is a folder. Everything that would change it fails with EROFS.
type dirNode struct {
	fs.Inode
	fsys  *fileSystem
	mtime time.Time
}

var (
	_ = (fs.NodeGetattrer)((*dirNode)(nil))
	_ = (fs.NodeStatfser)((*dirNode)(nil))
	_ = (fs.NodeSetattrer)((*dirNode)(nil))
	_ = (fs.NodeMkdirer)((*dirNode)(nil))
	_ = (fs.NodeMknoder)((*dirNode)(nil))
	_ = (fs.NodeCreater)((*dirNode)(nil))
	_ = (fs.NodeTmpfiler)((*dirNode)(nil))
	_ = (fs.NodeSymlinker)((*dirNode)(nil))
	_ = (fs.NodeLinker)((*dirNode)(nil))
	_ = (fs.NodeUnlinker)((*dirNode)(nil))
	_ = (fs.NodeRmdirer)((*dirNode)(nil))
	_ = (fs.NodeRenamer)((*dirNode)(nil))
)

// Getattr implements fs.NodeGetattrer.
func (d *dirNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | dirMode
	out.Nlink = 2
	out.Blksize = ioSize
	setTimes(&out.Attr, d.mtime)
	return 0
}

// Statfs implements fs.NodeStatfser: the Dataset's size and file count, nothing free.
func (d *dirNode) Statfs(_ context.Context, out *fuse.StatfsOut) syscall.Errno {
	d.fsys.statfs(out)
	return 0
}

// The mount is read-only ("ro"), so the kernel refuses these before they get here; they fail
// here too so that the tree can never change, whatever the mount options.

// Setattr implements fs.NodeSetattrer.
func (d *dirNode) Setattr(context.Context, fs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}

// Mkdir implements fs.NodeMkdirer.
func (d *dirNode) Mkdir(context.Context, string, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

// Mknod implements fs.NodeMknoder.
func (d *dirNode) Mknod(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

// Create implements fs.NodeCreater.
func (d *dirNode) Create(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}

// Tmpfile implements fs.NodeTmpfiler.
func (d *dirNode) Tmpfile(context.Context, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}

// Symlink implements fs.NodeSymlinker.
func (d *dirNode) Symlink(context.Context, string, string, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

// Link implements fs.NodeLinker.
func (d *dirNode) Link(context.Context, fs.InodeEmbedder, string, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

// Unlink implements fs.NodeUnlinker; go-fuse's default would drop the child from the tree.
func (d *dirNode) Unlink(context.Context, string) syscall.Errno { return syscall.EROFS }

// Rmdir implements fs.NodeRmdirer.
func (d *dirNode) Rmdir(context.Context, string) syscall.Errno { return syscall.EROFS }

// Rename implements fs.NodeRenamer.
func (d *dirNode) Rename(context.Context, string, fs.InodeEmbedder, string, uint32) syscall.Errno {
	return syscall.EROFS
}

// fileNode is one object of the Dataset.
type fileNode struct {
	fs.Inode
	fsys  *fileSystem
	path  string
	size  int64
	mtime time.Time

	mu sync.Mutex
	// logged holds the blocks whose failure was logged, so a reader retrying a failing
	// block does not flood the log.
	logged map[int64]bool
	// pt is the file's passthrough state (see passthrough.go).
	pt passthroughState
}

var (
	_ = (fs.NodeGetattrer)((*fileNode)(nil))
	_ = (fs.NodeStatfser)((*fileNode)(nil))
	_ = (fs.NodeSetattrer)((*fileNode)(nil))
	_ = (fs.NodeOpener)((*fileNode)(nil))
	_ = (fs.NodeReader)((*fileNode)(nil))
	_ = (fs.NodeWriter)((*fileNode)(nil))
)

// Getattr implements fs.NodeGetattrer.
func (f *fileNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | fileMode
	out.Nlink = 1
	out.Size = uint64(f.size)
	out.Blocks = uint64((f.size + 511) / 512)
	out.Blksize = ioSize
	setTimes(&out.Attr, f.mtime)
	return 0
}

// Statfs implements fs.NodeStatfser.
func (f *fileNode) Statfs(_ context.Context, out *fuse.StatfsOut) syscall.Errno {
	f.fsys.statfs(out)
	return 0
}

// Setattr implements fs.NodeSetattrer: nothing about a file can change.
func (f *fileNode) Setattr(context.Context, fs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}

// Write implements fs.NodeWriter.
func (f *fileNode) Write(context.Context, fs.FileHandle, []byte, int64) (uint32, syscall.Errno) {
	return 0, syscall.EROFS
}

// Open implements fs.NodeOpener. Files open read-only only.
//
// FOPEN_KEEP_CACHE lets the kernel keep the file's pages in its page cache from one open to
// the next. Without it the kernel drops them at every open, because a FUSE file system may
// change under it; ours cannot while mounted (the tree is listed once and every block is
// immutable), so keeping them turns every re-read by any pod of the node into a page-cache
// hit that never reaches the worker.
func (f *fileNode) Open(_ context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&(syscall.O_TRUNC|syscall.O_APPEND|syscall.O_CREAT) != 0 {
		return nil, 0, syscall.EROFS
	}
	return &handle{f: f}, fuse.FOPEN_KEEP_CACHE, 0
}

// Read implements fs.NodeReader: the range [off, off+len(dest)) is cut into blocks of the
// cache's block size, each read through the cache (or from the local tier directly), and the
// needed slice of each copied. Reads that reach past the end return what there is.
func (f *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := fh.(*handle)
	if !ok {
		return nil, syscall.EBADF
	}
	f.fsys.m.reads.Inc()
	if off >= f.size || len(dest) == 0 {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), f.size)
	bs := f.fsys.blockSize
	n := 0
	for pos := off; pos < end; {
		index := pos / bs
		start := index * bs
		// want is the length this block must have for the read: all of it unless it is the last.
		want := min(bs, f.size-start)
		b, err := h.block(ctx, index)
		if err != nil {
			return nil, f.fail(ctx, index, err)
		}
		k := int(min(end, start+want) - pos)
		err = b.readAt(dest[n:n+k], pos-start, want)
		h.put(b)
		if err != nil {
			return nil, f.fail(ctx, index, err)
		}
		n += k
		pos += int64(k)
	}
	f.fsys.m.readBytes.Add(float64(n))
	return fuse.ReadResultData(dest[:n]), 0
}

// errChanged means a block is shorter than the listing said: the object changed in the
// under-store after the Dataset was mounted.
var errChanged = errors.New("the object is shorter than when the Dataset was mounted: it changed in the under-store")

// fail maps a read failure to an errno, logs it once per block, and counts it.
func (f *fileNode) fail(ctx context.Context, index int64, err error) syscall.Errno {
	f.fsys.m.readErrors.Inc()
	errno := syscall.EIO
	switch {
	case ctx.Err() != nil:
		// The reader was interrupted; that is the reader's doing, not worth a log line.
		return syscall.EINTR
	case errors.Is(err, understore.ErrNotFound):
		errno = syscall.ENOENT
	}
	f.mu.Lock()
	first := !f.logged[index]
	if first {
		if f.logged == nil {
			f.logged = map[int64]bool{}
		}
		f.logged[index] = true
	}
	f.mu.Unlock()
	if first {
		f.fsys.log.Error(err, "read failed", "file", f.path, "block", index, "errno", errno.Error())
	}
	return errno
}

// handle is an open file. It keeps the block it read last, so that a sequential reader, whose
// FUSE reads are far smaller than a block, opens or fetches each block once rather than once
// per request: the local copy as an open file (pread, no copy of the whole block), or the
// bytes the cache just fetched.
type handle struct {
	f   *fileNode
	mu  sync.Mutex
	cur *blockRef
}

// blockRef is one block of a file, held by a handle and by the reads using it.
type blockRef struct {
	index int64
	file  *os.File // the block in a local tier, or
	data  []byte   // the block's bytes
	refs  int      // guarded by handle.mu; the file is closed when it drops to 0
}

// readAt fills p from offset off of the block, which must be want bytes long.
func (b *blockRef) readAt(p []byte, off, want int64) error {
	if b.file != nil {
		n, err := b.file.ReadAt(p, off)
		if errors.Is(err, io.EOF) && n < len(p) {
			return fmt.Errorf("local copy of block %d: %w", b.index, errChanged)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading the local copy of block %d: %w", b.index, err)
		}
		return nil
	}
	if int64(len(b.data)) < want {
		return fmt.Errorf("block %d has %d bytes, want %d: %w", b.index, len(b.data), want, errChanged)
	}
	copy(p, b.data[off:])
	return nil
}

// block returns block index of the file, from the handle if it holds it. The caller puts it back.
func (h *handle) block(ctx context.Context, index int64) (*blockRef, error) {
	h.mu.Lock()
	if c := h.cur; c != nil && c.index == index {
		c.refs++
		h.mu.Unlock()
		return c, nil
	}
	h.mu.Unlock()

	b, err := h.f.load(ctx, index)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	b.refs = 2 // the caller's and the handle's
	if old := h.cur; old != nil {
		h.unref(old)
	}
	h.cur = b
	return b, nil
}

// put gives back a block returned by block.
func (h *handle) put(b *blockRef) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unref(b)
}

// unref drops a reference; h.mu is held.
func (h *handle) unref(b *blockRef) {
	b.refs--
	if b.refs == 0 && b.file != nil {
		_ = b.file.Close() // opened read-only: nothing to lose
	}
}

// Release implements fs.FileReleaser.
func (h *handle) Release(context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != nil {
		h.unref(h.cur)
		h.cur = nil
	}
	return 0
}

var _ = (fs.FileReleaser)((*handle)(nil))

// load opens the block's local copy if a tier holds it, and otherwise reads it through the
// cache, which fetches it from a peer or the under-store and stores it.
func (f *fileNode) load(ctx context.Context, index int64) (*blockRef, error) {
	if f.fsys.local != nil {
		// Any failure here (not held, moved away, unreadable) leaves it to the cache, which
		// copes with all of them.
		if file, err := f.fsys.local.OpenBlock(ctx, f.path, index); err == nil {
			return &blockRef{index: index, file: file}, nil
		}
	}
	data, err := f.fsys.blocks.ReadBlock(ctx, f.path, index)
	if err != nil {
		return nil, err
	}
	return &blockRef{index: index, data: data}, nil
}
