package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/strata-cache/strata/cacheworker/fuseconn"
	"github.com/strata-cache/strata/cacheworker/objtree"
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

// Handle numbers: the server generation in the high bits, so that a process taking over never
// hands out the number of an open made before it; a bit saying whether the open is passed
// through, so that its RELEASE is counted right whichever process receives it; and a counter.
const (
	fhPassthrough    = 1 << 31
	fhCounterMask    = fhPassthrough - 1
	fhGenerationBits = 32
)

// fileSystem answers the kernel's requests for one mounted Dataset (go-fuse's raw API). It
// keeps no state the kernel refers to that a new process could not rebuild: node ids are
// positions in the node list (the same list is handed over), directory handles are unused,
// and a file handle's state is only a cache of the block it read last, made afresh when a
// handle of an earlier process turns up.
type fileSystem struct {
	fuse.RawFileSystem // ENOSYS for everything not answered here; the mount is read-only anyway

	blocks    BlockReader
	local     LocalBlocks
	blockSize int64
	m         *Metrics
	log       logr.Logger

	// treeMu guards the tree, which a refresh replaces (sync.go): the node list, in which a
	// node is never changed in place, and the totals.
	treeMu sync.RWMutex
	nodes  []*node
	files  int
	bytes  int64

	// dev registers backing files for passthrough; set once the kernel agreed to it.
	conn        *fuseconn.Conn
	passthrough bool
	opens       *opensTable
	generation  uint32
	nextFh      atomic.Uint32

	mu      sync.Mutex
	handles map[uint64]*handle
	// logged holds the (file, block) pairs whose failure was logged, so a reader retrying a
	// failing block does not flood the log.
	logged map[blockKey]bool
	// locks guard the files' openCounts, a file's being locks[id%len(locks)].
	locks [64]sync.Mutex
	// warned is set once a failed passthrough registration has been logged.
	warned atomic.Bool

	// loads tells loads from pods (nil: every reader is a pod); dataset names the mount in
	// their metrics; fresh holds the blocks loads brought in that no pod read yet.
	loads   *Loads
	dataset string
	fresh   fresh
}

type blockKey struct {
	node  uint64
	index int64
}

func newFileSystem(nodes []*node, cfg Config, m *Metrics, log logr.Logger) *fileSystem {
	fsys := &fileSystem{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		nodes:         nodes, blocks: cfg.Blocks, local: cfg.Local, blockSize: cfg.BlockSize, m: m, log: log,
		handles: map[uint64]*handle{}, logged: map[blockKey]bool{},
		loads: cfg.Loads, dataset: datasetLabel(cfg.Name), fresh: fresh{blocks: map[blockKey]int64{}},
	}
	fsys.files, fsys.bytes = totals(nodes)
	return fsys
}

// totals counts the files of a node list that are in the tree, and their bytes.
func totals(nodes []*node) (files int, bytes int64) {
	for _, n := range nodes[1:] {
		if !n.dir && !n.retired {
			files++
			bytes += n.size
		}
	}
	return files, bytes
}

func (fsys *fileSystem) String() string { return "strata" }

// node returns the node of a FUSE node id, or nil for an id this tree never gave out. The
// node does not change (see node), so it can be used without holding the tree's lock.
func (fsys *fileSystem) node(id uint64) *node {
	fsys.treeMu.RLock()
	defer fsys.treeMu.RUnlock()
	return fsys.nodeLocked(id)
}

// nodeLocked is node with treeMu held.
func (fsys *fileSystem) nodeLocked(id uint64) *node {
	if id == 0 || id >= uint64(len(fsys.nodes)) {
		return nil
	}
	return fsys.nodes[id]
}

// counts returns the tree's file count and bytes.
func (fsys *fileSystem) counts() (files int, bytes int64) {
	fsys.treeMu.RLock()
	defer fsys.treeMu.RUnlock()
	return fsys.files, fsys.bytes
}

func fillAttr(id uint64, n *node, a *fuse.Attr) {
	*a = fuse.Attr{Ino: id, Blksize: ioSize}
	if n.dir {
		a.Mode = syscall.S_IFDIR | dirMode
		a.Nlink = 2
	} else {
		a.Mode = syscall.S_IFREG | fileMode
		a.Nlink = 1
		a.Size = uint64(n.size)
		a.Blocks = uint64((n.size + 511) / 512)
	}
	mtime := time.Unix(0, n.mtime)
	a.SetTimes(&mtime, &mtime, &mtime)
}

// fillEntry answers a lookup of node id. A refresh tells the kernel what it changed, so the
// kernel may trust names and attributes for a long time (see doc.go).
func fillEntry(id uint64, n *node, out *fuse.EntryOut) {
	out.NodeId = id
	out.Generation = 1
	out.SetEntryTimeout(cacheTimeout)
	out.SetAttrTimeout(cacheTimeout)
	fillAttr(id, n, &out.Attr)
}

// Lookup implements fuse.RawFileSystem.
func (fsys *fileSystem) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	fsys.treeMu.RLock()
	defer fsys.treeMu.RUnlock()
	dir := fsys.nodeLocked(h.NodeId)
	if dir == nil || !dir.dir {
		return fuse.ENOTDIR
	}
	i, found := slices.BinarySearchFunc(dir.children, name, func(id uint64, name string) int {
		return strings.Compare(fsys.nodes[id].name, name)
	})
	if !found {
		// A negative entry with a timeout: the kernel stops asking for a name that is not there
		// (a refresh that adds it says so).
		out.NodeId = 0
		out.SetEntryTimeout(cacheTimeout)
		return fuse.OK
	}
	id := dir.children[i]
	fillEntry(id, fsys.nodes[id], out)
	return fuse.OK
}

// Forget implements fuse.RawFileSystem: nodes live as long as the mount, whatever the kernel
// holds of them.
func (fsys *fileSystem) Forget(uint64, uint64) {}

// GetAttr implements fuse.RawFileSystem.
func (fsys *fileSystem) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	n := fsys.node(in.NodeId)
	if n == nil {
		return fuse.ENOENT
	}
	out.SetTimeout(cacheTimeout)
	fillAttr(in.NodeId, n, &out.Attr)
	return fuse.OK
}

// SetAttr implements fuse.RawFileSystem. The mount is read-only ("ro"), so the kernel refuses
// changes before they get here; they fail here too so that the tree never changes, whatever
// the mount options.
func (fsys *fileSystem) SetAttr(<-chan struct{}, *fuse.SetAttrIn, *fuse.AttrOut) fuse.Status {
	return fuse.EROFS
}

// StatFs implements fuse.RawFileSystem: the Dataset's size and file count, nothing free.
func (fsys *fileSystem) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	const bsize = 4096
	files, bytes := fsys.counts()
	*out = fuse.StatfsOut{}
	out.Bsize, out.Frsize = bsize, bsize
	out.Blocks = uint64((bytes + bsize - 1) / bsize)
	out.Files = uint64(files)
	out.NameLen = objtree.MaxNameLen
	return fuse.OK
}

// OpenDir implements fuse.RawFileSystem. Listings are stateless (the offset is a position in
// the folder), so directory handles are unused, and the kernel may cache them.
func (fsys *fileSystem) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	n := fsys.node(in.NodeId)
	switch {
	case n == nil:
		return fuse.ENOENT
	case !n.dir:
		return fuse.ENOTDIR
	}
	out.OpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_CACHE_DIR
	return fuse.OK
}

// ReleaseDir implements fuse.RawFileSystem.
func (fsys *fileSystem) ReleaseDir(*fuse.ReleaseIn) {}

// ReadDir implements fuse.RawFileSystem.
func (fsys *fileSystem) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return fsys.readDir(in, out, false)
}

// ReadDirPlus implements fuse.RawFileSystem.
func (fsys *fileSystem) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return fsys.readDir(in, out, true)
}

// readDir lists a folder from position in.Offset: "." and ".." first, then the children in
// name order. With plus, each entry carries its lookup answer.
func (fsys *fileSystem) readDir(in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	fsys.treeMu.RLock()
	defer fsys.treeMu.RUnlock()
	dir := fsys.nodeLocked(in.NodeId)
	if dir == nil || !dir.dir {
		return fuse.ENOTDIR
	}
	var fill func(uint64, *fuse.EntryOut)
	if plus {
		fill = func(id uint64, out *fuse.EntryOut) { fillEntry(id, fsys.nodes[id], out) }
	}
	fuseconn.ListDir(out, in.Offset, in.NodeId, dir.parent, len(dir.children), func(i int) fuseconn.Entry {
		id := dir.children[i]
		n := fsys.nodes[id]
		return fuseconn.Entry{Name: n.name, ID: id, Dir: n.dir}
	}, fill)
	return fuse.OK
}

// Open implements fuse.RawFileSystem. Files open read-only only.
//
// FOPEN_KEEP_CACHE lets the kernel keep the file's pages in its page cache from one open to
// the next. Without it the kernel drops them at every open, because a FUSE file system may
// change under it; ours cannot while mounted (the tree is listed once and every block is
// immutable), so keeping them turns every re-read by any pod of the node into a page-cache
// hit that never reaches the worker. One-block files held locally may be passed through
// instead (see passthrough.go), but not to a load, whose reads the worker must see (loads.go).
func (fsys *fileSystem) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	n := fsys.node(in.NodeId)
	switch {
	case n == nil:
		return fuse.ENOENT
	case n.dir:
		return fuse.EISDIR
	case in.Flags&syscall.O_ACCMODE != syscall.O_RDONLY || in.Flags&(syscall.O_TRUNC|syscall.O_APPEND|syscall.O_CREAT) != 0:
		return fuse.EROFS
	}
	out.OpenFlags = fuse.FOPEN_KEEP_CACHE
	loader := fsys.loads.isLoader(in.Uid)
	passthrough := !loader && fsys.openMode(in.NodeId, n, out)
	out.Fh = fsys.newHandleNumber(passthrough)
	if passthrough {
		// Its one block is held: the pod reads it from the tier.
		fsys.podRead(blockKey{in.NodeId, 0})
		return fuse.OK
	}
	fsys.mu.Lock()
	fsys.handles[out.Fh] = &handle{node: in.NodeId, loader: loader}
	fsys.mu.Unlock()
	return fuse.OK
}

func (fsys *fileSystem) newHandleNumber(passthrough bool) uint64 {
	fh := uint64(fsys.generation)<<fhGenerationBits | uint64(fsys.nextFh.Add(1)&fhCounterMask)
	if passthrough {
		fh |= fhPassthrough
	}
	return fh
}

// Flush implements fuse.RawFileSystem with ENOSYS, which the kernel takes as "no close needs
// the server" and stops sending FLUSH for the connection's life: a close(2) then costs the
// reader no round trip to the worker (go-fuse's default answers each one, for nothing). The
// mount is read-only: a close has nothing to write, and what an open holds goes with RELEASE.
func (fsys *fileSystem) Flush(<-chan struct{}, *fuse.FlushIn) fuse.Status { return fuse.ENOSYS }

// Release implements fuse.RawFileSystem.
func (fsys *fileSystem) Release(_ <-chan struct{}, in *fuse.ReleaseIn) {
	fsys.mu.Lock()
	h := fsys.handles[in.Fh]
	delete(fsys.handles, in.Fh)
	fsys.mu.Unlock()
	if h != nil {
		h.release()
	}
	if n := fsys.node(in.NodeId); n != nil {
		fsys.released(in.NodeId, n, in.Fh&fhPassthrough != 0)
	}
}

// Read implements fuse.RawFileSystem: the range [off, off+len(dest)) is cut into blocks of
// the cache's block size, each read through the cache (or from the local tier directly), and
// the needed slice of each copied. Reads that reach past the end return what there is.
func (fsys *fileSystem) Read(cancel <-chan struct{}, in *fuse.ReadIn, dest []byte) (fuse.ReadResult, fuse.Status) {
	n := fsys.node(in.NodeId)
	if n == nil || n.dir {
		return nil, fuse.EBADF
	}
	fsys.m.reads.Inc()
	off := int64(in.Offset)
	if off >= n.size || len(dest) == 0 {
		return fuse.ReadResultData(nil), fuse.OK
	}
	h := fsys.handle(in.Fh, in.NodeId)
	ctx, stop := fuseconn.RequestContext(cancel)
	defer stop()
	end := min(off+int64(len(dest)), n.size)
	bs := fsys.blockSize
	done := 0
	for pos := off; pos < end; {
		index := pos / bs
		start := index * bs
		// want is the length this block must have for the read: all of it unless it is the last.
		want := min(bs, n.size-start)
		b, err := h.block(ctx, fsys, n, index)
		if err != nil {
			return nil, fsys.fail(ctx, in.NodeId, index, err)
		}
		k := int(min(end, start+want) - pos)
		err = b.readAt(dest[done:done+k], pos-start, want)
		h.put(b)
		if err != nil {
			return nil, fsys.fail(ctx, in.NodeId, index, err)
		}
		done += k
		pos += int64(k)
	}
	fsys.m.readBytes.Add(float64(done))
	return fuse.ReadResultData(dest[:done]), fuse.OK
}

// ReadRanges implements fuseconn.RangeReader: a read of blocks that local tiers hold is
// answered from the blocks' files, spliced by the connection. A read that needs a block no
// local tier holds (being fetched, or fetched already into memory) is left to Read.
func (fsys *fileSystem) ReadRanges(in *fuse.ReadIn) ([]fuseconn.FileRange, func(bool), bool) {
	n := fsys.node(in.NodeId)
	if n == nil || n.dir || fsys.local == nil {
		return nil, nil, false
	}
	off := int64(in.Offset)
	end := min(off+int64(in.Size), n.size)
	if off >= end {
		return nil, nil, false
	}
	h := fsys.handle(in.Fh, in.NodeId)
	var held []*blockRef
	release := func() {
		for _, b := range held {
			h.put(b)
		}
	}
	ranges, ok := fuseconn.BlockRanges(off, end, fsys.blockSize, func(index int64) (*os.File, bool) {
		b, err := h.blockFrom(context.Background(), fsys, n, index, true)
		if err != nil {
			return nil, false
		}
		held = append(held, b)
		return b.file, b.file != nil
	})
	if !ok {
		release()
		return nil, nil, false
	}
	done := func(sent bool) {
		release()
		if sent {
			fsys.m.reads.Inc()
			fsys.m.splicedReads.Inc()
			fsys.m.readBytes.Add(float64(end - off))
		}
	}
	return ranges, done, true
}

// handle returns the state of open fh, making it if the open was made by an earlier process
// (or was passed through, and is read by the worker after all, as when the kernel reads it
// for an mmap made before passthrough began).
func (fsys *fileSystem) handle(fh, id uint64) *handle {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	h := fsys.handles[fh]
	if h == nil || h.node != id {
		h = &handle{node: id}
		fsys.handles[fh] = h
	}
	return h
}

// errNotLocal: the block is in no local tier (ReadRange then leaves the read to Read).
var errNotLocal = errors.New("the block is not in a local tier")

// errChanged means a block is shorter than the listing said: the object changed in the
// under-store after the Dataset was mounted. (A store that names versions says so first, with
// understore.ErrChanged.)
var errChanged = errors.New("the object is shorter than when the Dataset was mounted: it changed in the under-store")

// fail maps a read failure to an errno, logs it once per block, and counts it.
func (fsys *fileSystem) fail(ctx context.Context, id uint64, index int64, err error) fuse.Status {
	fsys.m.readErrors.Inc()
	errno := syscall.EIO
	switch {
	case ctx.Err() != nil:
		// The reader was interrupted; that is the reader's doing, not worth a log line.
		return fuse.Status(syscall.EINTR)
	case errors.Is(err, understore.ErrNotFound):
		errno = syscall.ENOENT
	}
	key := blockKey{id, index}
	fsys.mu.Lock()
	first := !fsys.logged[key]
	fsys.logged[key] = true
	fsys.mu.Unlock()
	if first {
		n := fsys.node(id)
		if errors.Is(err, understore.ErrChanged) {
			// Its blocks of the version listed are not all cached, and the store has another:
			// the reader gets EIO rather than bytes of two versions.
			fsys.log.Error(err, "read failed: the object changed in the under-store since the Dataset was listed",
				"file", n.path, "listedVersion", n.etag, "block", index, "errno", errno.Error())
		} else {
			fsys.log.Error(err, "read failed", "file", n.path, "block", index, "errno", errno.Error())
		}
	}
	return fuse.Status(errno)
}

// handle is an open file. It keeps the block it read last, so that a sequential reader, whose
// FUSE reads are far smaller than a block, opens or fetches each block once rather than once
// per request: the local copy as an open file (pread, no copy of the whole block), or the
// bytes the cache just fetched.
type handle struct {
	node uint64
	// loader: the file was opened by a load (loads.go); counted, the blocks it counted (the
	// kernel may ask for one block in several requests at once); fetching, the blocks it is
	// fetching now.
	loader   bool
	mu       sync.Mutex
	cur      *blockRef
	counted  map[int64]bool
	fetching map[int64]int
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

// block returns block index of file n, from the handle if it holds it. The caller puts it back.
// A handle that moves on to the next block (or starts at the first) reads sequentially: the
// block after is prefetched, so that its fetch from the under-store overlaps the reads of this
// one. A load does not read ahead: its fetches would not wait for the pods' (and a block
// fetched ahead would not be counted as the load's).
func (h *handle) block(ctx context.Context, fsys *fileSystem, n *node, index int64) (*blockRef, error) {
	return h.blockFrom(ctx, fsys, n, index, false)
}

// blockFrom is block; localOnly fails with errNotLocal rather than fetch a block no local
// tier holds.
func (h *handle) blockFrom(ctx context.Context, fsys *fileSystem, n *node, index int64, localOnly bool) (*blockRef, error) {
	h.mu.Lock()
	c := h.cur
	if c != nil && c.index == index {
		c.refs++
		h.mu.Unlock()
		return c, nil
	}
	h.mu.Unlock()
	if p, ok := fsys.blocks.(Prefetcher); ok && !h.loader && (c == nil && index == 0 || c != nil && c.index == index-1) {
		p.Prefetch(n.path, n.etag, n.size, index+1)
	}

	b, err := fsys.load(ctx, h, n, index, localOnly)
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

// release drops the handle's block when the file is closed.
func (h *handle) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != nil {
		h.unref(h.cur)
		h.cur = nil
	}
}

// load opens block index of the file of handle h (node n) from its local copy if a tier holds
// it, and otherwise reads it through the cache, which fetches it from a peer or the under-store
// and stores it. A load's fetch waits until no pod waits for one, and is counted (loads.go).
func (fsys *fileSystem) load(ctx context.Context, h *handle, n *node, index int64, localOnly bool) (*blockRef, error) {
	key := blockKey{h.node, index}
	if fsys.local != nil {
		// Any failure here (not held, moved away, unreadable) leaves it to the cache, which
		// copes with all of them.
		if file, err := fsys.local.OpenBlock(ctx, n.path, n.etag, index); err == nil {
			if h.loader {
				fsys.loadHeld(h, n, index)
			} else {
				fsys.podRead(key)
			}
			return &blockRef{index: index, file: file}, nil
		}
	}
	if localOnly {
		return nil, errNotLocal
	}
	if h.loader {
		if err := fsys.loads.waitForPods(ctx); err != nil {
			return nil, err
		}
		defer h.fetch(index)()
	} else {
		defer fsys.loads.podFetch()()
	}
	data, err := fsys.blocks.ReadBlock(ctx, n.path, n.etag, n.size, index)
	if err != nil {
		return nil, err
	}
	if h.loader {
		fsys.loadFetched(h, n, index)
	}
	return &blockRef{index: index, data: data}, nil
}
