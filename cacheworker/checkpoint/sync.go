package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/masterpb"
)

// ErrNoTarget means a Dataset has no checkpoint target this worker knows of: its spec has no
// checkpoint, or the operator's settings have not reached the worker yet.
var ErrNoTarget = errors.New("no checkpoint target")

// ErrNotCheckpointed means a file has no checkpoint to read back.
var ErrNotCheckpointed = errors.New("not checkpointed")

// Persist is the tier store's persist callback (tierstore.Config.Persist): before the store
// drops the only copy of a block of an output file, the whole file is written to its Dataset's
// target, at once and without the bandwidth cap, and recorded at the master. Blocks of a
// Dataset without a target are refused: they stay, and a tier full of them refuses writes.
func (c *Checkpointer) Persist(ctx context.Context, b tierstore.BlockInfo, _ io.Reader) error {
	store, err := c.blocks()
	if err != nil {
		return err
	}
	o, ok := outputOrigin(b.Origin)
	if !ok {
		return fmt.Errorf("block %s is no output file's, and only output files are checkpointed", b.ID)
	}
	d := c.current().of(o.GetDataset())
	if d == nil {
		return fmt.Errorf("block %s holds the only copy of part of %s, and Dataset %s has %w this worker knows of (its spec.checkpoint): it stays in memory",
			b.ID, o.GetPath(), o.GetDataset(), ErrNoTarget)
	}
	if c.isRecorded(o.GetPath(), o.GetFileToken()) {
		return nil
	}
	// The file's blocks, found by their ids: what the store holds of it, whole or not (a file
	// held in part fails to checkpoint with errPartial, and its block stays).
	f := &heldFile{ds: d, path: o.GetPath(), token: o.GetFileToken(), created: b.Created}
	f.eachHeld(store, f.add)
	if len(f.blocks) == 0 {
		return fmt.Errorf("%s: block 0 is missing on this node (%w)", o.GetPath(), errPartial)
	}
	if err := c.checkpoint(ctx, store, f, reasonPersist, false); err != nil && !errors.Is(err, errGone) {
		return err
	}
	return nil
}

// SealedFile is a file an output mount seals: its blocks are in the tier store, and it is, or
// is about to be, published at the master under its token.
type SealedFile struct {
	Dataset, Path, Token string
	Size                 int64
	// Blocks are the ids of its blocks, in order.
	Blocks []string
}

// WriteThrough writes f to its Dataset's target before its seal returns, when f is larger than
// the Dataset's syncWriteThreshold, and returns the version of the object written, or "" if it
// wrote nothing: the file is durable before the writer's close(2) returns, or the close fails.
// A Dataset without a known target, or no threshold, writes nothing here: the background loop
// checkpoints the file later.
func (c *Checkpointer) WriteThrough(ctx context.Context, f SealedFile) (string, error) {
	d := c.current().of(f.Dataset)
	if d == nil || d.SyncWriteThreshold <= 0 || f.Size <= d.SyncWriteThreshold {
		return "", nil
	}
	store, err := c.blocks()
	if err != nil {
		return "", err
	}
	start := c.cfg.Now()
	version, err := c.writeThrough(ctx, store, d, f)
	if err != nil {
		c.cfg.Metrics.failures.WithLabelValues(reasonWriteThrough).Inc()
		return "", fmt.Errorf("writing %s through to its checkpoint target (it is above the syncWriteThreshold of %d bytes): %w",
			f.Path, d.SyncWriteThreshold, err)
	}
	c.cfg.Metrics.files.WithLabelValues(reasonWriteThrough).Inc()
	c.cfg.Metrics.bytes.WithLabelValues(reasonWriteThrough).Add(float64(f.Size))
	c.cfg.Metrics.duration.WithLabelValues(reasonWriteThrough).Observe(c.cfg.Now().Sub(start).Seconds())
	return version, nil
}

// writeThrough writes f, which is not published yet, over whatever object its path holds: the
// version before it at the master was forgotten (a file is written again only once its old
// version is), and an upload of that version still under way fails once this one lands. A
// write that another lands before (that old upload, or another writer of the same new path)
// looks again and is written again; the version recorded at publication tells a read back
// whether the object is still this file's.
func (c *Checkpointer) writeThrough(ctx context.Context, store Blocks, d *dataset, f SealedFile) (string, error) {
	target, err := c.storeOf(ctx, d)
	if err != nil {
		return "", err
	}
	for try := 1; ; try++ {
		pre, err := understore.Current(ctx, target, d.rel(f.Path))
		if err != nil {
			return "", fmt.Errorf("looking at the object it replaces: %w", err)
		}
		version, err := c.write(ctx, store, target, d, f.Path, f.Blocks, f.Size, rate.Inf, pre)
		if !errors.Is(err, understore.ErrChanged) || try == landTries {
			return version, err
		}
	}
}

// Published tells the checkpointer that f is published at the master; written is the version
// WriteThrough wrote, if it did. A file written through is recorded as checkpointed and its
// blocks marked clean; any other is a new candidate for the background loop.
//
// Only a file of a Dataset with checkpoint settings wakes the loop: a round looks at every
// block the store holds, and a step writing many small files into a Dataset that is not
// checkpointed would otherwise have a round for each, all for nothing, on the cores the writer
// needs (a node holding n blocks paid n for each seal). Such a file's blocks are counted in
// the pending gauge at the next Poll.
func (c *Checkpointer) Published(ctx context.Context, f SealedFile, written string) {
	d := c.current().of(f.Dataset)
	if d == nil {
		return
	}
	defer c.Wake()
	if written == "" {
		// The background loop may have seen its blocks before it was published: now it may.
		c.mu.Lock()
		delete(c.retries, fileKey(f.Path, f.Token))
		c.mu.Unlock()
		return
	}
	if err := c.record(ctx, d, f.Path, f.Token, written); err != nil {
		// The background loop writes it again and records it then.
		c.log.Error(err, "Recording a file written through; it is checkpointed again later", "file", f.Path)
		return
	}
	store, err := c.blocks()
	if err != nil {
		return
	}
	held := &heldFile{ds: d, path: f.Path, token: f.Token}
	for _, id := range f.Blocks {
		held.blocks = append(held.blocks, tierstore.BlockInfo{ID: id})
	}
	c.markClean(ctx, store, held)
}

// ReadBackRequest names a block of an output file to read from the file's checkpoint.
type ReadBackRequest struct {
	// Dataset and Root are the Dataset's name and root at the master.
	Dataset, Root string
	// Path is the file's path at the master, Token the version the reader shows.
	Path, Token string
	// BlockID is the block's id in the tier store; Index its index in the file, at Offset, of
	// Length bytes.
	BlockID               string
	Index, Offset, Length int64
}

// ReadBack reads a block of an output file from its checkpoint, when no worker holds it any
// more (its node was lost, or memory dropped it once checkpointed), and keeps it in the tier
// store, clean, for the next reads. It fails with ErrNotCheckpointed if the master has no
// checkpoint of this version of the file.
func (c *Checkpointer) ReadBack(ctx context.Context, r ReadBackRequest) ([]byte, error) {
	d := c.current().of(r.Dataset)
	if d == nil {
		return nil, fmt.Errorf("reading %s back: Dataset %s has %w this worker knows of", r.Path, r.Dataset, ErrNoTarget)
	}
	checkpointed := func(staleOK bool) (*masterpb.File, bool, error) {
		mctx, cancel := context.WithTimeout(ctx, c.cfg.MasterTimeout)
		defer cancel()
		mf, err := c.cfg.Master.GetFile(mctx, &masterpb.GetFileRequest{Path: r.Path, StaleOk: staleOK})
		if err != nil {
			return nil, false, fmt.Errorf("reading %s back: asking the master for its checkpoint: %w", r.Path, err)
		}
		return mf, mf.GetClientToken() == r.Token && mf.GetCheckpointState() == masterpb.CheckpointState_CHECKPOINT_STATE_DONE, nil
	}
	// A follower may not know of a checkpoint just recorded: a no is asked of the leader again.
	mf, ok, err := checkpointed(true)
	if err == nil && !ok {
		mf, ok, err = checkpointed(false)
	}
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, fmt.Errorf("reading %s back: this version is %w", r.Path, ErrNotCheckpointed)
	}
	target, err := c.storeOf(ctx, d)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, r.Length)
	var n int
	if version := mf.GetCheckpointVersion(); version != "" {
		n, err = target.ReadVersionAt(ctx, d.rel(r.Path), version, buf, r.Offset)
	} else {
		// Recorded before versions were: whatever the object is now.
		n, err = target.ReadAt(ctx, d.rel(r.Path), buf, r.Offset)
	}
	if errors.Is(err, understore.ErrChanged) {
		c.forgetReplaced(ctx, r)
		return nil, fmt.Errorf("reading %s back: its checkpoint %s was replaced in the under-store since it was written, and holds other bytes now: this version is %w",
			r.Path, mf.GetCheckpointUri(), ErrNotCheckpointed)
	}
	if int64(n) < r.Length {
		return nil, fmt.Errorf("reading block %d of %s back from its checkpoint: %d of %d bytes: %w", r.Index, r.Path, n, r.Length, err)
	}
	c.cfg.Metrics.readBack.Add(float64(r.Length))
	c.keep(ctx, r, buf)
	return buf, nil
}

// forgetReplaced clears the master's record of a checkpoint whose object was replaced, so that
// the file, if no worker holds it either, counts as lost and is recomputed rather than read
// back in vain.
func (c *Checkpointer) forgetReplaced(ctx context.Context, r ReadBackRequest) {
	mctx, cancel := context.WithTimeout(ctx, c.cfg.MasterTimeout)
	defer cancel()
	_, err := c.cfg.Master.CheckpointFile(mctx, &masterpb.CheckpointFileRequest{
		Path: r.Path, State: masterpb.CheckpointState_CHECKPOINT_STATE_NONE, ClientToken: r.Token,
	})
	if err != nil {
		c.log.Error(err, "Clearing the record of a checkpoint replaced in the under-store; the next read back tries again", "file", r.Path)
		return
	}
	c.log.Info("A checkpoint was replaced in the under-store since it was written; its record is cleared", "file", r.Path)
}

// keep stores a block read back, clean (its checkpoint is a copy), so that the next reads are
// local; a block that does not fit is only not kept.
func (c *Checkpointer) keep(ctx context.Context, r ReadBackRequest, data []byte) {
	store, err := c.blocks()
	if err != nil {
		return
	}
	origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: r.Path, Dataset: r.Dataset, Root: r.Root, Index: r.Index, Offset: r.Offset, FileToken: r.Token})
	if err != nil {
		return
	}
	info, err := store.Put(ctx, r.BlockID, bytes.NewReader(data), int64(len(data)), tierstore.PutOptions{Clean: true, Origin: origin})
	switch {
	case errors.Is(err, tierstore.ErrExists):
	case err != nil:
		c.log.V(1).Info("Not keeping a block read back from its checkpoint", "block", r.BlockID, "error", err.Error())
	case c.cfg.Stored != nil:
		c.cfg.Stored(ctx, info)
	}
}
