package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/throttle"
	"github.com/strata-cache/strata/lineage"
	"github.com/strata-cache/strata/master/masterpb"
)

// Blocks is the part of the tier store the checkpointer works on.
type Blocks interface {
	UncleanBlocks() []tierstore.BlockInfo
	Info(id string) (tierstore.BlockInfo, error)
	OpenVerified(ctx context.Context, id string) (io.ReadCloser, tierstore.BlockInfo, error)
	SetClean(ctx context.Context, id string) error
	Put(ctx context.Context, id string, r io.Reader, size int64, opts tierstore.PutOptions) (tierstore.BlockInfo, error)
}

// Master is the part of the master client the checkpointer uses: a file's record, and the
// record of its checkpoint.
type Master interface {
	GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error)
	CheckpointFile(ctx context.Context, req *masterpb.CheckpointFileRequest) (*masterpb.File, error)
}

// Defaults of Config.
const (
	// DefaultPoll is how often the files held are looked at when nothing wakes the checkpointer:
	// reads make files hot, and Interval ticks come due, without a seal to say so.
	DefaultPoll = 5 * time.Second
	// DefaultMasterTimeout bounds each call to the master.
	DefaultMasterTimeout = 30 * time.Second
)

// Bounds of the retries of a file whose checkpoint failed: the under-store may come back.
const (
	firstRetry = 5 * time.Second
	lastRetry  = 5 * time.Minute
	// unpublishedRetry is when a file whose blocks are stored but which the master does not
	// list yet is looked at again: its seal publishes it within moments.
	unpublishedRetry = time.Second
)

// Config configures a Checkpointer.
type Config struct {
	Master Master
	// Stored reports a block read back from a checkpoint and kept in the tier store, so that
	// peers find it (locations.Directory.Enqueue); nil reports none.
	Stored func(ctx context.Context, info tierstore.BlockInfo)
	// OpenStore opens an under-store; nil means understore.Open.
	OpenStore func(ctx context.Context, src understore.Source) (understore.Store, error)
	// Poll is how often the files held are looked at anew; 0 means DefaultPoll.
	Poll time.Duration
	// MasterTimeout bounds each call to the master; 0 means DefaultMasterTimeout.
	MasterTimeout time.Duration
	// Metrics receives the counts; nil counts nowhere.
	Metrics *Metrics
	// Now is the clock of planning; nil means time.Now.
	Now func() time.Time
	Log logr.Logger
}

// Checkpointer writes the output files a worker holds to their Datasets' under-stores: in the
// background, one at a time, as each Dataset's strategy plans it and within its bandwidth cap;
// at once, for the tier store before it drops the only copy of a block (Persist) and for an
// output mount before a large file's seal returns (WriteThrough). It reads a lost block back
// from its checkpoint (ReadBack). See doc.go.
type Checkpointer struct {
	cfg     Config
	log     logr.Logger
	store   atomic.Pointer[storeRef]
	limiter *rate.Limiter
	wake    chan struct{}

	mu       sync.Mutex
	settings *Settings
	stores   map[string]understore.Store // by Dataset, for its current target
	planners map[string]*lineage.Planner // by CachePolicy
	turn     int                         // the planner whose turn it is
	// recorded are files whose checkpoint the master holds, by path, with their token: their
	// blocks are marked clean by the next round.
	recorded map[string]string
	retries  map[string]retry // by path and token
	// gone are the files, by path and token, that the master no longer has (forgotten for a
	// recomputation, or the Dataset deleted): their blocks wait for the sweeper, unread.
	gone map[string]bool
}

type storeRef struct{ Blocks }

// retry is when a file whose checkpoint failed is tried again.
type retry struct {
	failures int
	at       time.Time
	dataset  string // the file's Dataset: a new target of it makes the retry due at once
}

// New returns a Checkpointer. It checkpoints nothing until Attach gives it the tier store and
// Apply its settings.
func New(cfg Config) *Checkpointer {
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.MasterTimeout <= 0 {
		cfg.MasterTimeout = DefaultMasterTimeout
	}
	if cfg.OpenStore == nil {
		cfg.OpenStore = understore.Open
	}
	if cfg.Metrics == nil {
		cfg.Metrics = newMetrics()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	return &Checkpointer{
		cfg: cfg, log: cfg.Log, limiter: rate.NewLimiter(rate.Inf, throttle.Chunk), wake: make(chan struct{}, 1),
		stores: map[string]understore.Store{}, planners: map[string]*lineage.Planner{},
		recorded: map[string]string{}, retries: map[string]retry{}, gone: map[string]bool{},
	}
}

// Attach gives the checkpointer the tier store whose blocks it writes. The store's Persist
// callback is this checkpointer's, so the store is opened after New and attached once open.
func (c *Checkpointer) Attach(store Blocks) { c.store.Store(&storeRef{store}) }

func (c *Checkpointer) blocks() (Blocks, error) {
	ref := c.store.Load()
	if ref == nil {
		return nil, errors.New("the checkpointer has no tier store yet")
	}
	return ref.Blocks, nil
}

// Apply makes s the settings in force. A Dataset whose target changed gets a new under-store,
// and its files that failed are tried at once: the failure was most likely the old target's,
// and whoever fixed it should not wait out a backoff of up to lastRetry to see it work.
func (c *Checkpointer) Apply(s *Settings) {
	c.mu.Lock()
	targetChanged := func(name string) bool {
		old, now := c.settings.of(name), s.of(name)
		return now == nil || old == nil || !sameTarget(old.Target, now.Target)
	}
	for name := range c.stores {
		if targetChanged(name) {
			delete(c.stores, name)
		}
	}
	for key, r := range c.retries {
		if targetChanged(r.dataset) {
			delete(c.retries, key)
		}
	}
	c.settings = s
	c.mu.Unlock()
	c.log.Info("Applied the checkpoint settings", "datasets", s.Datasets())
	c.Wake()
}

func sameTarget(a, b Target) bool {
	if a.URI != b.URI || a.Endpoint != b.Endpoint || a.Region != b.Region || len(a.Credentials) != len(b.Credentials) {
		return false
	}
	for k, v := range a.Credentials {
		if b.Credentials[k] != v {
			return false
		}
	}
	return true
}

// Wake makes the background loop look at the files held now: one was sealed.
func (c *Checkpointer) Wake() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Checkpointer) current() *Settings {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.settings
}

// storeOf is the under-store of d's target, opened once.
func (c *Checkpointer) storeOf(ctx context.Context, d *dataset) (understore.Store, error) {
	c.mu.Lock()
	s := c.stores[d.Name]
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := c.cfg.OpenStore(ctx, d.Target.source())
	if err != nil {
		return nil, fmt.Errorf("opening the checkpoint target of Dataset %s: %w", d.Name, err)
	}
	c.mu.Lock()
	if c.settings.of(d.Name) == d {
		c.stores[d.Name] = s
	}
	c.mu.Unlock()
	return s, nil
}

// Run checkpoints in the background until ctx ends: whenever woken, and every Poll, it looks
// at the output files the store holds and writes the one the plan picks, until none is left.
func (c *Checkpointer) Run(ctx context.Context) {
	timer := time.NewTimer(c.cfg.Poll)
	defer timer.Stop()
	for {
		if worked := c.round(ctx); worked {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		timer.Reset(c.cfg.Poll)
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-timer.C:
		}
	}
}

// round looks at the files the store holds and checkpoints the ones the plan picks, one after
// the other, and reports whether it tried any. One look serves many files: a look lists every
// block not yet clean, so a look per file made a node holding n such blocks pay n for each file
// it checkpointed. What the look found may change meanwhile (a file deleted, dropped or written
// again), which the checkpoint of each file checks at the master anyway; files sealed meanwhile
// wait for the next look, at most roundBudget away, or once the plan has nothing left.
func (c *Checkpointer) round(ctx context.Context) bool {
	store, err := c.blocks()
	if err != nil {
		return false
	}
	settings := c.current()
	files, pending := heldFiles(store, settings)
	c.cfg.Metrics.pending.Set(float64(pending))
	now := c.cfg.Now()
	c.forgetUnheld(files)
	var candidates []*heldFile
	for _, f := range files {
		switch {
		case c.isRecorded(f.path, f.token):
			c.markClean(ctx, store, f)
		case !c.retryDue(f, now):
		default:
			candidates = append(candidates, f)
		}
	}
	deadline := now.Add(roundBudget)
	for tried := false; ; tried = true {
		if tried && (ctx.Err() != nil || c.current() != settings || !now.Before(deadline)) {
			return true // look again
		}
		p := c.plan(candidates, now)
		if p == nil {
			return tried
		}
		c.checkpointPicked(ctx, store, p)
		candidates = slices.DeleteFunc(candidates, func(f *heldFile) bool { return f == p.file })
		now = c.cfg.Now()
	}
}

// roundBudget is how long a round works through what one look at the store found before it
// looks again.
const roundBudget = time.Second

// checkpointPicked checkpoints the file the plan picked, and records how it went.
func (c *Checkpointer) checkpointPicked(ctx context.Context, store Blocks, p *pick) {
	start := c.cfg.Now()
	err := c.checkpoint(ctx, store, p.file, p.reason, true)
	if p.planner != nil {
		p.planner.Done(p.kind, c.cfg.Now().Sub(start))
	}
	c.settle(p.file, err)
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.Is(err, errGone) || errors.Is(err, errNotPublished) || errors.Is(err, errPartial):
		c.log.V(1).Info("Not checkpointing an output file now", "file", p.file.path, "why", err.Error())
	default:
		c.log.Error(err, "Checkpointing an output file failed; it stays in memory and is tried again",
			"file", p.file.path, "dataset", p.file.ds.Name, "reason", p.reason)
	}
}

// retryDue says whether f may be tried now: the master has it, and it never failed, or its
// retry is due.
func (c *Checkpointer) retryDue(f *heldFile, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, failed := c.retries[f.key()]
	return !c.gone[f.key()] && (!failed || !now.Before(r.at))
}

// forgetUnheld forgets what it knows of the files it no longer has to checkpoint (held are
// those it has to now: the store holds a block of theirs not yet clean, and their Dataset is
// checkpointed): whether the master still has them, and the retries of those that failed. A
// file deleted, or whose Dataset stopped being checkpointed, would otherwise stay in both
// for good.
func (c *Checkpointer) forgetUnheld(held []*heldFile) {
	keys := make(map[string]bool, len(held))
	for _, f := range held {
		keys[f.key()] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for key := range c.gone {
		if !keys[key] {
			delete(c.gone, key)
		}
	}
	for key := range c.retries {
		if !keys[key] {
			delete(c.retries, key)
		}
	}
}

// settle records how a checkpoint of f went, for its retries.
func (c *Checkpointer) settle(f *heldFile, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(err, errGone) {
		delete(c.retries, f.key())
		c.gone[f.key()] = true
		return
	}
	if err == nil {
		delete(c.retries, f.key())
		return
	}
	if errors.Is(err, errNotPublished) {
		// Being sealed: published within moments, no failure.
		c.retries[f.key()] = retry{at: c.cfg.Now().Add(unpublishedRetry)}
		return
	}
	if now := c.settings.of(f.ds.Name); now == nil || !sameTarget(now.Target, f.ds.Target) {
		// Tried against a target no longer in force: the new one is tried at once.
		delete(c.retries, f.key())
		return
	}
	r := c.retries[f.key()]
	r.dataset = f.ds.Name
	r.failures++
	r.at = c.cfg.Now().Add(min(firstRetry<<min(r.failures-1, 16), lastRetry))
	c.retries[f.key()] = r
}

func (c *Checkpointer) isRecorded(path, token string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recorded[path] == token
}

// errGone means the file was forgotten or replaced at the master: its blocks are another
// version's, which nobody reads, and the sweeper removes them.
var errGone = errors.New("the master no longer has this version of the file")

// errPartial means this node holds only some of a file's blocks (replicas of them): the node
// that holds it whole checkpoints it.
var errPartial = errors.New("this node holds copies of only some of the file's blocks")

// errNotPublished means the master has no file of this path yet: an output mount stores a
// file's blocks before it publishes the file, so a young file is tried again later.
var errNotPublished = errors.New("the file is not published at the master yet")

// errCheckpointed means the master records this version's checkpoint already: its blocks are
// marked clean, and there is nothing to write.
var errCheckpointed = errors.New("checkpointed already")

// skipped is what a checkpoint that found nothing to write returns.
func skipped(err error) error {
	if errors.Is(err, errCheckpointed) {
		return nil
	}
	return err
}

// toWrite asks the master whether this version of f is one to write now, and returns its
// record if it is.
func (c *Checkpointer) toWrite(ctx context.Context, store Blocks, f *heldFile) (*masterpb.File, error) {
	mctx, cancel := context.WithTimeout(ctx, c.cfg.MasterTimeout)
	mf, err := c.cfg.Master.GetFile(mctx, &masterpb.GetFileRequest{Path: f.path})
	cancel()
	switch {
	case status.Code(err) == codes.NotFound && c.cfg.Now().Sub(f.created) < publishGrace:
		return nil, errNotPublished
	case status.Code(err) == codes.NotFound:
		return nil, errGone
	case err != nil:
		return nil, fmt.Errorf("reading the record of %s at the master: %w", f.path, err)
	case mf.GetClientToken() != f.token:
		return nil, errGone
	case mf.GetAttempt() != "":
		// An attempt of its writer not settled yet: written when its pod succeeds, never if it
		// fails (its files are discarded, and must not be left in the under-store).
		return nil, errNotPublished
	case mf.GetCheckpointState() == masterpb.CheckpointState_CHECKPOINT_STATE_DONE:
		c.markClean(ctx, store, f)
		return nil, errCheckpointed
	}
	return mf, nil
}

// publishGrace is how long after its blocks were stored a file the master does not know is
// taken for one being sealed, not for one forgotten: the sweeper's own grace.
const publishGrace = 10 * time.Minute

// landTries is how many times a checkpoint is written when another writer's upload of the same
// path keeps landing first (understore.ErrChanged): each try looks at the object and the
// master's record again.
const landTries = 3

// checkpoint writes the file f, which this node holds, to its Dataset's target, records it at
// the master, and marks its blocks clean. Background writes (limited) keep to the Dataset's
// bandwidth cap.
func (c *Checkpointer) checkpoint(ctx context.Context, store Blocks, f *heldFile, reason string, limited bool) error {
	target, err := c.storeOf(ctx, f.ds)
	if err != nil {
		return err
	}
	for try := 1; ; try++ {
		err := c.checkpointOnce(ctx, store, target, f, reason, limited)
		if !errors.Is(err, understore.ErrChanged) || try == landTries {
			return err
		}
	}
}

// checkpointOnce is one try of checkpoint. The master is asked first whether this version is
// one to write, so that a file that is not costs the under-store nothing. Then the object the
// upload may replace is looked at, and the master asked again: an upload of an older version
// never lands on a newer one, since a newer version's upload that lands after the look fails
// this one (the object changed, ErrChanged), and one that landed before it was of a version
// published before it, so the master's second answer says this version is gone.
func (c *Checkpointer) checkpointOnce(ctx context.Context, store Blocks, target understore.Store, f *heldFile, reason string, limited bool) error {
	if _, err := c.toWrite(ctx, store, f); err != nil {
		return skipped(err)
	}
	pre, err := understore.Current(ctx, target, f.ds.rel(f.path))
	if err != nil {
		c.cfg.Metrics.failures.WithLabelValues(reason).Inc()
		return fmt.Errorf("looking at the checkpoint of %s before writing it: %w", f.path, err)
	}
	mf, err := c.toWrite(ctx, store, f)
	if err != nil {
		return skipped(err)
	}
	ids, err := f.blockIDs(len(mf.GetBlockIds()))
	if err != nil {
		return err
	}
	bandwidth := rate.Inf
	if limited && f.ds.BandwidthLimit > 0 {
		bandwidth = rate.Limit(f.ds.BandwidthLimit)
	}
	start := c.cfg.Now()
	version, err := c.write(ctx, store, target, f.ds, f.path, ids, mf.GetSize(), bandwidth, pre)
	if err != nil {
		c.cfg.Metrics.failures.WithLabelValues(reason).Inc()
		return err
	}
	if err := c.record(ctx, f.ds, f.path, f.token, version); err != nil {
		c.cfg.Metrics.failures.WithLabelValues(reason).Inc()
		return err
	}
	c.cfg.Metrics.files.WithLabelValues(reason).Inc()
	c.cfg.Metrics.bytes.WithLabelValues(reason).Add(float64(mf.GetSize()))
	c.cfg.Metrics.duration.WithLabelValues(reason).Observe(c.cfg.Now().Sub(start).Seconds())
	c.log.V(1).Info("Checkpointed an output file", "file", f.path, "bytes", mf.GetSize(), "reason", reason,
		"seconds", c.cfg.Now().Sub(start).Seconds())
	c.markClean(ctx, store, f)
	return nil
}

// write streams the blocks ids, size bytes in all, to the file path's place in d's target, if
// the object there is still what pre says when it lands, and returns the version written.
func (c *Checkpointer) write(ctx context.Context, store Blocks, target understore.Store, d *dataset, path string, ids []string,
	size int64, bandwidth rate.Limit, pre understore.Precondition,
) (string, error) {
	r := &blocksReader{ctx: ctx, store: store, ids: ids}
	defer r.close()
	var body io.Reader = r
	if bandwidth != rate.Inf {
		// Background writes take turns (one at a time), so one limiter serves them all.
		c.limiter.SetLimit(bandwidth)
		body = &throttle.Reader{Ctx: ctx, R: r, Limiter: c.limiter}
	}
	version, err := target.Write(ctx, d.rel(path), body, size, pre)
	if err != nil {
		return "", fmt.Errorf("checkpointing %s: %w", path, err)
	}
	return version, nil
}

// record tells the master that the version token of path is checkpointed, as the object's
// version written. The master refuses if the file has another version by now, and the write is
// then forgotten (errGone).
func (c *Checkpointer) record(ctx context.Context, d *dataset, path, token, written string) error {
	mctx, cancel := context.WithTimeout(ctx, c.cfg.MasterTimeout)
	defer cancel()
	_, err := c.cfg.Master.CheckpointFile(mctx, &masterpb.CheckpointFileRequest{
		Path: path, State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: d.Target.objectURI(d.rel(path)), ClientToken: token,
		Version: written,
	})
	switch {
	case status.Code(err) == codes.NotFound || status.Code(err) == codes.FailedPrecondition:
		return errGone
	case err != nil:
		return fmt.Errorf("recording the checkpoint of %s at the master: %w", path, err)
	}
	c.mu.Lock()
	c.recorded[path] = token
	c.mu.Unlock()
	return nil
}

// markClean tells the tier store that f's blocks have a copy in the under-store, so that they
// may leave the last tier without a checkpoint first.
func (c *Checkpointer) markClean(ctx context.Context, store Blocks, f *heldFile) {
	var failed bool
	for _, b := range f.blocks {
		if b.Clean {
			continue
		}
		if err := store.SetClean(ctx, b.ID); err != nil && !errors.Is(err, tierstore.ErrNotFound) {
			failed = true
			c.log.Error(err, "Marking a checkpointed block clean; the next round tries again", "block", b.ID, "file", f.path)
		}
	}
	if !failed {
		c.mu.Lock()
		if c.recorded[f.path] == f.token {
			delete(c.recorded, f.path)
		}
		c.mu.Unlock()
	}
}

// heldFile is an output file whose blocks this node holds.
type heldFile struct {
	ds          *dataset
	path, token string
	// blocks are the blocks of the file held here, clean or not, by index.
	blocks  []tierstore.BlockInfo
	indexes []int64
	created time.Time
	reads   uint64
}

func (f *heldFile) key() string { return fileKey(f.path, f.token) }

// fileKey names a version of a file: its path and token.
func fileKey(path, token string) string { return path + "\x00" + token }

// blockIDs are the ids of the file's n blocks, in order, if this node holds all of them.
func (f *heldFile) blockIDs(n int) ([]string, error) {
	if len(f.blocks) != n {
		return nil, fmt.Errorf("%s has %d blocks and this node holds %d of them (%w): only a node that holds all checkpoints it",
			f.path, n, len(f.blocks), errPartial)
	}
	ids := make([]string, n)
	for i, b := range f.blocks {
		if f.indexes[i] != int64(i) {
			return nil, fmt.Errorf("%s: block %d is missing on this node (%w)", f.path, i, errPartial)
		}
		ids[i] = b.ID
	}
	return ids, nil
}

// heldFiles groups by file the output blocks store holds of the files to checkpoint: those of
// Datasets with settings that have a block not yet clean (not yet checkpointed, as far as the
// store knows). pending is the size of every output block not clean, with settings or not.
//
// It looks at the blocks not clean only, a few among the many cached blocks a node holds, and
// finds the clean blocks of a file to checkpoint by their ids (blockindex.OutputBlockID), from
// the first on, until one is missing: a file held whole is found whole, one held in part is
// left to the node that holds it whole (blockIDs).
func heldFiles(store Blocks, settings *Settings) (files []*heldFile, pending int64) {
	byKey := map[string]*heldFile{}
	for _, b := range store.UncleanBlocks() {
		o, ok := outputOrigin(b.Origin)
		if !ok {
			continue
		}
		pending += b.Size
		d := settings.of(o.GetDataset())
		if d == nil {
			continue
		}
		key := fileKey(o.GetPath(), o.GetFileToken())
		f := byKey[key]
		if f == nil {
			f = &heldFile{ds: d, path: o.GetPath(), token: o.GetFileToken(), created: b.Created}
			byKey[key] = f
			files = append(files, f)
		}
		f.add(b, o.GetIndex())
	}
	for _, f := range files {
		f.addClean(store)
		sortByIndex(f)
	}
	slices.SortFunc(files, func(a, b *heldFile) int { return strings.Compare(a.key(), b.key()) })
	return files, pending
}

// add takes block b, the file's block index, into f.
func (f *heldFile) add(b tierstore.BlockInfo, index int64) {
	f.blocks = append(f.blocks, b)
	f.indexes = append(f.indexes, index)
	f.created = minTime(f.created, b.Created)
	f.reads = max(f.reads, b.Accesses)
}

// addClean adds the file's clean blocks that store holds (its others are taken already, from
// the blocks not clean).
func (f *heldFile) addClean(store Blocks) {
	f.eachHeld(store, func(b tierstore.BlockInfo, index int64) {
		if b.Clean {
			f.add(b, index)
		}
	})
}

// eachHeld calls take with each block of f's file that store holds, by id, from the first block
// on, until one is missing or is another file's.
func (f *heldFile) eachHeld(store Blocks, take func(b tierstore.BlockInfo, index int64)) {
	for index := int64(0); ; index++ {
		b, err := store.Info(blockindex.OutputBlockID(f.token, index))
		if err != nil {
			return
		}
		o, ok := outputOrigin(b.Origin)
		if !ok || fileKey(o.GetPath(), o.GetFileToken()) != f.key() || o.GetIndex() != index {
			return
		}
		take(b, index)
	}
}

func sortByIndex(f *heldFile) {
	order := make([]int, len(f.blocks))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(f.indexes[a] - f.indexes[b]) })
	blocks, indexes := make([]tierstore.BlockInfo, len(order)), make([]int64, len(order))
	for i, j := range order {
		blocks[i], indexes[i] = f.blocks[j], f.indexes[j]
	}
	f.blocks, f.indexes = blocks, indexes
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// outputOrigin decodes the origin of a block an output mount sealed (it carries the file's
// token); ok is false for any other block.
func outputOrigin(raw []byte) (*workerpb.BlockOrigin, bool) {
	if len(raw) == 0 {
		return nil, false
	}
	var o workerpb.BlockOrigin
	if err := proto.Unmarshal(raw, &o); err != nil || o.GetFileToken() == "" || o.GetPath() == "" {
		return nil, false
	}
	return &o, true
}

// blocksReader reads blocks of the tier store one after the other, each checked against its
// checksum at its end, opening each only when the one before is read.
type blocksReader struct {
	ctx   context.Context
	store Blocks
	ids   []string
	cur   io.ReadCloser
}

func (r *blocksReader) Read(p []byte) (int, error) {
	for {
		if r.cur == nil {
			if len(r.ids) == 0 {
				return 0, io.EOF
			}
			f, _, err := r.store.OpenVerified(r.ctx, r.ids[0])
			if err != nil {
				return 0, fmt.Errorf("opening block %s: %w", r.ids[0], err)
			}
			r.cur, r.ids = f, r.ids[1:]
		}
		n, err := r.cur.Read(p)
		if errors.Is(err, io.EOF) {
			_ = r.cur.Close()
			r.cur = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (r *blocksReader) close() {
	if r.cur != nil {
		_ = r.cur.Close()
	}
}
