package tierstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"slices"

	"github.com/strata-cache/strata/cacheworker/blockindex"
)

// room says how far makeRoom may go.
type room struct {
	// forPromotion: free only until the block fits under the high watermark, never past it,
	// and evict only blocks read fewer times in their tier than colderThan was in its own. A
	// promotion is an optimisation; it must not push out more than it needs, nor hotter data.
	forPromotion bool
	colderThan   *block
}

// reserve takes need bytes of t's quota for a write of a block of dataset. Below the high
// watermarks (the tier's, and the Dataset's share of it) that is all; above them, it makes room
// under evictMu.
func (s *Store) reserve(ctx context.Context, t *tier, need int64, dataset string) error {
	if !s.overShare(t, dataset, need) && s.tryReserve(t, need, t.high) {
		return nil
	}
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	if err := s.makeShareRoom(ctx, t, dataset, need); err != nil {
		return err
	}
	return s.makeRoom(ctx, t, need, room{})
}

// overShare says whether need more bytes of dataset in t would pass its share's high watermark.
func (s *Store) overShare(t *tier, dataset string, need int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.overShareLocked(t, dataset, need)
}

// makeShareRoom moves dataset's own blocks out of t, coldest first by its policy, when need
// more bytes would pass its share's high watermark, until they fit under its low one. When no
// more of its blocks can leave, the write goes ahead all the same: a share bounds what a Dataset
// keeps in a tier, it is no reason to fail a write. evictMu must be held.
func (s *Store) makeShareRoom(ctx context.Context, t *tier, dataset string, need int64) error {
	if !s.overShare(t, dataset, need) {
		return nil
	}
	failed := make(map[string]bool)
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("making room for Dataset %s in tier %s: %w", dataset, t.Name, err)
		}
		s.mu.Lock()
		_, low, _ := s.shareLimits(t, dataset)
		sh := t.shareOf(dataset)
		var v *block
		if sh.used+need > low && sh.policy != nil {
			if id, ok := sh.policy.Victim(func(id string) bool { b := s.blocks[id]; return b == nil || b.moving || failed[id] }); ok {
				v = s.blocks[id]
			}
		}
		if v == nil {
			s.mu.Unlock()
			return nil
		}
		stayed, err := s.evictLocked(ctx, v)
		if err != nil {
			return fmt.Errorf("making room for Dataset %s in tier %s: %w", dataset, t.Name, err)
		}
		if stayed != nil {
			failed[v.id] = true
			s.log.V(1).Info("block cannot leave its tier", "block", v.id, "tier", t.Name, "dataset", dataset, "reason", stayed.Error())
		}
	}
}

// evictLocked evicts v, found under mu, which it releases on the way. It returns why v could
// not leave (nil when it left, or was gone already), or the error that ended ctx.
func (s *Store) evictLocked(ctx context.Context, v *block) (stayed, err error) {
	v.moving = true
	s.mu.Unlock()

	err = s.evict(ctx, v)

	s.mu.Lock()
	v.moving = false
	s.mu.Unlock()
	switch {
	case err == nil || errors.Is(err, errGone):
		return nil, nil
	case ctx.Err() != nil:
		return nil, err
	default:
		return err, nil
	}
}

// tryReserve takes need bytes of t if that keeps it at or under limit.
func (s *Store) tryReserve(t *tier, need, limit int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.used+need > limit {
		return false
	}
	t.used += need
	return true
}

// release gives back a reservation that was not used.
func (s *Store) release(t *tier, d *dir, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.used -= n
	d.used -= n
}

// pickDir chooses the emptiest directory of t for n bytes and counts them there at once, so
// that concurrent writers spread over the directories too.
func (s *Store) pickDir(t *tier, n int64) *dir {
	return s.pickDirOf(t, n, t.dirs)
}

// pickDirOf is pickDir among some of t's directories: the emptiest of dirs, or of all when
// dirs is empty.
func (s *Store) pickDirOf(t *tier, n int64, dirs []*dir) *dir {
	if len(dirs) == 0 {
		dirs = t.dirs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	best := dirs[0]
	for _, d := range dirs[1:] {
		if d.used < best.used {
			best = d
		}
	}
	best.used += n
	return best
}

// makeRoom reserves need bytes in t. If that would pass the high watermark it first evicts
// blocks, coldest first, until t is back at its low watermark with need reserved. When no
// more blocks can leave, it still succeeds if need fits under the quota (the high watermark
// for promotions); otherwise it fails with a *TierFullError and has lost nothing.
// evictMu must be held.
func (s *Store) makeRoom(ctx context.Context, t *tier, need int64, rm room) error {
	if need > t.Quota {
		return &TierFullError{Tier: t.Name, Need: need, Used: s.usedOf(t), Quota: t.Quota,
			Reason: fmt.Sprintf("the block is larger than the tier's whole quota of %d bytes", t.Quota)}
	}
	if s.tryReserve(t, need, t.high) {
		return nil
	}
	target, limit := t.low, t.Quota
	if rm.forPromotion {
		target, limit = t.high, t.high
	}
	failed := make(map[string]bool)
	var firstFailure error
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("making room in tier %s: %w", t.Name, err)
		}
		s.mu.Lock()
		if t.used+need <= target {
			t.used += need
			s.mu.Unlock()
			return nil
		}
		v := s.victimLocked(t, failed, rm.colderThan)
		if v == nil {
			if t.used+need <= limit {
				t.used += need
				s.mu.Unlock()
				return nil
			}
			used := t.used
			s.mu.Unlock()
			return &TierFullError{Tier: t.Name, Need: need, Used: used, Quota: t.Quota, Reason: fullReason(len(failed), firstFailure, rm)}
		}
		stayed, err := s.evictLocked(ctx, v)
		if err != nil {
			return fmt.Errorf("making room in tier %s: %w", t.Name, err)
		}
		if stayed != nil {
			failed[v.id] = true
			if firstFailure == nil {
				firstFailure = stayed
			}
			s.log.V(1).Info("block cannot leave its tier", "block", v.id, "tier", t.Name, "reason", stayed.Error())
		}
	}
}

func fullReason(failed int, first error, rm room) string {
	switch {
	case failed > 0:
		return fmt.Sprintf("%d block(s) could not leave it, the first because: %v", failed, first)
	case rm.colderThan != nil:
		return "no block in it has been read less often than the block to promote"
	default:
		return "every block in it is pinned or already on the move"
	}
}

func (s *Store) usedOf(t *tier) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return t.used
}

// victimLocked is the block of t that leaves next, of those that may leave now: the coldest by
// the tier's policy, exchanged for the coldest of the same Dataset by the Dataset's own policy
// when it has one (see DatasetRules). Datasets ranked by the lineage graph (MRD, Kariz) come
// first when no pipeline step will read them again, and when the tier picks one of them, the one
// whose next use is furthest pays instead. mu must be held.
func (s *Store) victimLocked(t *tier, failed map[string]bool, colderThan *block) *block {
	skip := func(id string) bool {
		b := s.blocks[id]
		return b == nil || b.moving || failed[id] || (colderThan != nil && b.tierReads >= colderThan.tierReads)
	}
	if v := s.furthestUseLocked(t, skip, math.MaxInt); v != nil {
		return v
	}
	id, ok := t.policy.Victim(skip)
	if !ok {
		return nil
	}
	dataset := s.blocks[id].dataset
	if _, ok := s.rules[dataset].mrd(); ok {
		if v := s.furthestUseLocked(t, skip, 0); v != nil {
			return v
		}
	}
	if sh := t.shares[dataset]; sh != nil && sh.policy != nil {
		if own, ok := sh.policy.Victim(skip); ok {
			id = own
		}
	}
	return s.blocks[id]
}

// furthestUseLocked is the coldest block in t, by its Dataset's own ranking, of the MRD
// Dataset whose next use is furthest, of those whose rank is at least atLeast; nil when none
// has a block that may leave. Ties go to the Dataset of the lower name, so that the choice
// never depends on the order of a map. mu must be held.
func (s *Store) furthestUseLocked(t *tier, skip func(string) bool, atLeast int) *block {
	var victim string
	bestRank, bestName := -1, ""
	for name, sh := range t.shares {
		rank, ok := s.rules[name].mrd()
		if !ok || sh.policy == nil || rank < atLeast || rank < bestRank || (rank == bestRank && name > bestName) {
			continue
		}
		if id, ok := sh.policy.Victim(skip); ok {
			victim, bestRank, bestName = id, rank, name
		}
	}
	if victim == "" {
		return nil
	}
	return s.blocks[victim]
}

// evict moves b one tier down or, from the last tier or when the tiers below are full,
// drops it if that loses nothing. evictMu must be held and b marked moving.
func (s *Store) evict(ctx context.Context, b *block) error {
	from := b.tier
	if from.index+1 == len(s.tiers) {
		return s.drop(ctx, b)
	}
	to := s.tiers[from.index+1]
	// The Dataset's share of the tier below bounds it too: its own coldest blocks there go
	// further down first.
	if err := s.makeShareRoom(ctx, to, b.dataset, b.size); err != nil {
		return err
	}
	err := s.move(ctx, b, to, room{})
	if err == nil {
		s.mu.Lock()
		from.demotions++
		s.mu.Unlock()
		return nil
	}
	if !errors.Is(err, ErrTierFull) {
		return err
	}
	if derr := s.drop(ctx, b); derr != nil {
		if errors.Is(derr, errGone) {
			return derr
		}
		return fmt.Errorf("demoting it: %w; dropping it instead: %w", err, derr)
	}
	return nil
}

// move copies b into tier to, checking its checksum on the way, commits the new location in
// the index and removes the old file. evictMu must be held and b marked moving.
func (s *Store) move(ctx context.Context, b *block, to *tier, rm room) error {
	from, fromDir := b.tier, b.dir
	if err := s.makeRoom(ctx, to, b.size, rm); err != nil {
		return fmt.Errorf("moving block %s from tier %s to tier %s: %w", b.id, from.Name, to.Name, err)
	}
	d := s.pickDir(to, b.size)
	oldPath := b.path()
	newPath := blockindex.BlockPath(d.path, b.id)
	fail := func(err error) error {
		s.release(to, d, b.size)
		if errors.Is(err, fs.ErrNotExist) && !s.alive(b) {
			return errGone
		}
		if errors.Is(err, ErrCorrupt) {
			// The space is free, so eviction carries on (errGone); an explicit Move reports why.
			s.quarantine(b, oldPath, err)
			return fmt.Errorf("moving block %s: %w, removed: %w", b.id, err, errGone)
		}
		return fmt.Errorf("moving block %s from tier %s to tier %s: %w", b.id, from.Name, to.Name, err)
	}

	src, err := openBlock(oldPath)
	if err != nil {
		return fail(err)
	}
	s.mu.Lock()
	durable := !b.clean && !d.volatile
	s.mu.Unlock()
	_, err = writeFile(ctx, d.path, b.id, src, b.size, &b.checksum, durable)
	_ = src.Close()
	if err != nil {
		return fail(err)
	}

	l := s.stripe(b.id)
	l.Lock()
	defer l.Unlock()
	s.mu.Lock()
	alive := s.blocks[b.id] == b
	shadow := *b
	s.mu.Unlock()
	if !alive {
		_ = os.Remove(newPath)
		s.release(to, d, b.size)
		return errGone
	}
	shadow.tier, shadow.dir = to, d
	e := shadow.entry()
	// The index entry is the commit point: a crash before it leaves the new file as an orphan,
	// a crash after it leaves the old one; either is removed on the next start.
	if err := s.commit(e, durable); err != nil {
		_ = os.Remove(newPath)
		return fail(err)
	}
	s.mu.Lock()
	from.used -= b.size
	fromDir.used -= b.size
	from.leave(b)
	b.tier, b.dir = to, d
	b.tierReads = 0
	b.queued = false
	delete(s.queue, b.id)
	if b.accesses == e.Accesses {
		delete(s.unflushed, b.id) // the move wrote them
	}
	to.enter(b)
	s.mu.Unlock()
	if err := os.Remove(oldPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Error(err, "removing the old copy of a moved block; the next start removes it", "path", oldPath)
	}
	return nil
}

func (s *Store) alive(b *block) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocks[b.id] == b
}

// drop removes b for good, which is only allowed when a copy exists elsewhere: SafeToDrop
// says so, or Persist made one just now. evictMu must be held and b marked moving.
func (s *Store) drop(ctx context.Context, b *block) error {
	s.mu.Lock()
	info, p, t := b.info(), b.path(), b.tier
	s.mu.Unlock()

	persisted := false
	if !s.cfg.SafeToDrop(info) {
		if s.cfg.Persist == nil {
			return fmt.Errorf("block %s in tier %s has no copy elsewhere and no persist callback is configured", b.id, t.Name)
		}
		f, err := openBlock(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && !s.alive(b) {
				return errGone
			}
			return fmt.Errorf("opening block %s to persist it: %w", b.id, err)
		}
		err = s.cfg.Persist(ctx, info, newVerifyingReader(b.id, f, b.size, b.checksum))
		_ = f.Close()
		if errors.Is(err, ErrCorrupt) {
			s.quarantine(b, p, err)
			return fmt.Errorf("persisting block %s: %w, removed: %w", b.id, err, errGone)
		}
		if err != nil {
			return fmt.Errorf("persisting block %s before dropping it from tier %s: %w", b.id, t.Name, err)
		}
		persisted = true
	}

	l := s.stripe(b.id)
	l.Lock()
	defer l.Unlock()
	if !s.alive(b) {
		return errGone
	}
	if err := s.idx.Delete(b.id); err != nil {
		return fmt.Errorf("dropping block %s from tier %s: %w", b.id, t.Name, err)
	}
	s.mu.Lock()
	s.forgetLocked(b)
	t.evictions++
	if persisted {
		t.persisted++
	}
	s.mu.Unlock()
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Error(err, "removing a dropped block; the next start removes it", "path", p)
	}
	return nil
}

// Move moves a block to the named tier, making room there as a write would.
func (s *Store) Move(ctx context.Context, id, tierName string) error {
	if err := blockindex.ValidateID(id); err != nil {
		return fmt.Errorf("moving block: %w", err)
	}
	to := s.byName[tierName]
	if to == nil {
		return fmt.Errorf("moving block %s: no tier named %q", id, tierName)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	s.evictMu.Lock()
	defer s.evictMu.Unlock()

	s.mu.Lock()
	b := s.blocks[id]
	if b == nil {
		s.mu.Unlock()
		return fmt.Errorf("moving block %s: %w", id, ErrNotFound)
	}
	from := b.tier
	if from == to {
		s.mu.Unlock()
		return nil
	}
	b.moving = true
	s.mu.Unlock()

	err := s.move(ctx, b, to, room{})

	s.mu.Lock()
	defer s.mu.Unlock()
	b.moving = false
	switch {
	case errors.Is(err, ErrCorrupt):
		return err
	case errors.Is(err, errGone):
		return fmt.Errorf("moving block %s: %w", id, ErrNotFound)
	case err != nil:
		return err
	case to.index < from.index:
		to.promotions++
	default:
		from.demotions++
	}
	return nil
}

// Promote moves a block one tier up if there is room, or room can be made by demoting blocks
// read less often than it. It reports whether the block moved; no room is not an error.
func (s *Store) Promote(ctx context.Context, id string) (bool, error) {
	if err := blockindex.ValidateID(id); err != nil {
		return false, fmt.Errorf("promoting block: %w", err)
	}
	if err := s.enter(); err != nil {
		return false, err
	}
	defer s.exit()
	s.evictMu.Lock()
	defer s.evictMu.Unlock()

	s.mu.Lock()
	b := s.blocks[id]
	if b == nil {
		s.mu.Unlock()
		return false, fmt.Errorf("promoting block %s: %w", id, ErrNotFound)
	}
	b.queued = false
	delete(s.queue, id)
	if b.tier.index == 0 {
		s.mu.Unlock()
		return false, nil
	}
	to := s.tiers[b.tier.index-1]
	if s.overShareLocked(to, b.dataset, b.size) {
		// A promotion is an optimisation: it never takes a Dataset past its share of a tier.
		s.mu.Unlock()
		return false, nil
	}
	b.moving = true
	s.mu.Unlock()

	err := s.move(ctx, b, to, room{forPromotion: true, colderThan: b})

	s.mu.Lock()
	defer s.mu.Unlock()
	b.moving = false
	switch {
	case err == nil:
		to.promotions++
		return true, nil
	case errors.Is(err, ErrTierFull) || errors.Is(err, errGone):
		return false, nil
	default:
		return false, fmt.Errorf("promoting block %s: %w", id, err)
	}
}

// PromotePending promotes the blocks queued by reads, and returns how many moved. A block
// that found no room is queued again by its next read.
func (s *Store) PromotePending(ctx context.Context) (int, error) {
	s.mu.Lock()
	ids := make([]string, 0, len(s.queue))
	for id := range s.queue {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	slices.Sort(ids)
	var errs []error
	n := 0
	for _, id := range ids {
		moved, err := s.Promote(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil && (ctx.Err() != nil || errors.Is(err, ErrClosed)):
			return n, err
		case err != nil:
			errs = append(errs, err)
		case moved:
			n++
		}
	}
	return n, errors.Join(errs...)
}
