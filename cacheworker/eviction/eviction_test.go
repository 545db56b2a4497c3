package eviction

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// run applies a script of references to p. Each step is "+id" (add), "id" (touch), "-id"
// (remove), "!id" (pin) or "~id" (unpin).
func run(p Policy, script string) {
	for _, s := range strings.Fields(script) {
		switch s[0] {
		case '+':
			p.Add(s[1:])
		case '-':
			p.Remove(s[1:])
		case '!':
			p.SetPinned(s[1:], true)
		case '~':
			p.SetPinned(s[1:], false)
		default:
			p.Touch(s)
		}
	}
}

// drain evicts until there is no victim and returns the order, the way a tier store empties a tier.
func drain(p Policy) []string {
	var order []string
	for {
		id, ok := p.Victim(nil)
		if !ok {
			return order
		}
		order = append(order, id)
		p.Remove(id)
	}
}

func TestEvictionOrder(t *testing.T) {
	lru := func() Policy { return NewLRU() }
	lfu := func() Policy { return NewLFU() }
	lrfu := func(l float64) func() Policy { return func() Policy { return NewLRFU(l) } }

	cases := map[string]struct {
		policy func() Policy
		script string
		want   []string
	}{
		"LRU evicts the block referenced longest ago": {
			policy: lru, script: "+a +b +c a", want: []string{"b", "c", "a"},
		},
		"LRU ignores how often a block was referenced": {
			policy: lru, script: "+a a a a +b", want: []string{"a", "b"},
		},
		"LFU evicts the block referenced the fewest times": {
			policy: lfu, script: "+a a a +b b +c", want: []string{"c", "b", "a"},
		},
		"LFU breaks ties by evicting the block referenced longest ago": {
			policy: lfu, script: "+a +b +c b a", want: []string{"c", "b", "a"},
		},
		"LRFU with lambda 0 orders like LFU": {
			policy: lrfu(0), script: "+a a a +b b +c", want: []string{"c", "b", "a"},
		},
		"LRFU with lambda 1 orders like LRU even against many old references": {
			policy: lrfu(1), script: "+a a a a a a a a +b", want: []string{"a", "b"},
		},
		"LRFU with lambda 0.5 keeps three recent references over one newer": {
			// At the last tick a weighs 1/sqrt2 + 1/2 + 1/(2 sqrt2) ≈ 1.56, b weighs 1.
			policy: lrfu(0.5), script: "+a a a +b", want: []string{"b", "a"},
		},
		"LRFU with lambda 1 drops the same three references for the newer block": {
			// At the last tick a weighs 1/2 + 1/4 + 1/8 = 0.875, b weighs 1.
			policy: lrfu(1), script: "+a a a +b", want: []string{"a", "b"},
		},
		"LRFU with a small lambda lets old frequent blocks outlive a burst of newer ones": {
			policy: lrfu(0.01), script: "+a a a a +b b +c", want: []string{"c", "b", "a"},
		},
		"a pinned block is never chosen, even when it is the coldest": {
			policy: lru, script: "+a +b +c !a", want: []string{"b", "c"},
		},
		"a pinned block keeps collecting references and ranks by them once unpinned": {
			policy: lfu, script: "+a +b !a a a ~a", want: []string{"b", "a"},
		},
		"when every block is pinned there is no victim": {
			policy: lrfu(0.5), script: "+a +b !a !b", want: nil,
		},
		"removed blocks are forgotten": {
			policy: lru, script: "+a +b +c -a", want: []string{"b", "c"},
		},
		"adding a tracked block again counts as a reference": {
			policy: lru, script: "+a +b +a", want: []string{"b", "a"},
		},
		"references to blocks the policy does not track are ignored": {
			policy: lfu, script: "+a x x -y !z +b", want: []string{"a", "b"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			p := tc.policy()
			run(p, tc.script)
			g.Expect(drain(p)).To(Equal(tc.want))
		})
	}
}

func TestVictimSkipsWhatTheCallerRulesOut(t *testing.T) {
	cases := map[string]struct {
		skip []string
		want string
		ok   bool
	}{
		"nothing skipped gives the coldest block":          {want: "a", ok: true},
		"skipping the coldest gives the next coldest":      {skip: []string{"a"}, want: "b", ok: true},
		"skipping several walks past all of them":          {skip: []string{"a", "b", "c", "d", "e"}, want: "f", ok: true},
		"skipping blocks deep in the heap changes nothing": {skip: []string{"g", "h"}, want: "a", ok: true},
		"skipping every block leaves no victim":            {skip: []string{"a", "b", "c", "d", "e", "f", "g", "h"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			p := NewLRU()
			run(p, "+a +b +c +d +e +f +g +h")
			id, ok := p.Victim(func(id string) bool { return slices.Contains(tc.skip, id) })
			g.Expect(ok).To(Equal(tc.ok))
			g.Expect(id).To(Equal(tc.want))
		})
	}
}

// TestLRFULimits checks LRFU's two limits on random reference strings: with lambda 0 it must
// evict in LFU's order and with lambda 1 in LRU's, block for block.
func TestLRFULimits(t *testing.T) {
	cases := map[string]struct {
		lrfu, reference func() Policy
	}{
		"lambda 0 evicts in exactly LFU's order": {
			lrfu: func() Policy { return NewLRFU(0) }, reference: NewLFU,
		},
		"lambda 1 evicts in exactly LRU's order": {
			lrfu: func() Policy { return NewLRFU(1) }, reference: NewLRU,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			for seed := range uint64(50) {
				rng := rand.New(rand.NewPCG(seed, 7))
				var b strings.Builder
				for i := range 20 {
					fmt.Fprintf(&b, "+b%d ", i)
				}
				for range 300 {
					fmt.Fprintf(&b, "b%d ", rng.IntN(20))
				}
				a, r := tc.lrfu(), tc.reference()
				run(a, b.String())
				run(r, b.String())
				g.Expect(drain(a)).To(Equal(drain(r)), "seed %d", seed)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	half := 0.5
	cases := map[string]struct {
		spec    datav1alpha1.EvictionSpec
		want    Config
		wantErr string
	}{
		"an empty spec is LRU": {
			want: Config{},
		},
		"LFU passes through": {
			spec: datav1alpha1.EvictionSpec{Policy: datav1alpha1.EvictLFU}, want: Config{Kind: LFU},
		},
		"LRFU keeps its lambda": {
			spec: datav1alpha1.EvictionSpec{Policy: datav1alpha1.EvictLRFU, Lambda: &half}, want: Config{Kind: LRFU, Lambda: 0.5},
		},
		"LRFU without lambda weighs recency and frequency equally": {
			spec: datav1alpha1.EvictionSpec{Policy: datav1alpha1.EvictLRFU}, want: Config{Kind: LRFU, Lambda: 0.5},
		},
		"MRD passes through: the tier store ranks its Datasets by the lineage graph, and it ranks its own blocks as LRU": {
			spec: datav1alpha1.EvictionSpec{Policy: datav1alpha1.EvictMRD}, want: Config{Kind: MRD},
		},
		"a lambda on LRU is refused": {
			spec: datav1alpha1.EvictionSpec{Policy: datav1alpha1.EvictLRU, Lambda: &half}, wantErr: "only applies to policy LRFU",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			c, err := ConfigFromSpec(tc.spec)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c).To(Equal(tc.want))
			p, err := New(c)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Len()).To(BeZero())
		})
	}

	t.Run("a lambda outside [0, 1] is refused", func(t *testing.T) {
		g := NewWithT(t)
		_, err := New(Config{Kind: LRFU, Lambda: 1.5})
		g.Expect(err).To(MatchError(ContainSubstring("must be in [0, 1]")))
	})
	t.Run("an unknown policy is refused", func(t *testing.T) {
		g := NewWithT(t)
		_, err := New(Config{Kind: "FIFO"})
		g.Expect(err).To(MatchError(ContainSubstring(`unknown eviction policy "FIFO"`)))
	})
}

func TestPinnedCountsTheTrackedBlocksThatArePinned(t *testing.T) {
	for script, want := range map[string]int{
		"+a +b":             0,
		"+a +b !a":          1,
		"+a +b !a !a !b":    2, // pinning twice counts once
		"+a +b !a !b ~a":    1,
		"+a +b !a -a":       0, // a removed pinned block is no longer counted
		"+a !x":             0, // untracked blocks are ignored
		"+a +b +c !b !c -b": 1,
	} {
		p := NewLRU()
		run(p, script)
		NewWithT(t).Expect(p.Pinned()).To(Equal(want), "script %q", script)
	}
}
