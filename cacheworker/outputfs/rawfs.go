package outputfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/callerpod"
	"github.com/strata-cache/strata/cacheworker/fuseconn"
	"github.com/strata-cache/strata/master/masterpb"
)

const (
	// cacheTimeout is how long the kernel may trust names and attributes. Only this process
	// changes what its mount shows, but files other nodes seal, or a recomputation seals again,
	// show within this time.
	cacheTimeout = time.Minute
	// rootMode lets pods running as any user create files, as an emptyDir does.
	rootMode = 0o777
	// sealedMode is a sealed file's, and that of a folder of sealed files made elsewhere.
	sealedMode, sealedDirMode = 0o444, 0o755
)

// Handle numbers: the number of the process that made it in the high bits, so that a process
// taking over never hands out the number of an open made before it; a bit saying whether the
// open may write, so that its WRITE and RELEASE are told right whichever process receives them;
// and a counter.
const (
	fhWritable       = 1 << 31
	fhCounterMask    = fhWritable - 1
	fhGenerationBits = 32
)

// fileSystem answers the kernel's requests for one output mount (go-fuse's raw API). What the
// kernel refers to (node ids, the files' state) is in the tree, whose journal a process taking
// over replays; handles only cache the block a reader used last, made afresh when a handle of
// an earlier process turns up.
type fileSystem struct {
	fuse.RawFileSystem // ENOSYS for the rest: links, special files, locks, extended attributes

	o          *output
	t          *tree
	generation uint32
	nextFh     atomic.Uint32

	mu      sync.Mutex
	handles map[uint64]*handle
	// listings are the entries of each open folder, listed at OPENDIR, so that offsets stay
	// stable while the folder changes.
	listings map[uint64][]fuseconn.Entry
}

// handle is an open file.
type handle struct {
	mu      sync.Mutex
	cur     *heldBlock    // the block a reader of a sealed file used last
	spliced *splicedBlock // the block spliced reads used last (splice.go)
}

func newFileSystem(o *output) *fileSystem {
	return &fileSystem{RawFileSystem: fuse.NewDefaultRawFileSystem(), o: o, handles: map[uint64]*handle{}, listings: map[uint64][]fuseconn.Entry{}}
}

func (fsys *fileSystem) String() string { return "strata-output" }

// carriedOut says whether h is a request that an earlier process received and recorded
// before it was killed, and the kernel sent again: its change is made, only the answer is
// missing. It returns the node the request made or changed.
func (fsys *fileSystem) carriedOut(h *fuse.InHeader) (*node, bool) {
	if h.Unique&fuseconn.ResendFlag == 0 || fsys.t.done == nil {
		return nil, false
	}
	id, ok := fsys.t.done[requestID(h)]
	if !ok {
		return nil, false
	}
	fsys.t.j.track(requestID(h), id)
	return fsys.t.get(id), true
}

// answered notes that h, which may have recorded a change, is being answered: compaction no
// longer keeps its record (see journal.go).
func (fsys *fileSystem) answered(h *fuse.InHeader) { fsys.t.j.answered(requestID(h)) }

// requestID is the id of a request as the journal records it: without the resend flag.
func requestID(h *fuse.InHeader) uint64 { return h.Unique &^ fuseconn.ResendFlag }

// folder returns the folder of id, or an errno.
func (fsys *fileSystem) folder(id uint64) (*node, fuse.Status) {
	n := fsys.t.get(id)
	switch {
	case n == nil:
		return nil, fuse.ENOENT
	case !n.dir:
		return nil, fuse.ENOTDIR
	}
	return n, fuse.OK
}

// mayMake says whether name may be made in dir now: it is not the reserved name, and the
// Dataset takes changes (EROFS once complete).
func (fsys *fileSystem) mayMake(ctx context.Context, dir *node, name string) fuse.Status {
	if reserved(dir, name) {
		return fuse.EPERM
	}
	return fuse.Status(fsys.o.writable(ctx))
}

// reserved says whether name may not be made in dir: the sealing folder of the root.
func reserved(dir *node, name string) bool { return dir.id == rootID && name == SealingDir }

// fillEntry answers a lookup of n.
func fillEntry(n *node, out *fuse.EntryOut) {
	out.NodeId = n.id
	out.Generation = 1
	out.SetEntryTimeout(cacheTimeout)
	out.SetAttrTimeout(cacheTimeout)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fillAttr(&out.Attr)
}

// callerState is the state of a node that the caller of h makes.
func callerState(h *fuse.InHeader, mode uint32) nodeState {
	return nodeState{Mode: mode & 0o7777, UID: h.Uid, GID: h.Gid, MtimeNs: time.Now().UnixNano()}
}

// Lookup implements fuse.RawFileSystem: a node of this mount, or a file or folder that another
// node sealed since, which is added.
func (fsys *fileSystem) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	dir, st := fsys.folder(h.NodeId)
	if !st.Ok() {
		return st
	}
	child := fsys.t.child(dir, name)
	if child == nil && !reserved(dir, name) {
		ctx, stop := fuseconn.RequestContext(cancel)
		defer stop()
		child = fsys.o.fetch(ctx, fsys.t, dir, name)
	}
	if child == nil {
		return fuse.ENOENT
	}
	fillEntry(child, out)
	return fuse.OK
}

// Forget implements fuse.RawFileSystem: nodes live as long as the mount (see node).
func (fsys *fileSystem) Forget(uint64, uint64) {}

// GetAttr implements fuse.RawFileSystem.
func (fsys *fileSystem) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	n := fsys.t.get(in.NodeId)
	if n == nil {
		return fuse.ENOENT
	}
	out.SetTimeout(cacheTimeout)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fillAttr(&out.Attr)
	return fuse.OK
}

// SetAttr implements fuse.RawFileSystem: modes, owners and times of anything, and the size of
// a file being written (a sealed one never changes).
func (fsys *fileSystem) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	n := fsys.t.get(in.NodeId)
	if n == nil {
		return fuse.ENOENT
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st := &n.state
	// A truncation to nothing also clears a lost write of a file still empty (its first write
	// failed): the writer starts it anew, as an O_TRUNC open does.
	if size, ok := in.GetSize(); ok && !n.dir && (int64(size) != n.size || size == 0 && st.WriteLost) {
		if st.Sealed || n.staged == nil {
			return fuse.EPERM
		}
		if err := n.staged.Truncate(int64(size)); err != nil {
			return fsys.failed(err, "truncating a file", n.name)
		}
		n.size = int64(size)
		st.WriteLost = st.WriteLost && size != 0
		st.MtimeNs = time.Now().UnixNano()
	}
	if m, ok := in.GetMode(); ok {
		st.Mode = m & 0o7777
	}
	if uid, ok := in.GetUID(); ok {
		st.UID = uid
	}
	if gid, ok := in.GetGID(); ok {
		st.GID = gid
	}
	if t, ok := in.GetMTime(); ok {
		st.MtimeNs = t.UnixNano()
	}
	if err := fsys.t.save(n, 0); err != nil {
		fsys.o.log.Error(err, "recording a change of attributes")
		return fuse.EIO
	}
	out.SetTimeout(cacheTimeout)
	n.fillAttr(&out.Attr)
	return fuse.OK
}

// Mkdir implements fuse.RawFileSystem. Folders exist only in the mounts that made them and as
// the parents of sealed files at the master.
func (fsys *fileSystem) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	defer fsys.answered(&in.InHeader)
	dir, st := fsys.folder(in.NodeId)
	if !st.Ok() {
		return st
	}
	if n, done := fsys.carriedOut(&in.InHeader); done && n != nil {
		fillEntry(n, out)
		return fuse.OK
	}
	ctx, stop := fuseconn.RequestContext(cancel)
	defer stop()
	if st := fsys.mayMake(ctx, dir, name); !st.Ok() {
		return st
	}
	n, made, err := fsys.t.add(dir, name, true, callerState(&in.InHeader, in.Mode), nil, requestID(&in.InHeader))
	switch {
	case err != nil:
		return fsys.failed(err, "making a folder", name)
	case !made:
		return fuse.Status(syscall.EEXIST)
	}
	fillEntry(n, out)
	return fuse.OK
}

// Create implements fuse.RawFileSystem: a file to write, staged until it is sealed.
func (fsys *fileSystem) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	defer fsys.answered(&in.InHeader)
	dir, st := fsys.folder(in.NodeId)
	if !st.Ok() {
		return st
	}
	if n, done := fsys.carriedOut(&in.InHeader); done && n != nil {
		fillEntry(n, &out.EntryOut)
		out.Fh = fsys.newHandle(true)
		return fuse.OK
	}
	ctx, stop := fuseconn.RequestContext(cancel)
	defer stop()
	if st := fsys.mayMake(ctx, dir, name); !st.Ok() {
		return st
	}
	caller, _ := fsys.caller(&in.InHeader)
	if existing := fsys.t.child(dir, name); existing != nil {
		// Written again as a new file when lost and forgotten at the master (being recomputed),
		// or when it is another attempt's, not settled (a killed pod's, which its retry writes).
		existing.mu.Lock()
		replace := fsys.forgotten(ctx, existing) || fsys.supersededBy(ctx, existing, caller)
		var err error
		if replace {
			err = fsys.detachForgotten(existing)
		}
		existing.mu.Unlock()
		if !replace {
			return fuse.Status(syscall.EEXIST)
		}
		if err != nil {
			return fsys.failed(err, "replacing a file", name)
		}
	}
	token, staged, err := fsys.o.newStaged()
	if err != nil {
		return fsys.failed(err, "creating a staging file", name)
	}
	state := callerState(&in.InHeader, in.Mode)
	state.Token, state.Writers = token, 1
	state.Attempt, state.Writer = caller.PodUID, caller.Container
	n, made, err := fsys.t.add(dir, name, false, state, staged, requestID(&in.InHeader))
	if err != nil || !made {
		fsys.o.dropStaged(staged)
		if err != nil {
			return fsys.failed(err, "creating a file", name)
		}
		return fuse.Status(syscall.EEXIST)
	}
	fillEntry(n, &out.EntryOut)
	out.Fh = fsys.newHandle(true)
	return fuse.OK
}

// forgotten says whether n is a sealed file that the master forgot; n.mu is held.
func (fsys *fileSystem) forgotten(ctx context.Context, n *node) bool {
	if n.dir || !n.sealed.Load() {
		return false
	}
	gone, _ := fsys.check(ctx, n)
	return gone
}

// caller is the pod and container of the process that made request h, when Config.Callers
// knows it.
func (fsys *fileSystem) caller(h *fuse.InHeader) (callerpod.Caller, bool) {
	if fsys.o.cfg.Callers == nil {
		return callerpod.Caller{}, false
	}
	return fsys.o.cfg.Callers(h.Pid)
}

// supersededBy says whether caller, writing n again, replaces it: n is a sealed file of
// another pod's or container's attempt, which the master still holds unsettled. A Job's retry
// of a killed pod writes the killed one's paths again; the killed one's files are discarded
// when the operator settles its attempt. n.mu is held.
func (fsys *fileSystem) supersededBy(ctx context.Context, n *node, caller callerpod.Caller) bool {
	st := &n.state
	if n.dir || !st.Sealed || st.Attempt == "" || caller.PodUID == "" ||
		(caller.PodUID == st.Attempt && caller.Container == st.Writer) {
		return false
	}
	mctx, cancel := fsys.o.masterContext(ctx)
	defer cancel()
	f, err := fsys.o.cfg.Master.GetFile(mctx, &masterpb.GetFileRequest{Path: fsys.o.masterPath(fsys.t.rel(n))})
	if err != nil {
		return false // published, or the master cannot say: the file stays as it is
	}
	return f.GetAttempt() != "" && f.GetClientToken() == st.Token
}

// Open implements fuse.RawFileSystem: a sealed file opens read-only, an unsealed one any way.
func (fsys *fileSystem) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	n := fsys.t.get(in.NodeId)
	switch {
	case n == nil:
		return fuse.ENOENT
	case n.dir:
		return fuse.EISDIR
	}
	writable := in.Flags&syscall.O_ACCMODE != syscall.O_RDONLY
	truncate := writable && in.Flags&syscall.O_TRUNC != 0
	if writable { // only an open for writing records a change; reads do not touch the journal
		defer fsys.answered(&in.InHeader)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, done := fsys.carriedOut(&in.InHeader); done {
		out.Fh = fsys.newHandle(writable)
		return fuse.OK
	}
	st := &n.state
	if st.Sealed {
		ctx, stop := fuseconn.RequestContext(cancel)
		defer stop()
		// A complete Dataset's files change only once the operator opens it again (to recompute
		// part of it), which the master says within completeRecheck: a reader's open of a version
		// the Dataset published needs no check, and a walk of it costs no round trip per file.
		var gone, changed bool
		if writable || st.Attempt != "" || !fsys.o.isComplete(ctx, false) {
			gone, changed = fsys.check(ctx, n)
		}
		superseded := false
		if writable && !gone {
			caller, _ := fsys.caller(&in.InHeader)
			superseded = fsys.supersededBy(ctx, n, caller)
		}
		switch {
		case superseded:
			// Another attempt's file, not settled: this attempt writes it anew, as below.
			if err := fsys.detachForgotten(n); err != nil {
				return fsys.failed(err, "replacing another attempt's file", n.name)
			}
			return fuse.Status(syscall.ESTALE)
		case gone && writable:
			// Lost and forgotten, so that its Lineage writes it again: as a new file, never
			// through this node, whose pages a reader that waits for the new version may hold
			// locked (its read is pending) until the write is sealed. The node leaves the tree,
			// and the kernel, told the open is stale, looks the name up again (finding nothing)
			// and creates the file anew.
			if err := fsys.detachForgotten(n); err != nil {
				return fsys.failed(err, "replacing a forgotten file", n.name)
			}
			return fuse.Status(syscall.ESTALE)
		case writable:
			return fuse.EPERM
		case gone && st.Attempt != "":
			// An attempt's file that the master no longer holds: its attempt was discarded (its
			// pod failed), or another attempt's version took its place. Nothing writes it again.
			if err := fsys.detachForgotten(n); err != nil {
				return fsys.failed(err, "removing a discarded attempt's file", n.name)
			}
			return fuse.ENOENT
		case gone:
			// Lost, and forgotten for a recomputation: wait for the new version, if something
			// writes it (n.mu is let go meanwhile, as the recomputation may seal it here).
			lost := sealedVersion{token: st.Token, size: n.size}
			n.mu.Unlock()
			_, err := fsys.awaitRecovery(ctx, n, lost, false, errors.New("the master forgot it"))
			n.mu.Lock()
			switch {
			case errors.Is(err, errNoRecovery):
				return fuse.ENOENT // nothing writes it again
			case err != nil && ctx.Err() != nil:
				return fuse.EINTR
			case err != nil:
				fsys.o.log.Error(err, "opening a lost output file", "file", fsys.t.rel(n))
				return fuse.EIO
			}
			out.Fh = fsys.newHandle(false) // a new version: the kernel drops the pages it has
			return fuse.OK
		case changed:
			out.Fh = fsys.newHandle(false) // sealed again elsewhere: the kernel drops the pages it has
			return fuse.OK
		default:
			// A sealed version never changes: its pages may stay in the page cache across opens.
			out.OpenFlags = fuse.FOPEN_KEEP_CACHE
			out.Fh = fsys.newHandle(false)
			return fuse.OK
		}
	}
	if truncate && n.size != 0 {
		if err := n.staged.Truncate(0); err != nil {
			return fsys.failed(err, "truncating a file", n.name)
		}
		n.size = 0
	}
	if truncate {
		st.WriteLost = false // saved with the writer below
	}
	if writable {
		st.Writers++
		if err := fsys.t.save(n, requestID(&in.InHeader)); err != nil {
			st.Writers--
			return fsys.failed(err, "opening a file to write", n.name)
		}
	}
	out.Fh = fsys.newHandle(writable)
	return fuse.OK
}

func (fsys *fileSystem) newHandle(writable bool) uint64 {
	fh := uint64(fsys.generation)<<fhGenerationBits | uint64(fsys.nextFh.Add(1)&fhCounterMask)
	if writable {
		fh |= fhWritable
	}
	return fh
}

// handle returns the state of handle fh, made afresh for a handle an earlier process opened.
func (fsys *fileSystem) handle(fh uint64) *handle {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	h := fsys.handles[fh]
	if h == nil {
		h = &handle{}
		fsys.handles[fh] = h
	}
	return h
}

// Write implements fuse.RawFileSystem: into the staging file, at any offset.
func (fsys *fileSystem) Write(_ <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if in.Fh&fhWritable == 0 {
		return 0, fuse.EBADF
	}
	n := fsys.t.get(in.NodeId)
	if n == nil || n.dir {
		return 0, fuse.EBADF
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state.Sealed || n.staged == nil {
		return 0, fuse.EPERM
	}
	if n.state.SealFailed {
		// Written again since its close was told why it could not be sealed: the next last
		// close tries again.
		n.state.SealFailed = false
		if err := fsys.t.save(n, 0); err != nil {
			n.state.SealFailed = true
			return 0, fsys.failed(err, "writing a file", n.name)
		}
	}
	off := int64(in.Offset)
	w, err := n.staged.WriteAt(data, off)
	if end := off + int64(w); end > n.size {
		n.size = end
	}
	fsys.o.cfg.Metrics.writtenBytes.Add(float64(w))
	if err != nil {
		n.state.WriteLost = true
		if serr := fsys.t.save(n, 0); serr != nil {
			fsys.o.log.Error(serr, "recording a failed write; a takeover would not know of it", "file", fsys.t.rel(n))
		}
		return uint32(w), fsys.failed(err, "writing a file", n.name)
	}
	n.state.MtimeNs = time.Now().UnixNano()
	return uint32(w), fuse.OK
}

// Read implements fuse.RawFileSystem: an unsealed file from its staging file, a sealed one
// block by block from a local tier or the worker that holds each.
func (fsys *fileSystem) Read(cancel <-chan struct{}, in *fuse.ReadIn, dest []byte) (fuse.ReadResult, fuse.Status) {
	n := fsys.t.get(in.NodeId)
	if n == nil || n.dir {
		return nil, fuse.EBADF
	}
	off := int64(in.Offset)
	n.mu.Lock()
	if !n.state.Sealed {
		defer n.mu.Unlock()
		if n.staged == nil {
			return fuse.ReadResultData(nil), fuse.OK
		}
		k, err := n.staged.ReadAt(dest, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fuse.ToStatus(err)
		}
		return fuse.ReadResultData(dest[:k]), fuse.OK
	}
	token, size := n.state.Token, n.size
	n.mu.Unlock()
	ctx, stop := fuseconn.RequestContext(cancel)
	defer stop()
	version := sealedVersion{token: token, size: size, rel: func() string { return fsys.t.rel(n) }}
	h := fsys.handle(in.Fh)
	k, err := h.readSealed(ctx, fsys.o, version, dest, off)
	if errors.Is(err, errBlockLost) && ctx.Err() == nil {
		// Lost with its node: wait for it to be written again, if something will.
		if back, werr := fsys.awaitRecovery(ctx, n, version, true, err); werr != nil {
			err = werr
		} else {
			k, err = h.readSealed(ctx, fsys.o, back, dest, off)
		}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fuse.EINTR // the reader was interrupted; not worth a log line
	case err != nil:
		fsys.o.log.Error(err, "reading an output file", "file", fsys.t.rel(n))
		return nil, fuse.EIO
	}
	return fuse.ReadResultData(dest[:k]), fuse.OK
}

// Flush implements fuse.RawFileSystem: the file is sealed when its last writer closes it, so
// that close(2) returns once the file is part of the Dataset, or says why it is not.
func (fsys *fileSystem) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	if in.Fh&fhWritable == 0 {
		return fuse.OK
	}
	n := fsys.t.get(in.NodeId)
	if n == nil || n.dir {
		return fuse.OK
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st := &n.state
	if st.Sealed || st.Unlinked || st.Writers > 1 {
		return fuse.OK
	}
	ctx, stop := fuseconn.RequestContext(cancel)
	defer stop()
	errno := fsys.seal(ctx, n)
	if failed := errno != 0; failed != st.SealFailed {
		st.SealFailed = failed
		if err := fsys.t.save(n, 0); err != nil {
			fsys.o.log.Error(err, "recording a failed seal")
		}
	}
	return fuse.Status(errno)
}

// Release implements fuse.RawFileSystem: the last writer's seals the file if no flush tried to
// (a writer that was told at close why its file could not be sealed fixes that and writes it
// again), or discards it if it was removed meanwhile.
func (fsys *fileSystem) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	fsys.mu.Lock()
	h := fsys.handles[in.Fh]
	delete(fsys.handles, in.Fh)
	fsys.mu.Unlock()
	if h != nil {
		h.release()
	}
	n := fsys.t.get(in.NodeId)
	if in.Fh&fhWritable == 0 || n == nil || n.dir {
		return
	}
	defer fsys.answered(&in.InHeader)
	n.mu.Lock()
	defer n.mu.Unlock()
	st := &n.state
	if _, done := fsys.carriedOut(&in.InHeader); !done {
		st.Writers--
		if err := fsys.t.save(n, requestID(&in.InHeader)); err != nil {
			fsys.o.log.Error(err, "recording a writer's close; a takeover would wait for it forever", "file", fsys.t.rel(n))
		}
	}
	switch {
	case st.Writers > 0 || st.Sealed || st.SealFailed:
	case st.Unlinked:
		fsys.discard(n)
	default:
		ctx, stop := fuseconn.RequestContext(cancel)
		defer stop()
		if errno := fsys.seal(ctx, n); errno != 0 {
			fsys.o.log.Info("an output file stays unsealed, its bytes staged on this node, until it is written and closed again",
				"file", fsys.t.rel(n), "errno", errno.Error())
		}
	}
}

// Fsync implements fuse.RawFileSystem. It has nothing to do: written bytes are in the staging
// file, and a file is durable once sealed (lineage and checkpoints keep it), not before.
func (fsys *fileSystem) Fsync(<-chan struct{}, *fuse.FsyncIn) fuse.Status { return fuse.OK }

// Unlink implements fuse.RawFileSystem: a sealed file leaves the Dataset (the master and the
// local tier); an unsealed one is discarded once its last writer closes it.
func (fsys *fileSystem) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return fsys.removeName(cancel, h, name, false)
}

// Rmdir implements fuse.RawFileSystem.
func (fsys *fileSystem) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return fsys.removeName(cancel, h, name, true)
}

// removeName removes name from the folder h names: an empty folder if dir, else a file.
func (fsys *fileSystem) removeName(cancel <-chan struct{}, h *fuse.InHeader, name string, dir bool) fuse.Status {
	defer fsys.answered(h)
	parent, st := fsys.folder(h.NodeId)
	if !st.Ok() {
		return st
	}
	child := fsys.t.child(parent, name)
	switch {
	case child == nil:
		if _, done := fsys.carriedOut(h); done {
			return fuse.OK // removed by a process that was killed before it could answer
		}
		return fuse.ENOENT
	case dir && !child.dir:
		return fuse.ENOTDIR
	case !dir && child.dir:
		return fuse.Status(syscall.EISDIR)
	case dir && !fsys.t.isEmpty(child):
		return fuse.Status(syscall.ENOTEMPTY)
	}
	ctx, stop := fuseconn.RequestContext(cancel)
	defer stop()
	if errno := fsys.o.writable(ctx); errno != 0 {
		return fuse.Status(errno)
	}
	if !dir {
		if errno := fsys.removeFile(ctx, child); errno != 0 {
			return fuse.Status(errno)
		}
	}
	if err := fsys.t.remove(parent, name, child, requestID(h)); err != nil {
		return fsys.failed(err, "removing", name)
	}
	return fuse.OK
}

// Rename implements fuse.RawFileSystem: unsealed files and folders that hold none move; a
// sealed file's blocks are reported under its path, so moving it is EXDEV, which makes mv(1)
// copy it instead.
func (fsys *fileSystem) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	defer fsys.answered(&in.InHeader)
	if in.Flags&unix.RENAME_EXCHANGE != 0 {
		return fuse.EINVAL
	}
	from, st := fsys.folder(in.NodeId)
	if !st.Ok() {
		return st
	}
	to, st := fsys.folder(in.Newdir)
	if !st.Ok() {
		return st
	}
	if reserved(to, newName) {
		return fuse.EPERM
	}
	child := fsys.t.child(from, oldName)
	if child == nil {
		if _, done := fsys.carriedOut(&in.InHeader); done {
			return fuse.OK
		}
		return fuse.ENOENT
	}
	ctx, stop := fuseconn.RequestContext(cancel)
	defer stop()
	if errno := fsys.o.writable(ctx); errno != 0 {
		return fuse.Status(errno)
	}
	if fsys.t.holdsSealed(child) {
		return fuse.Status(syscall.EXDEV)
	}
	target := fsys.t.child(to, newName)
	if target == child {
		return fuse.OK
	}
	if target != nil {
		switch {
		case in.Flags&unix.RENAME_NOREPLACE != 0:
			return fuse.Status(syscall.EEXIST)
		case child.dir && !target.dir:
			return fuse.ENOTDIR
		case !child.dir && target.dir:
			return fuse.Status(syscall.EISDIR)
		case target.dir && !fsys.t.isEmpty(target):
			return fuse.Status(syscall.ENOTEMPTY)
		case !target.dir:
			// The file in the way goes, as with unlink.
			if errno := fsys.removeFile(ctx, target); errno != 0 {
				return fuse.Status(errno)
			}
		}
	}
	if err := fsys.t.move(child, from, oldName, to, newName, requestID(&in.InHeader)); err != nil {
		return fsys.failed(err, "renaming", oldName)
	}
	return fuse.OK
}

// removeFile deletes a file that is being unlinked or renamed over.
func (fsys *fileSystem) removeFile(ctx context.Context, n *node) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := &n.state
	if st.Sealed {
		return fsys.o.deleteSealed(ctx, fsys.t.rel(n), st.Token, n.size)
	}
	if st.Writers == 0 {
		fsys.discard(n)
		return 0
	}
	st.Unlinked = true
	if err := fsys.t.save(n, 0); err != nil {
		st.Unlinked = false
		fsys.o.log.Error(err, "recording a removal")
		return syscall.EIO
	}
	return 0
}

// discard drops the staged bytes of a file nobody will seal; n.mu is held.
func (fsys *fileSystem) discard(n *node) {
	if n.staged != nil {
		fsys.o.dropStaged(n.staged)
		n.staged = nil
	}
}

// OpenDir implements fuse.RawFileSystem: the folder is listed now, with what other nodes
// sealed into it since the mount, and read from that listing.
func (fsys *fileSystem) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	dir, st := fsys.folder(in.NodeId)
	if !st.Ok() {
		return st
	}
	ctx, stop := fuseconn.RequestContext(cancel)
	defer stop()
	fsys.o.refreshDir(ctx, fsys.t, dir)
	out.Fh = fsys.newHandle(false)
	fsys.mu.Lock()
	fsys.listings[out.Fh] = fsys.list(dir)
	fsys.mu.Unlock()
	return fuse.OK
}

// list returns dir's entries in name order.
func (fsys *fileSystem) list(dir *node) []fuseconn.Entry {
	fsys.t.mu.RLock()
	defer fsys.t.mu.RUnlock()
	entries := make([]fuseconn.Entry, 0, len(dir.children))
	for name, c := range dir.children {
		entries = append(entries, fuseconn.Entry{Name: name, ID: c.id, Dir: c.dir})
	}
	slices.SortFunc(entries, func(a, b fuseconn.Entry) int { return strings.Compare(a.Name, b.Name) })
	return entries
}

// ReleaseDir implements fuse.RawFileSystem.
func (fsys *fileSystem) ReleaseDir(in *fuse.ReleaseIn) {
	fsys.mu.Lock()
	delete(fsys.listings, in.Fh)
	fsys.mu.Unlock()
}

// ReadDir implements fuse.RawFileSystem.
func (fsys *fileSystem) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return fsys.readDir(in, out, false)
}

// ReadDirPlus implements fuse.RawFileSystem.
func (fsys *fileSystem) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return fsys.readDir(in, out, true)
}

// readDir lists a folder from position in.Offset of its listing: "." and ".." first, then the
// children in name order. A handle an earlier process opened is listed afresh.
func (fsys *fileSystem) readDir(in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	dir, st := fsys.folder(in.NodeId)
	if !st.Ok() {
		return st
	}
	fsys.mu.Lock()
	entries, ok := fsys.listings[in.Fh]
	if !ok {
		entries = fsys.list(dir)
		fsys.listings[in.Fh] = entries
	}
	fsys.mu.Unlock()
	var fill func(uint64, *fuse.EntryOut)
	if plus {
		fill = func(id uint64, out *fuse.EntryOut) {
			if n := fsys.t.get(id); n != nil {
				fillEntry(n, out)
			}
		}
	}
	fuseconn.ListDir(out, in.Offset, dir.id, fsys.t.parentOf(dir), len(entries), func(i int) fuseconn.Entry { return entries[i] }, fill)
	return fuse.OK
}

// StatFs implements fuse.RawFileSystem: the staging file system, what may still be written on
// this node.
func (fsys *fileSystem) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	var st syscall.Statfs_t
	if err := syscall.Statfs(fsys.o.cfg.StagingDir, &st); err != nil {
		return fuse.ToStatus(err)
	}
	out.FromStatfsT(&st)
	return fuse.OK
}

// failed logs err, which stops a change, and returns its errno (EIO for anything but a
// system call's).
func (fsys *fileSystem) failed(err error, what, name string) fuse.Status {
	fsys.o.log.Error(err, what, "name", name)
	return fuse.Status(errnoOf(err))
}

// errnoOf is the errno of a failed system call, EIO for anything else.
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}

// dropStaged closes and removes a staging file.
func (o *output) dropStaged(f *stagedFile) {
	if err := f.remove(); err != nil {
		o.log.Error(err, "removing the staging files of a file", "token", f.token)
	}
}

// newStaged makes a new file version: its token, 128 random bits in hex, and its staging.
func (o *output) newStaged() (string, *stagedFile, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", nil, fmt.Errorf("making a file token: %w", err)
	}
	token := hex.EncodeToString(b)
	staged, err := createStaged(o.cfg.StagingDir, token, o.cfg.BlockSize)
	if err != nil {
		return "", nil, err
	}
	return token, staged, nil
}
