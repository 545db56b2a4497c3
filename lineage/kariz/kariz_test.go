package kariz

import (
	"math"
	"slices"
	"testing"
)

// figure5 is the second stage-set of Kariz's Figure 2 DAG (Figure 5a), in units of data: S2 runs
// 9 s uncached and 2 s with its 14 units cached, S3 14 s and 10 s with 12, S4 13 s and 10 s with 6.
func figure5() []Stage {
	return []Stage{
		{Name: "S2", DAG: "q", Set: 1, Inputs: []Input{{Dataset: "c", Bytes: 14}}, Remote: 9, Cached: 2},
		{Name: "S3", DAG: "q", Set: 1, Inputs: []Input{{Dataset: "d", Bytes: 12}}, Remote: 14, Cached: 10},
		{Name: "S4", DAG: "q", Set: 1, Inputs: []Input{{Dataset: "e", Bytes: 6}}, Remote: 13, Cached: 10},
	}
}

// TestCandidatesOfFigure5: the first candidate brings S3 down to S4 (3 units of S3's input, 1 s),
// the second both down to their floor of 10 s (9 more of S3's, 6 of S4's, 3 s); S2, which ends
// before the floor whatever is cached, is in neither.
func TestCandidatesOfFigure5(t *testing.T) {
	got := Candidates(figure5())
	want := []Candidate{
		{Set: 1, Bytes: map[string]int64{"S3": 3}, Value: 1},
		{Set: 1, Bytes: map[string]int64{"S3": 9, "S4": 6}, Value: 3},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d candidates, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].Set != want[i].Set || math.Abs(got[i].Value-want[i].Value) > 1e-9 || len(got[i].Bytes) != len(want[i].Bytes) {
			t.Errorf("candidate %d: got %+v, want %+v", i, got[i], want[i])
		}
		for step, n := range want[i].Bytes {
			if got[i].Bytes[step] != n {
				t.Errorf("candidate %d caches %d of %s's input, want %d", i, got[i].Bytes[step], step, n)
			}
		}
	}
	if u0, u1 := got[0].Value/float64(got[0].Size()), got[1].Value/float64(got[1].Size()); u1 > u0 {
		t.Errorf("seconds saved per unit rise from %.3f to %.3f", u0, u1)
	}
}

// TestCandidatesOfTiesAndUncacheableSteps: steps tied at the top come down together; a step
// that caching does not speed up sets the floor and is in no candidate; no steps, no candidates.
func TestCandidatesOfTiesAndUncacheableSteps(t *testing.T) {
	for name, tc := range map[string]struct {
		set  []Stage
		want []Candidate
	}{
		"two steps tied at the top": {
			set: []Stage{
				{Name: "a", Set: 2, Inputs: []Input{{Dataset: "x", Bytes: 100}}, Remote: 10, Cached: 0},
				{Name: "b", Set: 2, Inputs: []Input{{Dataset: "y", Bytes: 50}}, Remote: 10, Cached: 5},
			},
			want: []Candidate{{Set: 2, Bytes: map[string]int64{"a": 50, "b": 50}, Value: 5}},
		},
		"a compute-bound step sets the floor": {
			set: []Stage{
				{Name: "io", Set: 1, Inputs: []Input{{Dataset: "x", Bytes: 100}}, Remote: 20, Cached: 2},
				{Name: "cpu", Set: 1, Inputs: []Input{{Dataset: "y", Bytes: 100}}, Remote: 8, Cached: 8},
			},
			want: []Candidate{{Set: 1, Bytes: map[string]int64{"io": 67}, Value: 12}},
		},
		"no steps": {},
	} {
		t.Run(name, func(t *testing.T) {
			got := Candidates(tc.set)
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range tc.want {
				if math.Abs(got[i].Value-tc.want[i].Value) > 1e-9 || len(got[i].Bytes) != len(tc.want[i].Bytes) {
					t.Fatalf("got %+v, want %+v", got[i], tc.want[i])
				}
				for step, n := range tc.want[i].Bytes {
					if got[i].Bytes[step] != n {
						t.Errorf("caches %d of %s's input, want %d", got[i].Bytes[step], step, n)
					}
				}
			}
		})
	}
}

// setTime is how long a stage-set runs with what holds keeps in memory.
func setTime(set []Stage, holds []Hold) (seconds float64, hit, read int64) {
	held := map[string]int64{}
	for _, h := range holds {
		held[h.Dataset] = h.Bytes
	}
	for _, s := range set {
		var cached int64
		for _, in := range s.Inputs {
			cached += min(held[in.Dataset], in.Bytes)
			read += in.Bytes
		}
		hit += cached
		seconds = max(seconds, s.TimeWith(cached))
	}
	return seconds, hit, read
}

// TestCMRBeatsMRDAtALowerHitRate is Figure 5b's lesson with memory for 20 of the second set's 32
// units, planned while the first set of Figure 2 (S0, 9 s; S1, 14 s) runs: MRD holds whole
// inputs by distance (S2's, then S4's, since S3's no longer fits) and serves more of the reads
// from memory, yet the set still waits 14 s for S3; CMR leaves S2, which has slack, and holds
// S3's and S4's inputs: fewer hits, and the set ends at 10 s.
func TestCMRBeatsMRDAtALowerHitRate(t *testing.T) {
	set := figure5()
	running := []Stage{
		{Name: "S0", DAG: "q", Set: 0, Inputs: []Input{{Dataset: "a", Bytes: 10}}, Remote: 9, Cached: 5},
		{Name: "S1", DAG: "q", Set: 0, Inputs: []Input{{Dataset: "b", Bytes: 24}}, Remote: 14, Cached: 6},
	}
	all := append(slices.Clone(running), set...)
	budget := Budget{Memory: 20, Bandwidth: 1000}
	cmr, mrd := PlanCMR(all, nil, budget), PlanMRD(all, nil, budget)
	cmrTime, cmrHit, read := setTime(set, cmr)
	mrdTime, mrdHit, _ := setTime(set, mrd)
	t.Logf("CMR: %.0f s, %d of %d units from memory; MRD: %.0f s, %d of %d", cmrTime, cmrHit, read, mrdTime, mrdHit, read)
	if cmrTime != 10 || mrdTime != 14 {
		t.Errorf("the set runs %.1f s under CMR (want 10) and %.1f s under MRD (want 14)", cmrTime, mrdTime)
	}
	if cmrHit >= mrdHit {
		t.Errorf("CMR's hits (%d) are not below MRD's (%d)", cmrHit, mrdHit)
	}
	cp := PlanCP(all, nil, budget)
	if cpTime, _, _ := setTime(set, cp); cpTime != 13 {
		t.Errorf("CP holds the slowest step's input only: the set runs %.1f s, want 13 (S4's)", cpTime)
	}
}

// TestPlanKeepsToMemoryAndBandwidth: a candidate that the sets before its own cannot read ahead
// is not taken, unless its data is in memory already (then it is only kept); what the plan reads
// ahead is read during the latest set that can carry it; a Dataset two DAGs read weighs half.
func TestPlanKeepsToMemoryAndBandwidth(t *testing.T) {
	// Set 0 runs 10 s and reads 500 bytes itself: at 100 bytes/s, 500 are free for prefetches;
	// set 1 runs 10 s too, and reads nothing the plan would not.
	stages := []Stage{
		{Name: "now", DAG: "a", Set: 0, Inputs: []Input{{Dataset: "raw", Bytes: 500}}, Remote: 10, Cached: 1},
		{Name: "next", DAG: "a", Set: 1, Inputs: []Input{{Dataset: "big", Bytes: 800}}, Remote: 10, Cached: 2},
		{Name: "after", DAG: "a", Set: 2, Inputs: []Input{{Dataset: "small", Bytes: 400}}, Remote: 10, Cached: 6},
	}
	t.Run("bandwidth", func(t *testing.T) {
		holds := PlanCMR(stages, nil, Budget{Memory: 1 << 20, Bandwidth: 100})
		want := []Hold{
			// 800 of "big" do not fit in set 0's 500: it holds 500, set 1's time falls to 5 s.
			{Dataset: "big", Bytes: 500, Until: 1, Prefetch: 500, Start: 0},
			// set 1 then leaves 100·5 - 300 still read by "next" itself = 200 bytes for set 2.
			{Dataset: "small", Bytes: 200, Until: 2, Prefetch: 200, Start: 1},
		}
		if !slices.Equal(holds, want) {
			t.Errorf("got %+v\nwant %+v", holds, want)
		}
	})
	t.Run("in memory already", func(t *testing.T) {
		holds := PlanCMR(stages, map[string]int64{"big": 800}, Budget{Memory: 1 << 20, Bandwidth: 0})
		if !slices.Contains(holds, Hold{Dataset: "big", Bytes: 800, Until: 1, Prefetch: 0, Start: 1}) {
			t.Errorf("what is in memory is kept without bandwidth: %+v", holds)
		}
	})
	t.Run("memory", func(t *testing.T) {
		holds := PlanCMR(stages, nil, Budget{Memory: 100, Bandwidth: 1e9})
		var held int64
		for _, h := range holds {
			held += h.Bytes
		}
		if held > 100 {
			t.Errorf("holds %d bytes of 100: %+v", held, holds)
		}
	})
	t.Run("shared among DAGs", func(t *testing.T) {
		shared := []Stage{
			{Name: "a1", DAG: "a", Set: 1, Inputs: []Input{{Dataset: "own", Bytes: 100}}, Remote: 10, Cached: 0},
			{Name: "b1", DAG: "b", Set: 1, Inputs: []Input{{Dataset: "common", Bytes: 100}}, Remote: 10, Cached: 0},
			{Name: "c1", DAG: "c", Set: 2, Inputs: []Input{{Dataset: "common", Bytes: 100}}, Remote: 10, Cached: 0},
		}
		holds := PlanCMR(shared, nil, Budget{Memory: 100, Bandwidth: 1e9})
		if len(holds) != 1 || holds[0].Dataset != "common" {
			t.Errorf("the Dataset two DAGs read is the better buy: %+v", holds)
		}
	})
}

// TestStridesSpreadOverEveryPartition: whatever the share cached, each partition of consecutive
// strides gets its part to within one stride per halving, and more strides keep the ones chosen
// for fewer.
func TestStridesSpreadOverEveryPartition(t *testing.T) {
	if got := Strides(16, 4); !slices.Equal(got, []int{0, 8, 4, 12}) {
		t.Errorf("a quarter of 16: %v, want one in every four", got)
	}
	for _, n := range []int{1, 7, 12, 16, 100} {
		for count := 0; count <= n; count++ {
			got := Strides(n, count)
			if len(got) != count {
				t.Fatalf("Strides(%d, %d) chose %d", n, count, len(got))
			}
			if count > 0 && !slices.Equal(got[:count-1], Strides(n, count-1)) {
				t.Fatalf("Strides(%d, %d) does not keep Strides(%d, %d)", n, count, n, count-1)
			}
			seen := map[int]bool{}
			for _, s := range got {
				if s < 0 || s >= n || seen[s] {
					t.Fatalf("Strides(%d, %d) = %v", n, count, got)
				}
				seen[s] = true
			}
			bound := math.Log2(float64(n)) + 1
			for _, parts := range []int{2, 4} {
				size := (n + parts - 1) / parts
				for p := 0; p*size < n; p++ {
					lo, hi := p*size, min((p+1)*size, n)
					in := 0
					for _, s := range got {
						if s >= lo && s < hi {
							in++
						}
					}
					if want := float64(count) * float64(hi-lo) / float64(n); math.Abs(float64(in)-want) > bound {
						t.Errorf("Strides(%d, %d): part [%d, %d) holds %d, want about %.1f", n, count, lo, hi, in, want)
					}
				}
			}
		}
	}
	if Strides(0, 3) != nil || Strides(5, 0) != nil {
		t.Error("nothing to choose: nil")
	}
}

func TestShareIsThePercentOfAFilesBlocksSpreadOverIt(t *testing.T) {
	for _, tc := range []struct {
		n, percent int
		want       []int
	}{
		{n: 4, percent: 100, want: []int{0, 1, 2, 3}},
		{n: 4, percent: 0, want: []int{0, 1, 2, 3}},
		{n: 4, percent: 50, want: []int{0, 2}},
		{n: 8, percent: 25, want: []int{0, 4}},
		{n: 8, percent: 30, want: []int{0, 2, 4}},
		{n: 3, percent: 1, want: []int{0}},
		{n: 1, percent: 40, want: []int{0}},
		{n: 0, percent: 40, want: nil},
	} {
		if got := Share(tc.n, tc.percent); !slices.Equal(got, tc.want) {
			t.Errorf("Share(%d, %d%%) = %v, want %v", tc.n, tc.percent, got, tc.want)
		}
	}
}

// A step's reads of Datasets no plan holds take the bandwidth all the same: a running set that
// reads all the under-store gives leaves nothing to read ahead during it.
func TestReadsOfOtherDatasetsLeaveLessBandwidth(t *testing.T) {
	stages := func(other int64) []Stage {
		return []Stage{
			{Name: "running", Set: 0, Remote: 10, Cached: 10, OtherReads: other},
			{Name: "next", Set: 1, Inputs: []Input{{Dataset: "lookup", Bytes: 100}}, Remote: 10, Cached: 1},
		}
	}
	budget := Budget{Memory: 1000, Bandwidth: 10} // 100 bytes over the running set's 10 s
	for _, tc := range []struct {
		other    int64
		prefetch int64
	}{
		{other: 0, prefetch: 100},
		{other: 60, prefetch: 40},
		{other: 100, prefetch: 0},
	} {
		var got int64
		for _, h := range PlanCMR(stages(tc.other), nil, budget) {
			got += h.Prefetch
		}
		if got != tc.prefetch {
			t.Errorf("with %d bytes of other reads in the running set: prefetch %d, want %d", tc.other, got, tc.prefetch)
		}
	}
}
