package outputfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/masterpb"
)

// errSealedElsewhere means another writer published a file of the same path first.
var errSealedElsewhere = errors.New("a file of this path was sealed first by another writer")

// seal makes the staged file part of the Dataset (see doc.go); n.mu is held. On failure the
// file stays unsealed with its bytes staged, and the errno says why. A seal that a killed
// process left half done is finished: the blocks it stored are kept, and a file it published
// is only recorded.
func (fsys *fileSystem) seal(ctx context.Context, n *node) syscall.Errno {
	o := fsys.o
	// Not cancelled by the kernel's interrupt: a writer's thread takes signals while it waits in
	// close(2) (Go's runtime preempts with SIGURG), and a seal given up half way has only cost
	// work. Bounded instead.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*o.cfg.MasterTimeout)
	defer cancel()
	rel := fsys.t.rel(n)
	log := o.log.WithValues("file", rel, "bytes", n.size)
	st := &n.state
	if n.staged == nil {
		return syscall.EIO // cannot happen: only a sealed or discarded file has no staging file
	}
	if st.WriteLost {
		o.cfg.Metrics.sealFailures.WithLabelValues(unix.ErrnoName(syscall.EIO)).Inc()
		log.Info("not sealing an output file a write into which failed (see the error logged then): truncate it and write it anew")
		return syscall.EIO
	}
	start := time.Now()
	err := o.seal(ctx, rel, st.Token, st.Attempt, n.staged, n.size, n.inherited)
	o.cfg.Metrics.sealSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		errno := syscall.EIO
		switch {
		case errors.Is(err, tierstore.ErrTierFull):
			errno = syscall.ENOSPC
		case errors.Is(err, errSealedElsewhere):
			errno = syscall.EEXIST
		case status.Code(err) == codes.FailedPrecondition && o.isComplete(ctx, true):
			errno = syscall.EROFS
		}
		o.cfg.Metrics.sealFailures.WithLabelValues(unix.ErrnoName(errno)).Inc()
		log.Error(err, "sealing an output file failed; it stays staged on this node", "errno", errno.Error())
		return errno
	}
	st.Sealed, st.Size, st.SealFailed = true, n.size, false
	st.Mode &^= 0o222
	if err := fsys.t.save(n, 0); err != nil {
		// Published, but a process taking over would not know: it would seal it again, which
		// finds it published.
		log.Error(err, "recording a sealed file")
	}
	n.sealed.Store(true)
	fsys.discard(n)
	o.cfg.Metrics.sealedFiles.Inc()
	o.cfg.Metrics.sealedBytes.Add(float64(n.size))
	log.V(1).Info("sealed an output file")
	return 0
}

// maxSealBlocks is the most blocks a file may have to be sealed with one master command
// (fsm.MaxSealBlocks); larger files are created under the sealing folder, committed block by
// block and renamed into place.
const maxSealBlocks = 64

// seal publishes the size bytes of staged as the file rel, whose token is token, written by
// attempt (masterpb.File.attempt; empty when not known). A file an earlier process staged
// (inherited) may be published already, or have some blocks stored.
func (o *output) seal(ctx context.Context, rel, token, attempt string, staged *stagedFile, size int64, inherited bool) (err error) {
	final := o.masterPath(rel)
	mctx, cancel := o.masterContext(ctx)
	defer cancel()
	var stored []int64 // indexes of the blocks stored
	sealing := ""      // the file being assembled at the master, for a large file
	defer func() {
		if err != nil {
			o.undoSeal(sealing, token, staged, stored)
		}
	}()
	if (size+o.cfg.BlockSize-1)/o.cfg.BlockSize <= maxSealBlocks {
		// At once: the blocks, then the file with all of them, in one command (a retry of
		// which, after a kill, finds the file by its token).
		var blocks []*masterpb.CommitBlockRequest
		err := o.storeBlocks(ctx, final, token, staged, size, &stored, func(info tierstore.BlockInfo, off int64) error {
			blocks = append(blocks, o.cfg.Locations.CommitRequest(info, final, off))
			return nil
		})
		if err != nil {
			return err
		}
		return o.writeThrough(ctx, final, token, size, func() error {
			return o.sealAtOnce(mctx, &masterpb.SealFileRequest{Path: final, Dataset: o.cfg.Dataset, ClientToken: token, Blocks: blocks, Attempt: attempt, Written: true})
		})
	}
	if inherited {
		if f, err := o.cfg.Master.GetFile(mctx, &masterpb.GetFileRequest{Path: final}); err == nil && f.GetClientToken() == token {
			return nil // published by a process killed before it could record so
		}
	}
	sealing = o.cfg.Root + "/" + SealingDir + "/" + token
	if err := o.createSealing(mctx, sealing, token, attempt); err != nil {
		return fmt.Errorf("creating %s at the master: %w", sealing, err)
	}
	err = o.storeBlocks(ctx, final, token, staged, size, &stored, func(info tierstore.BlockInfo, off int64) error {
		return o.cfg.Locations.Commit(mctx, info, sealing, off)
	})
	if err != nil {
		return err
	}
	return o.writeThrough(ctx, final, token, size, func() error {
		if _, err := o.cfg.Master.RenameFile(mctx, sealing, final); err != nil {
			if status.Code(err) == codes.AlreadyExists {
				return fmt.Errorf("publishing %s: %w", final, errSealedElsewhere)
			}
			return fmt.Errorf("publishing %s at the master: %w", final, err)
		}
		return nil
	})
}

// writeThrough publishes a file whose blocks are stored, with publish: a file above its
// Dataset's syncWriteThreshold is written to the Dataset's checkpoint target first, so that the
// seal fails rather than publish it without that copy (see Config.Checkpoints).
func (o *output) writeThrough(ctx context.Context, final, token string, size int64, publish func() error) error {
	if o.cfg.Checkpoints == nil {
		return publish()
	}
	f := checkpoint.SealedFile{Dataset: o.cfg.Dataset, Path: final, Token: token, Size: size}
	for index := int64(0); index*o.cfg.BlockSize < size; index++ {
		f.Blocks = append(f.Blocks, blockindex.OutputBlockID(token, index))
	}
	written, err := o.cfg.Checkpoints.WriteThrough(ctx, f)
	if err != nil {
		return err
	}
	if err := publish(); err != nil {
		return err
	}
	o.cfg.Checkpoints.Published(ctx, f, written)
	return nil
}

// storeBlocks stores the size bytes of staged in the tier store, block by block, and hands
// each to stored (which reports it); stored gets the index of each block stored. The staging
// files stay until the seal succeeded (see stagedFile).
func (o *output) storeBlocks(ctx context.Context, final, token string, staged *stagedFile, size int64, indexes *[]int64,
	stored func(info tierstore.BlockInfo, off int64) error,
) error {
	bs := o.cfg.BlockSize
	for off, index := int64(0), int64(0); off < size; off, index = off+bs, index+1 {
		origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: final, Dataset: o.cfg.Dataset, Root: o.cfg.Root, Index: index, Offset: off, FileToken: token})
		if err != nil {
			return fmt.Errorf("encoding the origin of block %d: %w", index, err)
		}
		info, err := o.storeBlock(ctx, blockindex.OutputBlockID(token, index), staged, index, min(bs, size-off), origin)
		if err != nil {
			return fmt.Errorf("storing block %d: %w", index, err)
		}
		*indexes = append(*indexes, index)
		if err := stored(info, off); err != nil {
			return err
		}
	}
	return nil
}

// sealAtOnce publishes a file with all its blocks in one command. A Dataset the master forgot
// (to recompute it, while this mount stayed) is registered again first: its new writer is here.
func (o *output) sealAtOnce(ctx context.Context, req *masterpb.SealFileRequest) error {
	_, err := o.cfg.Master.SealFile(ctx, req)
	if status.Code(err) == codes.NotFound {
		if _, rerr := o.cfg.Master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: o.cfg.Dataset, Root: o.cfg.Root}); rerr != nil {
			return fmt.Errorf("registering output Dataset %s again at the master: %w", o.cfg.Dataset, rerr)
		}
		_, err = o.cfg.Master.SealFile(ctx, req)
	}
	switch {
	case status.Code(err) == codes.AlreadyExists:
		return fmt.Errorf("publishing %s: %w", req.Path, errSealedElsewhere)
	case err != nil:
		return fmt.Errorf("publishing %s at the master: %w", req.Path, err)
	}
	return nil
}

// storeBlock stores the length bytes of block index of staged as block id: its staging file
// becomes the block (Blocks.Adopt links it; nothing is copied), unless a seal that a killed
// process began stored that very file already. A stored block of other bytes (copied by a
// store that could not link, or kept by a failed seal that could not remove it) is replaced.
func (o *output) storeBlock(ctx context.Context, id string, staged *stagedFile, index, length int64, origin []byte) (tierstore.BlockInfo, error) {
	path, err := staged.blockFile(index, length)
	if err != nil {
		return tierstore.BlockInfo{}, err
	}
	if f, info, err := o.cfg.Store.OpenBlock(ctx, id); err == nil {
		same := sameFile(f, path)
		_ = f.Close()
		// The same file, unless written since (a failed seal that could neither drop the
		// block nor give the staged bytes a file of their own): its checksum says.
		if same && info.Size == length && o.intact(ctx, id) {
			return info, nil
		}
		if err := o.cfg.Store.Delete(ctx, id); err != nil {
			return tierstore.BlockInfo{}, fmt.Errorf("replacing a stale copy of the block: %w", err)
		}
	}
	// Unclean: this is the only copy, so the store persists it before it ever drops it.
	opts := tierstore.PutOptions{Origin: origin}
	if sum, ok := staged.checksum(index, length); ok {
		opts.Checksum = &sum // taken as the writer wrote the block: the store need not read it
	}
	return o.cfg.Store.Adopt(ctx, id, path, length, opts)
}

// intact says whether block id still has the bytes its checksum was taken of.
func (o *output) intact(ctx context.Context, id string) bool {
	r, _, err := o.cfg.Store.OpenVerified(ctx, id)
	if err != nil {
		return false
	}
	defer func() { _ = r.Close() }() // read only
	_, err = io.Copy(io.Discard, r)
	return err == nil
}

// sameFile says whether f is the file at path.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// createSealing creates the file being sealed at the master. A Dataset the master forgot (to
// recompute it, while this mount stayed) is registered again first: its new writer is here.
func (o *output) createSealing(ctx context.Context, sealing, token, attempt string) error {
	req := &masterpb.CreateFileRequest{Path: sealing, Dataset: o.cfg.Dataset, ClientToken: token, Attempt: attempt, Written: true}
	_, err := o.cfg.Master.CreateFile(ctx, req)
	if status.Code(err) != codes.NotFound {
		return err
	}
	if _, err := o.cfg.Master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: o.cfg.Dataset, Root: o.cfg.Root}); err != nil {
		return fmt.Errorf("registering output Dataset %s again at the master: %w", o.cfg.Dataset, err)
	}
	_, err = o.cfg.Master.CreateFile(ctx, req)
	return err
}

// undoSeal forgets the blocks stored by a failed seal and the half-made file: the file is
// unsealed again, its bytes where they were (its staging files, which the blocks were linked
// from).
func (o *output) undoSeal(sealing, token string, staged *stagedFile, stored []int64) {
	ctx, cancel := context.WithTimeout(context.Background(), o.cfg.MasterTimeout)
	defer cancel()
	for _, index := range stored {
		id := blockindex.OutputBlockID(token, index)
		err := o.cfg.Store.Delete(ctx, id)
		if err == nil || errors.Is(err, tierstore.ErrNotFound) {
			continue
		}
		o.log.Error(err, "removing a block of a failed seal; it stays in the tier until the file is sealed again", "block", id)
		// The staging file may be the kept block itself: give the staged bytes a file of their
		// own, so that the writes that follow never change the stored block.
		if err := staged.restore(index); err != nil {
			o.log.Error(err, "copying the staged bytes of a kept block", "block", id)
		}
	}
	if sealing == "" {
		return // sealed at once: the master has nothing of it
	}
	if _, err := o.cfg.Master.DeleteFile(ctx, sealing); err != nil && status.Code(err) != codes.NotFound {
		o.log.Error(err, "removing a half-sealed file at the master; readers never see it", "path", sealing)
	}
}

// deleteSealed removes a sealed file from the master, then its blocks from the local tier.
func (o *output) deleteSealed(ctx context.Context, rel, token string, size int64) syscall.Errno {
	// As a seal, not cancelled by an interrupt: a file forgotten at the master must lose its blocks.
	ctx, cancel := o.masterContext(ctx)
	defer cancel()
	if _, err := o.cfg.Master.DeleteFile(ctx, o.masterPath(rel)); err != nil && status.Code(err) != codes.NotFound {
		o.log.Error(err, "deleting an output file at the master", "file", rel)
		return syscall.EIO
	}
	for index := int64(0); index*o.cfg.BlockSize < size; index++ {
		if err := o.cfg.Store.Delete(ctx, blockindex.OutputBlockID(token, index)); err != nil && !errors.Is(err, tierstore.ErrNotFound) {
			o.log.Error(err, "removing a block of a deleted output file; it stays until the worker restarts", "file", rel, "block", index)
		}
	}
	return 0
}

// heldBlock is one block of a sealed file, kept by a handle for the reads that follow.
type heldBlock struct {
	token string
	index int64
	file  *os.File // the copy in a local tier, or
	data  []byte   // the bytes a peer sent
}

func (b *heldBlock) close() {
	if b.file != nil {
		_ = b.file.Close()
	}
}

// sealedVersion is the version of a sealed file a read reads.
type sealedVersion struct {
	token string
	size  int64
	// rel is the file's path in the Dataset, asked for only to read a block back from its
	// checkpoint.
	rel func() string
}

// readSealed fills dest from off of a sealed file, block by block: from a local tier, from the
// worker that holds the block, or from the file's checkpoint.
func (h *handle) readSealed(ctx context.Context, o *output, v sealedVersion, dest []byte, off int64) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	end := min(off+int64(len(dest)), v.size)
	done := 0
	for pos := off; pos < end; {
		index := pos / o.cfg.BlockSize
		start := index * o.cfg.BlockSize
		if h.cur == nil || h.cur.index != index || h.cur.token != v.token {
			b, err := o.loadBlock(ctx, v, index)
			if err != nil {
				return done, err
			}
			if h.cur != nil {
				h.cur.close()
			}
			h.cur = b
		}
		k := int(min(end, start+o.cfg.BlockSize) - pos)
		p := dest[done : done+k]
		if h.cur.file != nil {
			if n, err := h.cur.file.ReadAt(p, pos-start); n < k {
				return done, fmt.Errorf("reading the local copy of block %d: %w", index, err)
			}
		} else {
			if int64(len(h.cur.data)) < pos-start+int64(k) {
				return done, fmt.Errorf("block %d is %d bytes, shorter than the file says", index, len(h.cur.data))
			}
			copy(p, h.cur.data[pos-start:])
		}
		done += k
		pos += int64(k)
	}
	return done, nil
}

// loadBlock opens the local copy of a block, or reads it from the worker that holds it, or
// else from the file's checkpoint.
func (o *output) loadBlock(ctx context.Context, v sealedVersion, index int64) (*heldBlock, error) {
	id := blockindex.OutputBlockID(v.token, index)
	if f, _, err := o.cfg.Store.OpenBlock(ctx, id); err == nil {
		return &heldBlock{token: v.token, index: index, file: f}, nil
	}
	data, err := o.cfg.Locations.ReadBlock(ctx, id)
	if err == nil {
		if o.cfg.KeepsReadCopies != nil && o.cfg.KeepsReadCopies(o.cfg.Dataset) {
			o.keep(ctx, v, index, data)
		}
		return &heldBlock{token: v.token, index: index, data: data}, nil
	}
	if o.cfg.Checkpoints == nil {
		return nil, fmt.Errorf("block %s is in no local tier and no worker could send it (%w): %w", id, errBlockLost, err)
	}
	off := index * o.cfg.BlockSize
	data, cerr := o.cfg.Checkpoints.ReadBack(ctx, checkpoint.ReadBackRequest{
		Dataset: o.cfg.Dataset, Root: o.cfg.Root, Path: o.masterPath(v.rel()), Token: v.token,
		BlockID: id, Index: index, Offset: off, Length: min(o.cfg.BlockSize, v.size-off),
	})
	if cerr != nil {
		return nil, fmt.Errorf("block %s is in no local tier, no worker could send it, and its checkpoint cannot be read "+
			"(%w): %w; %w", id, errBlockLost, err, cerr)
	}
	return &heldBlock{token: v.token, index: index, data: data}, nil
}

// keep stores a block read from another worker in the top tier, unclean (no under-store holds
// it), and has it recorded at the master as a copy of version v: a replica that the read made,
// which replication then need not make. A failure only costs the copy.
func (o *output) keep(ctx context.Context, v sealedVersion, index int64, data []byte) {
	id := blockindex.OutputBlockID(v.token, index)
	rel := v.rel()
	if rel == "" {
		return // out of the tree: no path to record it under
	}
	origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: o.masterPath(rel), Dataset: o.cfg.Dataset, Root: o.cfg.Root,
		Index: index, Offset: index * o.cfg.BlockSize, FileToken: v.token})
	if err != nil {
		return
	}
	info, err := o.cfg.Store.Put(ctx, id, bytes.NewReader(data), int64(len(data)), tierstore.PutOptions{Origin: origin})
	if err != nil {
		if !errors.Is(err, tierstore.ErrExists) {
			o.log.V(1).Info("cannot keep a copy of a block read from another node", "block", id, "error", err.Error())
		}
		return
	}
	if err := o.cfg.Locations.Report(ctx, info); err != nil {
		o.log.V(1).Info("cannot record a kept copy of a block at the master", "block", id, "error", err.Error())
	}
}

func (h *handle) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != nil {
		h.cur.close()
		h.cur = nil
	}
	if h.spliced != nil {
		h.dropSplicedLocked(h.spliced)
		h.spliced = nil
	}
}
