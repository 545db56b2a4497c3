package tierstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/eviction"
)

// BlockInfo describes a stored block.
type BlockInfo struct {
	ID         string
	Tier       string
	Dir        string
	Size       int64
	Checksum   uint32
	Clean      bool
	Pinned     bool
	Accesses   uint64
	LastAccess time.Time
	Created    time.Time
	// Origin is PutOptions.Origin, as stored.
	Origin []byte
}

// PutOptions qualify a new block.
type PutOptions struct {
	// Clean: a copy exists elsewhere (the block was read from the under-store, or is already
	// checkpointed or replicated), so it may be dropped without persisting it first.
	Clean bool
	// Pinned blocks are never evicted.
	Pinned bool
	// Origin is kept with the block in the index and returned in BlockInfo, never read by the
	// store: what the block is part of, in the caller's terms, so that a restarted worker can
	// tell others what it still has.
	Origin []byte
	// Checksum, when set, is the CRC-32C of the block's bytes as the caller took it while it
	// wrote them. Adopt then links the file in without reading it (the caller vouches for it:
	// a wrong one makes every later read of the block fail as corrupt); Put, and Adopt when it
	// must copy, refuse bytes that do not match it (ErrCorrupt).
	Checksum *uint32
}

// TierStats is the state of one tier.
type TierStats struct {
	Name   string
	Medium datav1alpha1.Medium
	// Quota, and the watermarks in bytes.
	Quota, High, Low int64
	// Used counts stored blocks and space reserved for writes and moves under way.
	Used int64
	// Blocks is the number of blocks stored, Pinned the number of them that are pinned.
	Blocks, Pinned int
	// Promotions counts blocks moved up into this tier, Demotions blocks moved down out of
	// it, Evictions blocks dropped from it, Persisted the dropped blocks that had to be
	// persisted first, Corrupt the blocks found corrupt in it (at start, on read or on a move).
	Promotions, Demotions, Evictions, Persisted, Corrupt uint64
	// Datasets are the bytes of each Dataset the tier holds (see Config.DatasetOf).
	Datasets map[string]int64
}

// Store is a node's tiered block store. Its methods are safe for concurrent use.
//
// Locks, always taken in this order: evictMu serialises the making of room (and with it every
// move between tiers); a per-id stripe lock serialises the index writes of one block (commit of
// a write or move, delete, pin); mu guards the in-memory state and is held only briefly, never
// across I/O, so reads go on while blocks are written or moved.
type Store struct {
	cfg      Config
	log      logr.Logger
	idx      *blockindex.Index
	tiers    []*tier
	byName   map[string]*tier
	recovery blockindex.Report
	seed     maphash.Seed
	wake     chan struct{} // a promotion was queued
	done     chan struct{} // closed by Close, to stop Run

	evictMu sync.Mutex
	stripes [64]sync.Mutex

	mu     sync.Mutex
	rules  map[string]DatasetRules // by Dataset
	blocks map[string]*block
	// unclean are the blocks of blocks that are not clean (UncleanBlocks): outputs with no copy
	// elsewhere yet, a few among the many cached copies a node holds.
	unclean map[string]*block
	// unflushed are the blocks read since their access statistics were last written to the
	// index, which flush writes: the blocks read in a minute, not every block the node holds.
	unflushed map[string]*block
	pending   map[string]bool // ids being written
	queue     map[string]bool // ids waiting for promotion
	closed    bool
	ops       sync.WaitGroup

	// indexSyncs counts the index's syncs for writes (commit).
	indexSyncs atomic.Int64
}

type tier struct {
	Tier
	index     int
	high, low int64
	policy    eviction.Policy
	dirs      []*dir

	// Guarded by Store.mu.
	shares map[string]*share // by Dataset

	// Guarded by Store.mu.
	used                                                 int64
	blocks                                               int
	promotions, demotions, evictions, persisted, corrupt uint64
}

type dir struct {
	path string
	// volatile: the directory is in memory (tmpfs, ramfs), so its blocks never outlive the
	// node's kernel. Syncing their writes buys nothing: the only failure it guards against, a
	// crash of the kernel, takes the blocks with it, while a crash of the worker process loses
	// neither a file written nor an index entry (BadgerDB's log is a shared mapping, which the
	// kernel writes out whoever dies).
	volatile bool
	used     int64 // guarded by Store.mu
}

// block is one stored block. Its location (tier, dir) changes only with both evictMu and mu
// held, so holders of either may read it; everything else is guarded by mu.
type block struct {
	id       string
	tier     *tier
	dir      *dir
	size     int64
	checksum uint32
	created  time.Time
	origin   []byte
	dataset  string // Config.DatasetOf(origin)

	clean, pinned bool
	accesses      uint64
	lastAccess    time.Time
	tierReads     int  // reads since the block arrived in its tier
	moving        bool // a move or drop is under way
	queued        bool // waiting for promotion
}

func (b *block) path() string { return blockindex.BlockPath(b.dir.path, b.id) }

func (b *block) info() BlockInfo {
	return BlockInfo{ID: b.id, Tier: b.tier.Name, Dir: b.dir.path, Size: b.size, Checksum: b.checksum, Clean: b.clean,
		Pinned: b.pinned, Accesses: b.accesses, LastAccess: b.lastAccess, Created: b.created, Origin: b.origin}
}

func (b *block) entry() blockindex.Entry {
	return blockindex.Entry{ID: b.id, Tier: b.tier.Name, Dir: b.dir.path, Size: b.size, Checksum: b.checksum, Clean: b.clean,
		Pinned: b.pinned, Accesses: b.accesses, LastAccess: b.lastAccess, Created: b.created, Origin: b.origin}
}

// Open opens the store: it creates missing tier directories, opens the index, reconciles it
// with the directories (see blockindex.Reconcile) and loads what survived.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		cfg:       cfg,
		log:       cfg.Log,
		byName:    make(map[string]*tier),
		seed:      maphash.MakeSeed(),
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		blocks:    make(map[string]*block),
		unclean:   make(map[string]*block),
		unflushed: make(map[string]*block),
		pending:   make(map[string]bool),
		queue:     make(map[string]bool),
	}
	var layout []blockindex.TierLayout
	for i, tc := range cfg.Tiers {
		p, err := eviction.New(cfg.Eviction)
		if err != nil {
			return nil, err
		}
		t := &tier{Tier: tc, index: i, policy: p, shares: make(map[string]*share),
			high: int64(tc.High * float64(tc.Quota)), low: int64(tc.Low * float64(tc.Quota))}
		for _, d := range tc.Dirs {
			if err := os.MkdirAll(d, 0o750); err != nil {
				return nil, fmt.Errorf("creating directory %s of tier %s: %w", d, tc.Name, err)
			}
			volatile, err := inMemory(d)
			if err != nil {
				return nil, fmt.Errorf("directory %s of tier %s: %w", d, tc.Name, err)
			}
			t.dirs = append(t.dirs, &dir{path: d, volatile: volatile})
		}
		s.tiers = append(s.tiers, t)
		s.byName[tc.Name] = t
		layout = append(layout, blockindex.TierLayout{Name: tc.Name, Volatile: tc.Medium == datav1alpha1.MediumMemory, Dirs: tc.Dirs})
	}
	if err := os.MkdirAll(cfg.IndexDir, 0o750); err != nil {
		return nil, fmt.Errorf("creating index directory %s: %w", cfg.IndexDir, err)
	}
	idx, err := blockindex.Open(cfg.IndexDir, cfg.Log.WithName("index"))
	if err != nil {
		return nil, err
	}
	s.idx = idx
	rep, err := idx.Reconcile(ctx, layout, cfg.VerifyConcurrency)
	if err != nil {
		_ = idx.Close()
		return nil, fmt.Errorf("recovering blocks from the tier directories: %w", err)
	}
	s.recovery = rep
	s.load(rep)
	return s, nil
}

// load adds the blocks that survived reconciliation. They enter their policies least recently
// used first, so that LRU order survives a restart; frequencies start again from one, since
// the policies keep logical clocks that are not persisted.
func (s *Store) load(rep blockindex.Report) {
	for _, f := range rep.Findings {
		if t := s.byName[f.Tier]; t != nil && (f.Problem == blockindex.ProblemChecksumMismatch || f.Problem == blockindex.ProblemSizeMismatch) {
			t.corrupt++
		}
		if f.Expected {
			s.log.V(1).Info("dropped block on start", "problem", f.Problem, "path", f.Path, "detail", f.Detail)
		} else {
			s.log.Error(nil, "dropped block on start", "problem", f.Problem, "path", f.Path, "detail", f.Detail)
		}
	}
	kept := slices.Clone(rep.Kept)
	slices.SortStableFunc(kept, func(a, b blockindex.Entry) int { return a.LastAccess.Compare(b.LastAccess) })
	for _, e := range kept {
		t := s.byName[e.Tier]
		d := t.dirByPath(e.Dir)
		if d == nil {
			continue // Reconcile only keeps blocks in configured directories.
		}
		b := &block{id: e.ID, tier: t, dir: d, size: e.Size, checksum: e.Checksum, created: e.Created, origin: e.Origin,
			dataset: s.datasetOf(e.Origin), clean: e.Clean, pinned: e.Pinned, accesses: e.Accesses, lastAccess: e.LastAccess}
		s.addLocked(b)
		t.used += e.Size
		d.used += e.Size
		t.enter(b)
	}
	s.log.Info("tier store ready", "blocks", len(kept), "dropped", len(rep.Findings))
}

func (t *tier) dirByPath(p string) *dir {
	for _, d := range t.dirs {
		if d.path == p {
			return d
		}
	}
	return nil
}

// Recovery is what Open found when it reconciled the index with the tier directories.
func (s *Store) Recovery() blockindex.Report { return s.recovery }

// Tiers returns the tier names, fastest first.
func (s *Store) Tiers() []string {
	out := make([]string, len(s.tiers))
	for i, t := range s.tiers {
		out[i] = t.Name
	}
	return out
}

// Stats returns the state of every tier, fastest first.
func (s *Store) Stats() []TierStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TierStats, len(s.tiers))
	for i, t := range s.tiers {
		// The tier's eviction policy tracks its pinned blocks already, as it must skip them.
		out[i] = TierStats{Name: t.Name, Medium: t.Medium, Quota: t.Quota, High: t.high, Low: t.low, Used: t.used,
			Blocks: t.blocks, Pinned: t.policy.Pinned(), Datasets: t.datasetBytes(),
			Promotions: t.promotions, Demotions: t.demotions, Evictions: t.evictions, Persisted: t.persisted, Corrupt: t.corrupt}
	}
	return out
}

// enter registers an operation, so that Close waits for it; every public method that touches
// the disk or the index calls it.
func (s *Store) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.ops.Add(1)
	return nil
}

func (s *Store) exit() { s.ops.Done() }

// Close waits for operations under way, writes the access statistics to the index and closes it.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	s.ops.Wait()
	ferr := s.flush()
	if err := s.idx.Close(); err != nil {
		return err
	}
	return ferr
}

// stripe is the lock that serialises the index writes of one block id.
func (s *Store) stripe(id string) *sync.Mutex {
	return &s.stripes[maphash.String(s.seed, id)%uint64(len(s.stripes))]
}

// FlushStats writes the access statistics gathered since the last flush to the index, so that
// a restarted worker ranks its surviving blocks as before. Reads do not write the index
// themselves: a synced write per read would cost more than the read.
func (s *Store) FlushStats(ctx context.Context) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("flushing access statistics: %w", err)
	}
	return s.flush()
}

func (s *Store) flush() error {
	groups := make(map[*sync.Mutex][]string)
	s.mu.Lock()
	for id := range s.unflushed {
		l := s.stripe(id)
		groups[l] = append(groups[l], id)
	}
	s.mu.Unlock()
	for l, ids := range groups {
		// Under the stripe lock no commit, delete or pin of these blocks can slip in between
		// the snapshot and the write and be overwritten by an older entry.
		l.Lock()
		var es []blockindex.Entry
		var flushed []*block
		s.mu.Lock()
		for _, id := range ids {
			if b := s.unflushed[id]; b != nil && s.blocks[id] == b {
				delete(s.unflushed, id)
				es = append(es, b.entry())
				flushed = append(flushed, b)
			}
		}
		s.mu.Unlock()
		err := s.idx.PutMany(es)
		if err != nil {
			s.mu.Lock()
			for _, b := range flushed {
				if s.blocks[b.id] == b {
					s.unflushed[b.id] = b
				}
			}
			s.mu.Unlock()
		}
		l.Unlock()
		if err != nil {
			return fmt.Errorf("flushing access statistics: %w", err)
		}
	}
	return nil
}

// Run carries out queued promotions and flushes access statistics every FlushInterval, until
// ctx ends or the store is closed. The caller owns the goroutine that runs it; without Run, blocks are never
// promoted on their own (Promote and PromotePending still work).
func (s *Store) Run(ctx context.Context) error {
	tick := time.NewTicker(s.cfg.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.done:
			return nil
		case <-s.wake:
			_, err := s.PromotePending(ctx)
			if errors.Is(err, ErrClosed) {
				return nil
			}
			if err != nil && ctx.Err() == nil {
				s.log.Error(err, "promoting blocks")
			}
		case <-tick.C:
			err := s.FlushStats(ctx)
			if errors.Is(err, ErrClosed) {
				return nil
			}
			if err != nil && ctx.Err() == nil {
				s.log.Error(err, "flushing access statistics")
			}
		}
	}
}
