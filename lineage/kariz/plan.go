package kariz

import (
	"cmp"
	"math"
	"slices"
)

// Budget is what a plan may use.
type Budget struct {
	// Memory is the bytes the plan may hold in the cache.
	Memory int64
	// Bandwidth is the under-store's rate, in bytes per second, which the steps' own reads of
	// what is not cached and the prefetches share.
	Bandwidth float64
}

// Hold is what a plan keeps of one Dataset: Bytes of it in memory (in strides spread over it),
// pinned until the end of stage-set Until, the last that reads it for the plan. Prefetch of
// those bytes are not in memory yet, and are read ahead during stage-set Start.
type Hold struct {
	Dataset  string
	Bytes    int64
	Until    int
	Prefetch int64
	Start    int
}

// planner is one run of a policy over the future stage-sets: what it holds so far, and the
// bandwidth each set leaves free.
type planner struct {
	stages []Stage
	budget Budget
	cached map[string]int64 // what is in memory now, by Dataset
	// hold is what the plan keeps of each Dataset; per step, how much of the step's input.
	hold     map[string]*Hold
	forStep  map[string]int64
	memory   int64
	duration map[int]float64 // predicted run time of each set, as the plan shortens it
	demand   map[int]float64 // bytes the steps of each set read from the under-store themselves
	taken    map[int]float64 // prefetch bytes planned during each set
	sets     []int           // the sets, in order
}

func newPlanner(stages []Stage, cached map[string]int64, budget Budget) *planner {
	p := &planner{stages: stages, budget: budget, cached: cached, hold: map[string]*Hold{}, forStep: map[string]int64{},
		duration: map[int]float64{}, demand: map[int]float64{}, taken: map[int]float64{}}
	for _, s := range stages {
		if _, ok := p.duration[s.Set]; !ok {
			p.sets = append(p.sets, s.Set)
		}
		p.duration[s.Set] = max(p.duration[s.Set], s.Remote)
		p.demand[s.Set] += float64(s.inputBytes() + s.OtherReads)
	}
	slices.Sort(p.sets)
	return p
}

// slack is the bandwidth, in bytes, that set leaves free for prefetches: what the under-store
// moves while the set runs, less the set's own reads and what is planned already.
func (p *planner) slack(set int) float64 {
	return max(0, p.budget.Bandwidth*p.duration[set]-p.demand[set]-p.taken[set])
}

// grow is what caching more of step s's input (more bytes, spread over its inputs by size)
// adds to each Dataset held: a Dataset held for another step already is held to the larger of
// the two (its strides nest: Strides).
func (p *planner) grow(s Stage, more int64) map[string]int64 {
	total := s.inputBytes()
	after := min(p.forStep[s.Name]+more, total)
	out := map[string]int64{}
	for _, in := range s.Inputs {
		want := int64(math.Ceil(float64(in.Bytes) * float64(after) / float64(total)))
		have := int64(0)
		if h := p.hold[in.Dataset]; h != nil {
			have = h.Bytes
		}
		if want > have {
			out[in.Dataset] = want - have
		}
	}
	return out
}

// fetchBefore is what must be read from the under-store to hold add more of each Dataset: what
// is not in memory already.
func (p *planner) fetchBefore(add map[string]int64) int64 {
	var n int64
	for d, more := range add {
		have := int64(0)
		if h := p.hold[d]; h != nil {
			have = h.Bytes
		}
		inMemory := max(p.cached[d]-have, 0)
		n += max(more-inMemory, 0)
	}
	return n
}

// freeBefore is the bandwidth, in bytes, that the sets before set leave for prefetches.
func (p *planner) freeBefore(set int) float64 {
	var free float64
	for _, s := range p.sets {
		if s < set {
			free += p.slack(s)
		}
	}
	return free
}

// reserve finds bandwidth for fetch bytes before set starts, taking it from the latest sets
// first (Kariz's "too early" rule: a prefetch waits for the last set that can carry it, leaving
// the nearer sets' bandwidth to nearer needs), from now (set 0) on. It reports the earliest set
// used, and false, reserving nothing, when the sets before cannot carry it.
func (p *planner) reserve(fetch int64, set int) (int, bool) {
	if float64(fetch) > p.freeBefore(set)+0.5 {
		return 0, false
	}
	left, start := float64(fetch), set
	for i := len(p.sets) - 1; i >= 0 && left > 0; i-- {
		s := p.sets[i]
		if s >= set {
			continue
		}
		use := min(left, p.slack(s))
		if use > 0 {
			p.taken[s] += use
			left -= use
			start = s
		}
	}
	return start, true
}

// take adds to the plan more of step s's input, read ahead from set start on: add of each
// Dataset (fetch of it from the under-store), pinned until s's set ends.
func (p *planner) take(s Stage, more int64, add map[string]int64, start int) {
	p.forStep[s.Name] = min(p.forStep[s.Name]+more, s.inputBytes())
	for d, n := range add {
		h := p.hold[d]
		if h == nil {
			h = &Hold{Dataset: d, Until: s.Set, Start: start}
			p.hold[d] = h
		}
		inMemory := max(p.cached[d]-h.Bytes, 0)
		h.Prefetch += max(n-inMemory, 0)
		h.Bytes += n
		h.Until = max(h.Until, s.Set)
		h.Start = min(h.Start, start)
		p.memory += n
	}
}

// holds is the plan, by Dataset name.
func (p *planner) holds() []Hold {
	out := make([]Hold, 0, len(p.hold))
	for _, h := range p.hold {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b Hold) int { return cmp.Compare(a.Dataset, b.Dataset) })
	return out
}

// PlanCMR plans, at the start of stage-set 0, what to hold for the sets after it (Kariz
// Algorithm 2): the candidates of every future set (Candidates), by seconds saved per byte, a
// Dataset that the steps of several DAGs read counted once among them (Kariz's "unique size":
// each byte weighs 1/n for n DAGs); a candidate is taken if the memory left holds it and the
// sets before its own leave the bandwidth to read it ahead, and the set it speeds up is
// predicted shorter from then on (which leaves less bandwidth in it). A set's candidates are
// taken in order; one that does not fit ends its set's list. cached is what is in memory now,
// by Dataset.
func PlanCMR(stages []Stage, cached map[string]int64, budget Budget) []Hold {
	p := newPlanner(stages, cached, budget)
	sharers := sharedBy(stages)
	bySet := map[int][]Stage{}
	for _, s := range stages {
		if s.Set > 0 {
			bySet[s.Set] = append(bySet[s.Set], s)
		}
	}
	lists := map[int][]Candidate{}
	for set, steps := range bySet {
		lists[set] = Candidates(steps)
	}
	step := map[string]Stage{}
	for _, s := range stages {
		step[s.Name] = s
	}
	for {
		best, bestUtility := -1, 0.0
		for set, list := range lists {
			if len(list) == 0 {
				continue
			}
			if u := utility(list[0], step, sharers); best < 0 || u > bestUtility || u == bestUtility && set < best {
				best, bestUtility = set, u
			}
		}
		if best < 0 {
			return p.holds()
		}
		c := lists[best][0]
		lists[best] = lists[best][1:]
		if !p.takeCandidate(c, step) {
			// What did not fit whole was taken in part: the rest of its set's list assumes it.
			delete(lists, best)
		}
	}
}

// takeCandidate adds c to the plan, and reports whether it fitted whole in memory and
// bandwidth; a candidate that does not is taken in the largest part that fits (its value falls
// in proportion: Kariz's fractional knapsack).
func (p *planner) takeCandidate(c Candidate, step map[string]Stage) bool {
	size, fetch := p.cost(c, step)
	part := 1.0
	if size > 0 {
		part = min(part, float64(p.budget.Memory-p.memory)/float64(size))
	}
	if fetch > 0 {
		part = min(part, p.freeBefore(c.Set)/float64(fetch))
	}
	if part <= 0 {
		return false
	}
	if part < 1 {
		scaled := Candidate{Set: c.Set, Bytes: map[string]int64{}, Value: c.Value * part}
		for name, n := range c.Bytes {
			scaled.Bytes[name] = int64(float64(n) * part)
		}
		c = scaled
	}
	adds, combined := p.adds(c, step)
	start, ok := p.reserve(p.fetchBefore(combined), c.Set)
	if !ok {
		return false
	}
	names := sortedKeys(c.Bytes)
	for _, name := range names {
		add := map[string]int64{}
		for d := range adds[name] {
			if n := combined[d]; n > 0 {
				add[d] = n
				combined[d] = 0
			}
		}
		p.take(step[name], c.Bytes[name], add, start)
	}
	p.shorten(c.Set)
	return part == 1
}

// adds is what caching c adds to each Dataset held, per step of c and in all: two steps of a
// set that read one Dataset need it to the larger of their shares.
func (p *planner) adds(c Candidate, step map[string]Stage) (perStep map[string]map[string]int64, combined map[string]int64) {
	perStep, combined = map[string]map[string]int64{}, map[string]int64{}
	for _, name := range sortedKeys(c.Bytes) {
		add := p.grow(step[name], c.Bytes[name])
		perStep[name] = add
		for d, n := range add {
			combined[d] = max(combined[d], n)
		}
	}
	return perStep, combined
}

// cost is the memory c takes, and what of it must be read from the under-store.
func (p *planner) cost(c Candidate, step map[string]Stage) (size, fetch int64) {
	_, combined := p.adds(c, step)
	for _, n := range combined {
		size += n
	}
	return size, p.fetchBefore(combined)
}

func sortedKeys(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// shorten predicts set's run time again from what the plan holds for its steps: a set that
// ends sooner leaves less time, and so less bandwidth, for the prefetches during it.
func (p *planner) shorten(set int) {
	d, demand := 0.0, 0.0
	for _, s := range p.stages {
		if s.Set == set {
			d = max(d, s.TimeWith(p.forStep[s.Name]))
			demand += float64(s.inputBytes() - min(p.forStep[s.Name], s.inputBytes()))
		}
	}
	p.duration[set], p.demand[set] = d, demand
}

// utility is c's seconds saved per byte, each byte of a Dataset that n DAGs read weighing 1/n.
func utility(c Candidate, step map[string]Stage, sharers map[string]int) float64 {
	var weight float64
	for name, n := range c.Bytes {
		s := step[name]
		total := s.inputBytes()
		for _, in := range s.Inputs {
			weight += float64(n) * float64(in.Bytes) / float64(total) / float64(max(sharers[in.Dataset], 1))
		}
	}
	if weight == 0 {
		return 0
	}
	return c.Value / weight
}

// sharedBy counts, for each Dataset, the DAGs whose steps read it.
func sharedBy(stages []Stage) map[string]int {
	dags := map[string]map[string]bool{}
	for _, s := range stages {
		for _, in := range s.Inputs {
			if dags[in.Dataset] == nil {
				dags[in.Dataset] = map[string]bool{}
			}
			dags[in.Dataset][s.DAG] = true
		}
	}
	out := map[string]int{}
	for d, set := range dags {
		out[d] = len(set)
	}
	return out
}

// PlanMRD plans, at the start of stage-set 0, as MRD does (Perez et al., ICPP '18): the whole
// inputs of the future sets, nearest next use first, while memory and the bandwidth before each
// use allow. It looks at the graph's distances only, not at which steps decide a set's end.
func PlanMRD(stages []Stage, cached map[string]int64, budget Budget) []Hold {
	order := slices.Clone(stages)
	slices.SortStableFunc(order, func(a, b Stage) int { return cmp.Compare(a.Set, b.Set) })
	return planWhole(stages, order, cached, budget)
}

// PlanCP plans, at the start of stage-set 0, as Kariz's CP does: the whole inputs of the steps
// on the critical path (the slowest step of each future set), nearest first, then nothing else.
func PlanCP(stages []Stage, cached map[string]int64, budget Budget) []Hold {
	slowest := map[int]Stage{}
	for _, s := range stages {
		if cur, ok := slowest[s.Set]; !ok || s.Remote > cur.Remote {
			slowest[s.Set] = s
		}
	}
	var order []Stage
	for _, s := range slowest {
		order = append(order, s)
	}
	slices.SortFunc(order, func(a, b Stage) int { return cmp.Compare(a.Set, b.Set) })
	return planWhole(stages, order, cached, budget)
}

// planWhole holds the whole input of each step of order (some of stages), in order, that fits.
func planWhole(stages, order []Stage, cached map[string]int64, budget Budget) []Hold {
	p := newPlanner(stages, cached, budget)
	for _, s := range order {
		if s.Set <= 0 {
			continue
		}
		add := p.grow(s, s.inputBytes())
		var size int64
		for _, n := range add {
			size += n
		}
		if p.memory+size > budget.Memory {
			continue
		}
		start, ok := p.reserve(p.fetchBefore(add), s.Set)
		if !ok {
			continue
		}
		p.take(s, s.inputBytes(), add, start)
		p.shorten(s.Set)
	}
	return p.holds()
}
