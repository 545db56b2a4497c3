package kariz_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/lineage/kariz"
)

// The benchmark's world: blocks of 1 MiB; an under-store that moves 256 MiB/s in all (shared by
// the steps' reads and the prefetches), of which one step's reads take at most 64 MiB/s (one
// pod's connection: a step's run time is then linear in its own cached bytes, as Kariz measured
// it, Figure 6); a cache read at about 2 GiB/s (the real tier store on a temporary directory;
// its rate is what the planner assumes).
const (
	benchBlock     = 1 << 20
	benchBandwidth = 256 << 20
	benchStepRate  = 64 << 20
	benchCacheRate = 2 << 30
)

// benchStep is a step of a DAG: the stage-set it runs in, the Datasets it reads, its compute.
type benchStep struct {
	name    string
	set     int
	inputs  []string
	compute time.Duration
}

// benchDAG is a pipeline: its Datasets (MiB, in the under-store) and its steps. Set 0 is the
// queue before the DAG starts (Kariz §6.4 gives each query 5 s there): a step that reads
// nothing, during which the first prefetches run.
type benchDAG struct {
	name     string
	datasets map[string]int
	steps    []benchStep
}

func (d benchDAG) inputMiB() int {
	n := 0
	for _, mib := range d.datasets {
		n += mib
	}
	return n
}

func (d benchDAG) sets() int {
	n := 0
	for _, s := range d.steps {
		n = max(n, s.set+1)
	}
	return n
}

var queue = benchStep{name: "queue", set: 0, compute: time.Second}

// benchDAGs are the shapes of Kariz §6: a long sequential query, an aggregating one (parallel
// scans of unequal size, then their aggregation), and a TPC-H-like join tree that reads its
// largest table twice.
var benchDAGs = []benchDAG{
	{
		name:     "sequential",
		datasets: map[string]int{"events": 96, "users": 32, "sessions": 64, "geo": 16},
		steps: []benchStep{queue,
			{name: "parse", set: 1, inputs: []string{"events"}, compute: 400 * time.Millisecond},
			{name: "join-users", set: 2, inputs: []string{"users"}, compute: 400 * time.Millisecond},
			{name: "sessionize", set: 3, inputs: []string{"sessions", "events"}, compute: 400 * time.Millisecond},
			{name: "geo", set: 4, inputs: []string{"geo"}, compute: 400 * time.Millisecond},
		},
	},
	{
		name:     "aggregating",
		datasets: map[string]int{"a": 128, "b": 64, "c": 32, "d": 16, "dims": 32},
		steps: []benchStep{queue,
			{name: "scan-a", set: 1, inputs: []string{"a"}, compute: 200 * time.Millisecond},
			{name: "scan-b", set: 1, inputs: []string{"b"}, compute: 600 * time.Millisecond},
			{name: "scan-c", set: 1, inputs: []string{"c"}, compute: 800 * time.Millisecond},
			{name: "scan-d", set: 1, inputs: []string{"d"}, compute: 1000 * time.Millisecond},
			{name: "aggregate", set: 2, inputs: []string{"dims"}, compute: 500 * time.Millisecond},
		},
	},
	{
		name:     "tpch-like",
		datasets: map[string]int{"lineitem": 160, "orders": 64, "customer": 16, "part": 32, "supplier": 8, "nation": 1},
		steps: []benchStep{queue,
			{name: "scan-lineitem", set: 1, inputs: []string{"lineitem"}, compute: 300 * time.Millisecond},
			{name: "scan-orders", set: 1, inputs: []string{"orders"}, compute: 500 * time.Millisecond},
			{name: "join-customer", set: 2, inputs: []string{"customer", "nation"}, compute: 600 * time.Millisecond},
			{name: "join-part", set: 2, inputs: []string{"part", "supplier"}, compute: 400 * time.Millisecond},
			{name: "revenue", set: 3, inputs: []string{"lineitem"}, compute: 300 * time.Millisecond},
		},
	},
}

// policy is how a run caches: whether at all, the tier's eviction, and what it plans ahead.
type policy struct {
	name  string
	cache bool
	mrd   bool // eviction by the lineage graph's next use (tierstore's MRD)
	plan  func([]kariz.Stage, map[string]int64, kariz.Budget) []kariz.Hold
}

var policies = []policy{
	{name: "none"},
	{name: "LRU", cache: true},
	{name: "MRD-evict", cache: true, mrd: true},
	{name: "MRD", cache: true, mrd: true, plan: kariz.PlanMRD},
	{name: "CP", cache: true, plan: kariz.PlanCP},
	{name: "CMR", cache: true, plan: kariz.PlanCMR},
}

// BenchmarkKarizPolicies runs each DAG under each policy at caches of 25%, 50% and 100% of its
// inputs, side by side: the steps of a stage-set run at once, each reading its inputs block by
// block (a hit from the real tier store; a miss from the under-store, at its bandwidth, then
// kept by the tier's eviction) and then computing; the planners plan at the start of each set
// and their prefetches run meanwhile, pinned until the set that reads them ends. It reports the
// DAG's run time (its critical path: the sum of its sets' times), the steps' total time, and
// the share of bytes read from memory.
//
//	go test ./lineage/kariz/ -run '^$' -bench KarizPolicies -benchtime 3x
func BenchmarkKarizPolicies(b *testing.B) {
	shares := []int{25, 50, 100}
	seconds := map[string]float64{} // by dag, share and policy
	key := func(dag string, share int, pol string) string { return fmt.Sprintf("%s/%d/%s", dag, share, pol) }
	for _, dag := range benchDAGs {
		for _, share := range shares {
			for _, pol := range policies {
				b.Run(fmt.Sprintf("dag=%s/cache=%d%%/policy=%s", dag.name, share, pol.name), func(b *testing.B) {
					var dagSeconds, stepSeconds, hits, reads float64
					for range b.N {
						r := runDAG(b, dag, pol, int64(dag.inputMiB()*share/100)*benchBlock)
						dagSeconds += r.dag.Seconds()
						stepSeconds += r.steps.Seconds()
						hits += float64(r.hits)
						reads += float64(r.reads)
					}
					seconds[key(dag.name, share, pol.name)] = dagSeconds / float64(b.N)
					b.ReportMetric(dagSeconds/float64(b.N), "dag-s")
					b.ReportMetric(stepSeconds/float64(b.N), "step-s")
					b.ReportMetric(100*hits/reads, "hit-%")
				})
			}
		}
	}
	// One line per cache size, as a sub-benchmark's metrics (a parent benchmark's log is not
	// shown beside its sub-benchmarks): CMR's speed-up over LRU and over MRD, the means over the
	// DAGs (goal at 50%: 1.3x over LRU), and how many DAGs CMR ran slower than MRD.
	for _, share := range shares {
		var overLRU, overMRD, slower float64
		for _, dag := range benchDAGs {
			cmr := seconds[key(dag.name, share, "CMR")]
			if cmr == 0 {
				return // a filtered run
			}
			overLRU += seconds[key(dag.name, share, "LRU")] / cmr / float64(len(benchDAGs))
			overMRD += seconds[key(dag.name, share, "MRD")] / cmr / float64(len(benchDAGs))
			if cmr > seconds[key(dag.name, share, "MRD")] {
				slower++
			}
		}
		b.Run(fmt.Sprintf("summary/cache=%d%%", share), func(b *testing.B) {
			b.ReportMetric(overLRU, "CMR-x-LRU")
			b.ReportMetric(overMRD, "CMR-x-MRD")
			b.ReportMetric(slower, "DAGs-CMR-slower-than-MRD")
		})
	}
}

type runResult struct {
	dag, steps  time.Duration
	hits, reads int64
}

// benchRun is one run of a DAG under a policy.
type benchRun struct {
	b      *testing.B
	dag    benchDAG
	pol    policy
	store  *tierstore.Store
	under  *rate.Limiter
	data   []byte
	mu     sync.Mutex
	pinned map[string]int // block -> the last set its hold needs it for
	// readers counts the steps reading now; prefetches wait while there are any (they never
	// delay a read a step waits for), and idle says when there are none.
	readers int
	idle    *sync.Cond
	result  runResult
	planned kariz.Budget
}

func runDAG(b *testing.B, dag benchDAG, pol policy, memory int64) runResult {
	b.Helper()
	ctx := context.Background()
	r := &benchRun{b: b, dag: dag, pol: pol, under: rate.NewLimiter(benchBandwidth, benchBlock),
		data: bytes.Repeat([]byte{7}, benchBlock), pinned: map[string]int{},
		planned: kariz.Budget{Memory: memory, Bandwidth: benchBandwidth}}
	r.idle = sync.NewCond(&r.mu)
	if pol.cache {
		dir := b.TempDir()
		s, err := tierstore.Open(ctx, tierstore.Config{
			Tiers:     []tierstore.Tier{{Name: "mem", Dirs: []string{dir + "/mem"}, Quota: max(memory, benchBlock), High: 1, Low: 0.99}},
			IndexDir:  dir + "/index",
			DatasetOf: func(origin []byte) string { return string(origin) },
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = s.Close() }()
		r.store = s
	}
	start := time.Now()
	for set := range dag.sets() {
		r.startSet(ctx, set)
		stop := r.prefetch(ctx, set)
		var wg sync.WaitGroup
		for _, step := range dag.steps {
			if step.set != set {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				began := time.Now()
				r.read(ctx, step)
				time.Sleep(step.compute) // the step's own work
				r.mu.Lock()
				r.result.steps += time.Since(began)
				r.mu.Unlock()
			}()
		}
		wg.Wait()
		stop()
	}
	r.result.dag = time.Since(start)
	return r.result
}

func blockID(dataset string, i int) string { return fmt.Sprintf("%s-%d", dataset, i) }

// read reads every block of the step's inputs.
func (r *benchRun) read(ctx context.Context, step benchStep) {
	r.mu.Lock()
	r.readers++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		if r.readers--; r.readers == 0 {
			r.idle.Broadcast()
		}
		r.mu.Unlock()
	}()
	own := rate.NewLimiter(benchStepRate, benchBlock)
	for _, d := range step.inputs {
		for i := range r.dag.datasets[d] {
			hit := r.fetch(ctx, d, i, own)
			r.mu.Lock()
			r.result.reads += benchBlock
			if hit {
				r.result.hits += benchBlock
			}
			r.mu.Unlock()
		}
	}
}

// fetch makes block i of d readable: from memory if the store holds it (true), else from the
// under-store at the reader's own rate (nil: the prefetcher's, which the under-store's alone
// bounds), kept if the tier takes it.
func (r *benchRun) fetch(ctx context.Context, d string, i int, own *rate.Limiter) bool {
	id := blockID(d, i)
	if r.store != nil {
		if _, _, err := r.store.Get(ctx, id); err == nil {
			return true
		}
	}
	if own != nil {
		if err := own.WaitN(ctx, benchBlock); err != nil {
			r.b.Fatal(err)
		}
	}
	if err := r.under.WaitN(ctx, benchBlock); err != nil {
		return false // a prefetch stopped
	}
	if r.store != nil {
		_, err := r.store.Put(ctx, id, bytes.NewReader(r.data), benchBlock, tierstore.PutOptions{Clean: true, Origin: []byte(d)})
		if err != nil && ctx.Err() == nil && !errors.Is(err, tierstore.ErrExists) && !errors.Is(err, tierstore.ErrTierFull) {
			r.b.Fatal(err)
		}
	}
	return false
}

// startSet is what the operator and the workers do when a stage-set starts: MRD's next uses,
// the pins of sets ended let go.
func (r *benchRun) startSet(ctx context.Context, set int) {
	if r.store == nil {
		return
	}
	if r.pol.mrd {
		rules := map[string]tierstore.DatasetRules{}
		for d := range r.dag.datasets {
			next := tierstore.NoNextUse
			for _, s := range r.dag.steps {
				if s.set >= set && slices.Contains(s.inputs, d) && (next == tierstore.NoNextUse || s.set-set < next) {
					next = s.set - set
				}
			}
			rules[d] = tierstore.DatasetRules{Eviction: eviction.Config{Kind: eviction.MRD}, NextUse: next}
		}
		if err := r.store.SetDatasetRules(ctx, rules); err != nil {
			r.b.Fatal(err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, until := range r.pinned {
		if until < set {
			_ = r.store.Pin(ctx, id, false)
			delete(r.pinned, id)
		}
	}
}

// prefetch plans at the start of set and reads ahead what the plan holds, pinned, until the
// returned stop is called (at the set's end: the next set plans again).
func (r *benchRun) prefetch(ctx context.Context, set int) (stop func()) {
	if r.pol.plan == nil {
		return func() {}
	}
	holds := r.pol.plan(r.stagesFrom(set), r.cachedBytes(), r.planned)
	// The nearest need first.
	slices.SortStableFunc(holds, func(a, b kariz.Hold) int { return cmp.Compare(a.Until, b.Until) })
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, h := range holds {
			blocks := r.dag.datasets[h.Dataset]
			for _, i := range kariz.Strides(blocks, int(math.Ceil(float64(h.Bytes)/benchBlock))) {
				r.mu.Lock()
				for r.readers > 0 && ctx.Err() == nil {
					r.idle.Wait()
				}
				r.mu.Unlock()
				if ctx.Err() != nil {
					return
				}
				r.fetch(ctx, h.Dataset, i, nil)
				id := blockID(h.Dataset, i)
				if err := r.store.Pin(ctx, id, true); err == nil {
					r.mu.Lock()
					r.pinned[id] = max(r.pinned[id], set+h.Until)
					r.mu.Unlock()
				}
			}
		}
	}()
	return func() {
		cancel()
		r.mu.Lock()
		r.idle.Broadcast()
		r.mu.Unlock()
		<-done
	}
}

// stagesFrom is the DAG as the planner sees it from set on: set numbers from 0 (running now),
// run times predicted from the bandwidth each step gets: its own, or its share of the
// under-store's among its set's readers if that is less.
func (r *benchRun) stagesFrom(set int) []kariz.Stage {
	readers := map[int]int{}
	for _, s := range r.dag.steps {
		if len(s.inputs) > 0 {
			readers[s.set]++
		}
	}
	var out []kariz.Stage
	for _, s := range r.dag.steps {
		if s.set < set {
			continue
		}
		st := kariz.Stage{Name: s.name, DAG: r.dag.name, Set: s.set - set, Remote: s.compute.Seconds(), Cached: s.compute.Seconds()}
		for _, d := range s.inputs {
			n := int64(r.dag.datasets[d]) * benchBlock
			st.Inputs = append(st.Inputs, kariz.Input{Dataset: d, Bytes: n})
			st.Remote += float64(n) / min(benchStepRate, benchBandwidth/float64(readers[s.set]))
			st.Cached += float64(n) / benchCacheRate
		}
		out = append(out, st)
	}
	return out
}

// cachedBytes is what the store holds of each Dataset.
func (r *benchRun) cachedBytes() map[string]int64 {
	out := map[string]int64{}
	for _, b := range r.store.Blocks() {
		out[string(b.Origin)] += b.Size
	}
	return out
}
