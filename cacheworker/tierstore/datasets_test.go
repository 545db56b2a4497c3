package tierstore

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/eviction"
)

// byOrigin names a block's Dataset by its origin, which the tests set to the Dataset's name.
func byOrigin(c *Config) { c.DatasetOf = func(origin []byte) string { return string(origin) } }

func in(dataset string) PutOptions { return PutOptions{Origin: []byte(dataset)} }

// TestADatasetsPolicyChoosesWhichOfItsBlocksLeave fills a tier with two Datasets' blocks and
// writes one more: the tier's policy (LRU) picks Dataset a to pay, as its block a0 was read
// longest ago; a's own policy picks which of its blocks go.
func TestADatasetsPolicyChoosesWhichOfItsBlocksLeave(t *testing.T) {
	full := tierSpec{name: "mem", quota: 10, high: 1, low: 0.95}
	tests := map[string]struct {
		rules    map[string]DatasetRules
		demoted  []string
		stayedUp []string
	}{
		"without rules, the tier's LRU decides": {
			demoted: []string{"a0", "a1"}, stayedUp: []string{"a2"},
		},
		"a's LFU keeps its most read block, read longest ago": {
			rules:   map[string]DatasetRules{"a": {Eviction: eviction.Config{Kind: eviction.LFU}}},
			demoted: []string{"a1", "a2"}, stayedUp: []string{"a0"},
		},
		"a's LRU, the tier's own, picks what the tier picks": {
			rules:   map[string]DatasetRules{"a": {Eviction: eviction.Config{Kind: eviction.LRU}, PromotionThreshold: 3}},
			demoted: []string{"a0", "a1"}, stayedUp: []string{"a2"},
		},
		"rules of another Dataset change nothing for a": {
			rules:   map[string]DatasetRules{"b": {Eviction: eviction.Config{Kind: eviction.LFU}}},
			demoted: []string{"a0", "a1"}, stayedUp: []string{"a2"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			s := newStore(t, []tierSpec{full, nvmeTier}, byOrigin)
			as, bs := names("a", 3), names("b", 7)
			for _, id := range as {
				s.put(id, in("a"))
			}
			for _, id := range bs {
				s.put(id, in("b"))
			}
			// Set live, on blocks held already, before the reads that rank them.
			g.Expect(s.SetDatasetRules(context.Background(), tc.rules)).To(Succeed())
			for range 5 {
				s.get("a0")
			}
			for _, id := range append(as[1:], bs...) {
				s.get(id)
			}

			s.put("b7", in("b"))
			for _, id := range tc.demoted {
				g.Expect(s.tierOf(id)).To(Equal("nvme"), "block %s", id)
			}
			for _, id := range append(tc.stayedUp, append(bs, "b7")...) {
				g.Expect(s.tierOf(id)).To(Equal("mem"), "block %s", id)
			}
		})
	}
}

// TestADatasetsShareOfATier bounds Dataset a to 30% of the memory tier: given when a holds more,
// it gives up the excess at once; then its writes move its own older blocks down instead of
// taking the tier, while b's fill what is left.
func TestADatasetsShareOfATier(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	s := newStore(t, []tierSpec{memTier, nvmeTier}, byOrigin)
	for _, id := range names("a", 6) {
		s.put(id, in("a"))
	}
	g.Expect(s.SetDatasetRules(ctx, map[string]DatasetRules{"a": {High: 0.3, Low: 0.2}})).To(Succeed())
	g.Expect(s.layout(names("a", 6)...)).To(Equal(map[string]string{
		"a0": "nvme", "a1": "nvme", "a2": "nvme", "a3": "nvme", "a4": "mem", "a5": "mem"}), "a went down to its low watermark, oldest first")

	for _, id := range []string{"a6", "a7", "a8", "a9"} {
		s.put(id, in("a"))
		g.Expect(s.DatasetUsage("mem")["a"]).To(BeNumerically("<=", 3*unit), "after writing %s", id)
	}
	// a7 and a9 each found a at its high watermark and moved two older blocks down, to its low.
	g.Expect(s.layout("a4", "a5", "a6", "a7", "a8", "a9")).To(Equal(map[string]string{
		"a4": "nvme", "a5": "nvme", "a6": "nvme", "a7": "nvme", "a8": "mem", "a9": "mem"}))
	for _, id := range names("b", 6) {
		s.put(id, in("b"))
	}
	g.Expect(s.DatasetUsage("mem")).To(Equal(map[string]int64{"a": 2 * unit, "b": 6 * unit}))

	t.Log("lifted live, the share lets a's next writes stay in memory")
	g.Expect(s.SetDatasetRules(ctx, nil)).To(Succeed())
	s.put("a10", in("a"))
	g.Expect(s.DatasetUsage("mem")["a"]).To(BeEquivalentTo(3 * unit))
}

// TestADatasetsPromotionThreshold promotes a's blocks after one read in a lower tier, and b's
// after the store's three.
func TestADatasetsPromotionThreshold(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	s := newStore(t, []tierSpec{memTier, nvmeTier}, byOrigin)
	g.Expect(s.SetDatasetRules(context.Background(), map[string]DatasetRules{"a": {PromotionThreshold: 1}})).To(Succeed())
	for _, id := range []string{"a0", "b0"} {
		s.put(id, in(id[:1]))
		g.Expect(s.Move(ctx, id, "nvme")).To(Succeed())
		s.get(id)
	}
	_, err := s.PromotePending(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.layout("a0", "b0")).To(Equal(map[string]string{"a0": "mem", "b0": "nvme"}))
}

func TestDatasetRulesAreValidated(t *testing.T) {
	s := newStore(t, []tierSpec{memTier}, byOrigin)
	for name, r := range map[string]DatasetRules{
		"an unknown policy":          {Eviction: eviction.Config{Kind: "MRU"}},
		"a low watermark above high": {High: 0.5, Low: 0.6},
		"a high watermark above one": {High: 1.5},
		"a negative threshold":       {PromotionThreshold: -1},
	} {
		if err := s.SetDatasetRules(context.Background(), map[string]DatasetRules{"a": r}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestAPromotionKeepsADatasetWithinItsShare: a's hot block in a lower tier stays there while a
// holds its whole share of the tier above; b's moves up.
func TestAPromotionKeepsADatasetWithinItsShare(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	s := newStore(t, []tierSpec{memTier, nvmeTier}, byOrigin)
	g.Expect(s.SetDatasetRules(ctx, map[string]DatasetRules{
		"a": {High: 0.1, Low: 0.05, PromotionThreshold: 1}, "b": {PromotionThreshold: 1}})).To(Succeed())
	for _, id := range []string{"a1", "b1"} {
		s.put(id, in(id[:1]))
		g.Expect(s.Move(ctx, id, "nvme")).To(Succeed())
	}
	s.put("a0", in("a")) // a's whole share of mem
	s.get("a1")
	s.get("b1")
	_, err := s.PromotePending(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.layout("a0", "a1", "b1")).To(Equal(map[string]string{"a0": "mem", "a1": "nvme", "b1": "mem"}))
	g.Expect(s.stats("mem").Datasets).To(Equal(map[string]int64{"a": unit, "b": unit}), "the tier's stats count each Dataset's bytes")
}

// TestADatasetsShareBoundsEveryTier holds a to 30% of both tiers: what its writes push out of
// memory may take 30% of NVMe, and its oldest blocks leave NVMe (dropped, being clean) for the
// newer ones.
func TestADatasetsShareBoundsEveryTier(t *testing.T) {
	g := NewWithT(t)
	s := newStore(t, []tierSpec{memTier, nvmeTier}, byOrigin)
	g.Expect(s.SetDatasetRules(context.Background(), map[string]DatasetRules{"a": {High: 0.3, Low: 0.2}})).To(Succeed())
	for _, id := range names("a", 15) {
		s.put(id, PutOptions{Clean: true, Origin: []byte("a")})
		g.Expect(s.DatasetUsage("mem")["a"]).To(BeNumerically("<=", 3*unit), "after writing %s", id)
		g.Expect(s.DatasetUsage("nvme")["a"]).To(BeNumerically("<=", 6*unit), "after writing %s", id)
	}
	g.Expect(s.tierOf("a0")).To(BeEmpty(), "the oldest block left the last tier")
	g.Expect(s.tierOf("a14")).To(Equal("mem"))
}

// TestMRDGivesUpTheDataWhoseNextUseIsFurthest fills a tier with the blocks of three Datasets
// ranked by the lineage graph (MRD: read now, read three stages from now, read by no step any
// more) and of one without rules, and writes more: what no step reads goes first, however
// recently read; when the tier's LRU picks a Dataset ranked by the graph, the one read furthest
// from now pays instead; a Dataset without rules keeps the tier's order.
func TestMRDGivesUpTheDataWhoseNextUseIsFurthest(t *testing.T) {
	g := NewWithT(t)
	s := newStore(t, []tierSpec{{name: "mem", quota: 10, high: 1, low: 0.95}, nvmeTier}, byOrigin)
	mrd := func(next int) DatasetRules {
		return DatasetRules{Eviction: eviction.Config{Kind: eviction.MRD}, NextUse: next}
	}
	g.Expect(s.SetDatasetRules(context.Background(), map[string]DatasetRules{
		"now": mrd(0), "later": mrd(3), "done": mrd(NoNextUse),
	})).To(Succeed())
	blocks := map[string][]string{"now": names("now", 2), "later": names("later", 2), "done": names("done", 2), "plain": names("plain", 4)}
	for dataset, ids := range blocks {
		for _, id := range ids {
			s.put(id, in(dataset))
		}
	}
	// Least recently read first: now's, then one of plain's, then later's, done's, plain's.
	for _, id := range []string{"now0", "now1", "plain0", "later0", "later1", "done0", "done1", "plain1", "plain2", "plain3"} {
		s.get(id)
	}
	demoted := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			g.Expect(s.tierOf(id)).To(Equal("nvme"), "block %s", id)
		}
	}
	// A write into the full tier moves two blocks down (to the low watermark), and the next fits.
	s.put("y0", in("y"))
	demoted("done0", "done1")
	s.put("y1", in("y"))
	s.put("y2", in("y"))
	demoted("later0", "later1")
	s.put("y3", in("y"))
	s.put("y4", in("y"))
	demoted("now0", "now1")
	s.put("y5", in("y"))
	s.put("y6", in("y"))
	demoted("plain0", "plain1")
	for _, id := range []string{"plain2", "plain3", "y0", "y1", "y2", "y3", "y4", "y5", "y6"} {
		g.Expect(s.tierOf(id)).To(Equal("mem"), "block %s", id)
	}
}
