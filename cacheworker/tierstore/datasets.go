package tierstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/strata-cache/strata/cacheworker/eviction"
)

// DatasetRules are what a Dataset's CachePolicy changes in how the store treats its blocks.
// Datasets share the tiers: a tier that needs room asks its own policy (Config.Eviction) for
// its coldest block, and the Dataset that block belongs to gives up the block that its rules
// rank coldest among its own. So the tier decides which Dataset pays, and the Dataset decides
// with what.
type DatasetRules struct {
	// Eviction ranks the Dataset's blocks against each other; empty Kind means the store's.
	Eviction eviction.Config
	// High and Low, when High is set, bound the Dataset's share of every tier: a block that
	// would take it past High times the tier's quota first moves its own coldest blocks out of
	// the tier (down one tier, or dropped from the last) until it is back at Low.
	High, Low float64
	// PromotionThreshold is how many reads one of its blocks in a lower tier needs before it
	// moves up; 0 means the store's.
	PromotionThreshold int
	// NextUse, for a Dataset whose Eviction is MRD, is how many pipeline stages away its next
	// read by a Lineage's Job is: 0 when a Job that reads it runs (or may run) now, n when it
	// waits for n stages before it; NoNextUse when no Lineage will read it again.
	NextUse int
}

// NoNextUse is the NextUse of a Dataset no pipeline step will read again.
const NoNextUse = -1

// mrd says whether the Dataset of rules r is ranked by the lineage graph, and its rank: the
// further its next use, the higher, highest for none.
func (r DatasetRules) mrd() (rank int, ok bool) {
	if r.Eviction.Kind != eviction.MRD {
		return 0, false
	}
	if r.NextUse == NoNextUse {
		return math.MaxInt, true
	}
	return r.NextUse, true
}

// Validate reports what is wrong with r.
func (r DatasetRules) Validate() error {
	if err := r.Eviction.Validate(); err != nil {
		return err
	}
	if r.High != 0 && (!(r.High > 0 && r.High <= 1) || !(r.Low >= 0 && r.Low < r.High)) {
		return fmt.Errorf("watermarks need 0 <= low < high <= 1, got low %g and high %g", r.Low, r.High)
	}
	if r.PromotionThreshold < 0 {
		return fmt.Errorf("promotion threshold must be at least 1, got %d", r.PromotionThreshold)
	}
	if r.NextUse < NoNextUse {
		return fmt.Errorf("next use must be a number of stages, or %d for none, got %d", NoNextUse, r.NextUse)
	}
	return nil
}

// share is one Dataset's part of one tier. Guarded by Store.mu.
type share struct {
	used int64
	// policy ranks the Dataset's blocks in the tier; nil when the Dataset has no rules.
	policy eviction.Policy
}

// shareOf returns the share of dataset in t, making it if needed. mu must be held.
func (t *tier) shareOf(dataset string) *share {
	sh := t.shares[dataset]
	if sh == nil {
		sh = &share{}
		t.shares[dataset] = sh
	}
	return sh
}

// enter counts b in its tier and in its Dataset's share of it. mu must be held.
func (t *tier) enter(b *block) {
	t.blocks++
	t.policy.Add(b.id)
	sh := t.shareOf(b.dataset)
	sh.used += b.size
	if sh.policy != nil {
		sh.policy.Add(b.id)
	}
	if b.pinned {
		t.setPinned(b, true)
	}
}

// leave undoes enter. mu must be held.
func (t *tier) leave(b *block) {
	t.blocks--
	t.policy.Remove(b.id)
	if sh := t.shares[b.dataset]; sh != nil {
		sh.used -= b.size
		if sh.policy != nil {
			sh.policy.Remove(b.id)
		}
		if sh.used == 0 && sh.policy == nil {
			delete(t.shares, b.dataset)
		}
	}
}

// touched records a read of b. mu must be held.
func (t *tier) touched(b *block) {
	t.policy.Touch(b.id)
	if sh := t.shares[b.dataset]; sh != nil && sh.policy != nil {
		sh.policy.Touch(b.id)
	}
}

// setPinned marks b pinned or not in every policy that ranks it. mu must be held.
func (t *tier) setPinned(b *block, pinned bool) {
	t.policy.SetPinned(b.id, pinned)
	if sh := t.shares[b.dataset]; sh != nil && sh.policy != nil {
		sh.policy.SetPinned(b.id, pinned)
	}
}

// SetDatasetRules replaces the rules of every Dataset at once (by the names Config.DatasetOf
// gives); a Dataset left out follows the store's own settings. It applies to the blocks held
// already: a Dataset whose eviction policy changed ranks its blocks afresh, least recently used
// first (access counts start again, as after a restart), and one that is now over its share of
// a tier gives up the excess at once, down to its low watermark.
func (s *Store) SetDatasetRules(ctx context.Context, rules map[string]DatasetRules) error {
	if err := s.replaceRules(rules); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	var errs []error
	for _, t := range s.tiers {
		for name := range rules {
			if err := s.makeShareRoom(ctx, t, name, 0); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// replaceRules swaps the rules, and the policies of the Datasets whose own ranking changed.
func (s *Store) replaceRules(rules map[string]DatasetRules) error {
	fresh := map[string][]eviction.Policy{} // per Dataset that ranks its own blocks, one per tier
	for name, r := range rules {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("rules of Dataset %s: %w", name, err)
		}
		c, own := s.ownRanking(r)
		if !own {
			continue
		}
		for range s.tiers {
			p, err := eviction.New(c)
			if err != nil {
				return fmt.Errorf("rules of Dataset %s: %w", name, err)
			}
			fresh[name] = append(fresh[name], p)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.rules
	s.rules = maps.Clone(rules)
	changed := map[string]bool{}
	for _, names := range []map[string]DatasetRules{rules, old} {
		for name := range names {
			oc, oown := s.ownRanking(old[name])
			nc, nown := s.ownRanking(rules[name])
			if oown != nown || oc != nc {
				changed[name] = true
			}
		}
	}
	for _, t := range s.tiers {
		for name := range changed {
			var p eviction.Policy
			if ps := fresh[name]; ps != nil {
				p = ps[t.index]
			}
			t.shareOf(name).policy = p
		}
	}
	// Blocks enter the new policies least recently used first, as when the store starts.
	var ranked []*block
	for _, b := range s.blocks {
		if changed[b.dataset] && fresh[b.dataset] != nil {
			ranked = append(ranked, b)
		}
	}
	slices.SortFunc(ranked, func(a, b *block) int { return a.lastAccess.Compare(b.lastAccess) })
	for _, b := range ranked {
		p := b.tier.shares[b.dataset].policy
		p.Add(b.id)
		if b.pinned {
			p.SetPinned(b.id, true)
		}
	}
	return nil
}

// ownRanking is how a Dataset of rules r ranks its own blocks, and whether it needs a policy of
// its own to: it does to keep to a share (whose victims are its own), or to rank unlike the
// tier. One of the tier's kind would only pick the block the tier picked, at the cost of a
// second ranking of every block on every read.
func (s *Store) ownRanking(r DatasetRules) (eviction.Config, bool) {
	tier := s.cfg.Eviction
	if tier.Kind == "" {
		tier.Kind = eviction.LRU
	}
	c := r.Eviction
	if c.Kind == "" {
		c = tier
	}
	return c, r.High != 0 || c != tier
}

// datasetOf names the Dataset of a block from its origin.
func (s *Store) datasetOf(origin []byte) string {
	if s.cfg.DatasetOf == nil || len(origin) == 0 {
		return ""
	}
	return s.cfg.DatasetOf(origin)
}

// promotionThreshold is the reads a block of dataset needs in a lower tier to move up. mu must
// be held.
func (s *Store) promotionThreshold(dataset string) int {
	if r, ok := s.rules[dataset]; ok && r.PromotionThreshold > 0 {
		return r.PromotionThreshold
	}
	return s.cfg.PromotionThreshold
}

// shareLimits are dataset's bounds in t in bytes, and whether it has any. mu must be held.
func (s *Store) shareLimits(t *tier, dataset string) (high, low int64, ok bool) {
	r, ok := s.rules[dataset]
	if !ok || r.High == 0 {
		return 0, 0, false
	}
	return int64(r.High * float64(t.Quota)), int64(r.Low * float64(t.Quota)), true
}

// DatasetUsage is how many bytes of each Dataset a tier holds.
func (s *Store) DatasetUsage(tier string) map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.byName[tier]
	if t == nil {
		return nil
	}
	return t.datasetBytes()
}

// datasetBytes is how many bytes of each Dataset t holds. mu must be held.
func (t *tier) datasetBytes() map[string]int64 {
	out := make(map[string]int64, len(t.shares))
	for name, sh := range t.shares {
		if sh.used > 0 {
			out[name] = sh.used
		}
	}
	return out
}

// overShareLocked says whether n more bytes of dataset in t would pass its share's high
// watermark. mu must be held.
func (s *Store) overShareLocked(t *tier, dataset string, n int64) bool {
	high, _, ok := s.shareLimits(t, dataset)
	return ok && t.shareOf(dataset).used+n > high
}
