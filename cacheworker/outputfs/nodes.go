package outputfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// attrs are what a node shows besides its size. They live in this mount only: the master
// records files, not owners or modes, so other nodes show sealed files as root's, read-only.
type attrs struct {
	mode     uint32 // permission bits
	uid, gid uint32
	mtime    time.Time
}

func (a *attrs) fill(out *fuse.Attr, kind uint32) {
	out.Mode = kind | a.mode
	out.Owner = fuse.Owner{Uid: a.uid, Gid: a.gid}
	out.SetTimes(&a.mtime, &a.mtime, &a.mtime)
	out.Blksize = 1 << 20
}

// set applies a SETATTR's mode, owner and times.
func (a *attrs) set(in *fuse.SetAttrIn) {
	if m, ok := in.GetMode(); ok {
		a.mode = m & 0o7777
	}
	if uid, ok := in.GetUID(); ok {
		a.uid = uid
	}
	if gid, ok := in.GetGID(); ok {
		a.gid = gid
	}
	if t, ok := in.GetMTime(); ok {
		a.mtime = t
	}
}

// callerAttrs are the attributes of a node the caller of ctx creates.
func callerAttrs(ctx context.Context, mode uint32) attrs {
	a := attrs{mode: mode & 0o7777, mtime: time.Now()}
	if c, ok := fuse.FromContext(ctx); ok {
		a.uid, a.gid = c.Uid, c.Gid
	}
	return a
}

// dirNode is a folder. Folders exist only in the mounts that made them and as the parents of
// sealed files at the master.
type dirNode struct {
	fs.Inode
	o *output

	mu    sync.Mutex
	attrs attrs
}

var (
	_ fs.NodeGetattrer = (*dirNode)(nil)
	_ fs.NodeSetattrer = (*dirNode)(nil)
	_ fs.NodeCreater   = (*dirNode)(nil)
	_ fs.NodeMkdirer   = (*dirNode)(nil)
	_ fs.NodeUnlinker  = (*dirNode)(nil)
	_ fs.NodeRmdirer   = (*dirNode)(nil)
	_ fs.NodeRenamer   = (*dirNode)(nil)
	_ fs.NodeStatfser  = (*dirNode)(nil)
)

func (d *dirNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attrs.fill(&out.Attr, syscall.S_IFDIR)
	out.Nlink = 2
	return 0
}

func (d *dirNode) Setattr(_ context.Context, _ fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attrs.set(in)
	d.attrs.fill(&out.Attr, syscall.S_IFDIR)
	return 0
}

// reserved says whether name may not be made in d: the sealing folder of the root.
func (d *dirNode) reserved(name string) bool {
	return name == SealingDir && d.IsRoot()
}

// Create makes a file to write, staged until it is sealed.
func (d *dirNode) Create(ctx context.Context, name string, _, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if d.reserved(name) {
		return nil, nil, 0, syscall.EPERM
	}
	if errno := d.o.writable(ctx); errno != 0 {
		return nil, nil, 0, errno
	}
	if existing := d.GetChild(name); existing != nil {
		if !staleSealed(ctx, existing) {
			return nil, nil, 0, syscall.EEXIST
		}
		d.RmChild(name) // forgotten at the master (lost, and being recomputed): write it again
	}
	token, staged, err := d.o.newStaged()
	if err != nil {
		d.o.log.Error(err, "creating a staging file", "name", name)
		return nil, nil, 0, errnoOf(err)
	}
	n := &fileNode{o: d.o, attrs: callerAttrs(ctx, mode), token: token, staged: staged, writers: 1}
	child := d.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG})
	n.attrs.fill(&out.Attr, syscall.S_IFREG)
	return child, &handle{writable: true}, 0, 0
}

func (d *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if d.reserved(name) {
		return nil, syscall.EPERM
	}
	if errno := d.o.writable(ctx); errno != 0 {
		return nil, errno
	}
	if d.GetChild(name) != nil {
		return nil, syscall.EEXIST
	}
	child := &dirNode{o: d.o, attrs: callerAttrs(ctx, mode)}
	child.attrs.fill(&out.Attr, syscall.S_IFDIR)
	return d.NewPersistentInode(ctx, child, fs.StableAttr{Mode: syscall.S_IFDIR}), 0
}

// Unlink removes a file: a sealed one from the Dataset (the master and the local tier), an
// unsealed one once its writers close it.
func (d *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	child := d.GetChild(name)
	if child == nil {
		return syscall.ENOENT
	}
	n, ok := child.Operations().(*fileNode)
	if !ok {
		return syscall.EISDIR
	}
	if errno := d.o.writable(ctx); errno != 0 {
		return errno
	}
	return n.remove(ctx, child.Path(nil))
}

func (d *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	child := d.GetChild(name)
	if child == nil {
		return syscall.ENOENT
	}
	if !child.IsDir() {
		return syscall.ENOTDIR
	}
	if len(child.Children()) > 0 {
		return syscall.ENOTEMPTY
	}
	return d.o.writable(ctx)
}

// Rename moves unsealed files and folders that hold none; a sealed file's blocks are reported
// under its path, so moving it is EXDEV, which makes mv(1) copy it instead.
func (d *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if flags&fs.RENAME_EXCHANGE != 0 {
		return syscall.EINVAL
	}
	to, ok := newParent.(*dirNode)
	if !ok {
		return syscall.ENOTDIR
	}
	if to.reserved(newName) {
		return syscall.EPERM
	}
	child := d.GetChild(name)
	if child == nil {
		return syscall.ENOENT
	}
	if errno := d.o.writable(ctx); errno != 0 {
		return errno
	}
	if holdsSealed(child) {
		return syscall.EXDEV
	}
	target := to.GetChild(newName)
	if target == nil || target == child {
		return 0
	}
	if flags&unix.RENAME_NOREPLACE != 0 {
		return syscall.EEXIST
	}
	switch {
	case child.IsDir() && !target.IsDir():
		return syscall.ENOTDIR
	case !child.IsDir() && target.IsDir():
		return syscall.EISDIR
	case target.IsDir():
		if len(target.Children()) > 0 {
			return syscall.ENOTEMPTY
		}
		return 0
	}
	// The file in the way goes, as with unlink.
	return target.Operations().(*fileNode).remove(ctx, target.Path(nil))
}

// staleSealed says whether n is a sealed file that the master forgot.
func staleSealed(ctx context.Context, n *fs.Inode) bool {
	f, ok := n.Operations().(*fileNode)
	if !ok {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sealed {
		return false
	}
	gone, _ := f.check(ctx)
	return gone
}

// holdsSealed says whether n is a sealed file or a folder with one somewhere below.
func holdsSealed(n *fs.Inode) bool {
	if f, ok := n.Operations().(*fileNode); ok {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.sealed
	}
	for _, c := range n.Children() {
		if holdsSealed(c) {
			return true
		}
	}
	return false
}

// Statfs reports the staging file system: what may still be written on this node.
func (d *dirNode) Statfs(_ context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.o.cfg.StagingDir, &st); err != nil {
		return errnoOf(err)
	}
	out.FromStatfsT(&st)
	return 0
}

// fileNode is a file: staged while it is written, then sealed into blocks.
type fileNode struct {
	fs.Inode
	o *output

	mu    sync.Mutex
	attrs attrs
	token string
	size  int64
	// staged holds the bytes until the file is sealed; nil once sealed.
	staged *os.File
	// writers counts the handles open for writing.
	writers int
	sealed  bool
	// sealFailed: the last writer's close tried to seal the file and was told why it could
	// not; nothing was written since, so its RELEASE does not try again.
	sealFailed bool
	// unlinked: removed while open for writing; discarded when the last writer closes.
	unlinked bool
}

var (
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeWriter    = (*fileNode)(nil)
	_ fs.NodeFlusher   = (*fileNode)(nil)
	_ fs.NodeReleaser  = (*fileNode)(nil)
	_ fs.NodeFsyncer   = (*fileNode)(nil)
)

// handle is an open file.
type handle struct {
	writable bool
	mu       sync.Mutex
	cur      *heldBlock // the block a reader of a sealed file used last
}

func (n *fileNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fill(&out.Attr)
	return 0
}

func (n *fileNode) fill(out *fuse.Attr) {
	n.attrs.fill(out, syscall.S_IFREG)
	out.Nlink = 1
	out.Size = uint64(n.size)
	out.Blocks = uint64((n.size + 511) / 512)
}

func (n *fileNode) Setattr(_ context.Context, _ fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	if size, ok := in.GetSize(); ok && int64(size) != n.size {
		if n.sealed {
			return syscall.EPERM
		}
		if err := n.staged.Truncate(int64(size)); err != nil {
			return errnoOf(err)
		}
		n.size = int64(size)
		n.attrs.mtime = time.Now()
	}
	n.attrs.set(in)
	n.fill(&out.Attr)
	return 0
}

// Open opens a sealed file read-only, and an unsealed one any way.
func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	writable := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sealed {
		gone, changed := n.check(ctx)
		switch {
		case gone && (writable || flags&syscall.O_TRUNC != 0):
			// Lost and forgotten, so that its Lineage writes it again: as a new file.
			if errno := n.restage(); errno != 0 {
				return nil, 0, errno
			}
		case writable || flags&syscall.O_TRUNC != 0:
			return nil, 0, syscall.EPERM
		case gone:
			return nil, 0, syscall.ENOENT // lost, and being recomputed: the reader tries again
		case changed:
			return &handle{}, 0, 0 // sealed again elsewhere: the kernel drops the pages it has
		default:
			// A sealed version never changes: its pages may stay in the page cache across opens.
			return &handle{}, fuse.FOPEN_KEEP_CACHE, 0
		}
	}
	if flags&syscall.O_TRUNC != 0 && writable {
		if err := n.staged.Truncate(0); err != nil {
			return nil, 0, errnoOf(err)
		}
		n.size = 0
	}
	if writable {
		n.writers++
	}
	return &handle{writable: writable}, 0, 0
}

func (n *fileNode) Write(_ context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	h, _ := fh.(*handle)
	if h == nil || !h.writable {
		return 0, syscall.EBADF
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sealed {
		return 0, syscall.EPERM
	}
	n.sealFailed = false
	w, err := n.staged.WriteAt(data, off)
	if end := off + int64(w); end > n.size {
		n.size = end
	}
	n.o.cfg.Metrics.writtenBytes.Add(float64(w))
	if err != nil {
		return uint32(w), errnoOf(err)
	}
	n.attrs.mtime = time.Now()
	return uint32(w), 0
}

func (n *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n.mu.Lock()
	if !n.sealed {
		defer n.mu.Unlock()
		k, err := n.staged.ReadAt(dest, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, errnoOf(err)
		}
		return fuse.ReadResultData(dest[:k]), 0
	}
	token, size := n.token, n.size
	n.mu.Unlock()
	h, _ := fh.(*handle)
	if h == nil {
		h = &handle{}
		defer h.release()
	}
	k, err := h.readSealed(ctx, n.o, token, size, dest, off)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, syscall.EINTR // the reader was interrupted; not worth a log line
	case err != nil:
		n.o.log.Error(err, "reading an output file", "file", n.Path(nil))
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:k]), 0
}

// Flush seals the file when its last writer closes it, so that close(2) returns once the file
// is part of the Dataset, or says why it is not.
func (n *fileNode) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	h, _ := fh.(*handle)
	if h == nil || !h.writable {
		return 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sealed || n.unlinked || n.writers > 1 {
		return 0
	}
	errno := n.seal(ctx)
	n.sealFailed = errno != 0
	return errno
}

// Release ends a handle; the last writer's seals the file if no flush tried to (a writer that
// was told at close why its file could not be sealed fixes that and writes it again).
func (n *fileNode) Release(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	h, _ := fh.(*handle)
	if h == nil {
		return 0
	}
	h.release()
	if !h.writable {
		return 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.writers--
	switch {
	case n.writers > 0 || n.sealed || n.sealFailed:
	case n.unlinked:
		n.discard()
	default:
		if errno := n.seal(ctx); errno != 0 {
			n.o.log.Info("an output file stays unsealed, its bytes staged on this node, until it is written and closed again",
				"file", n.Path(nil), "errno", errno.Error())
		}
	}
	return 0
}

// Fsync has nothing to do: written bytes are in the staging file, and a file is durable once
// sealed (lineage and checkpoints keep it), not before.
func (n *fileNode) Fsync(context.Context, fs.FileHandle, uint32) syscall.Errno { return 0 }

// remove deletes the file whose path in the Dataset is rel.
func (n *fileNode) remove(ctx context.Context, rel string) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.sealed {
		if n.writers > 0 {
			n.unlinked = true
		} else {
			n.discard()
		}
		return 0
	}
	return n.o.deleteSealed(ctx, rel, n.token, n.size)
}

// restage makes a sealed file that the master forgot a new, empty file to write; n.mu is held.
func (n *fileNode) restage() syscall.Errno {
	token, staged, err := n.o.newStaged()
	if err != nil {
		n.o.log.Error(err, "creating a staging file", "file", n.Path(nil))
		return errnoOf(err)
	}
	n.token, n.staged, n.size, n.sealed = token, staged, 0, false
	n.attrs.mode |= 0o200
	n.attrs.mtime = time.Now()
	return 0
}

// discard drops the staged bytes of a file nobody will seal; n.mu is held.
func (n *fileNode) discard() {
	if n.staged == nil {
		return
	}
	p := n.staged.Name()
	_ = n.staged.Close()
	n.staged = nil
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		n.o.log.Error(err, "removing a staging file", "path", p)
	}
}

// newStaged makes a new file version: its token, 128 random bits in hex, and its staging file.
func (o *output) newStaged() (string, *os.File, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("making a file token: %w", err)
	}
	token := hex.EncodeToString(b)
	staged, err := os.OpenFile(filepath.Join(o.cfg.StagingDir, token), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", nil, err
	}
	return token, staged, nil
}

// errnoOf is the errno of a failed system call, EIO for anything else.
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}
