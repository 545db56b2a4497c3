package lineage

import (
	"math"
	"testing"
)

const mib = 1 << 20

// TestFitRunTime: a step's run time is predicted from its input's cached share, by the rates
// alone before any run, by one run and the rates after one, and by the runs once their cached
// shares differ; terms never go negative.
func TestFitRunTime(t *testing.T) {
	rates := Rates{UnderStore: 100 * mib, Cache: 1000 * mib}
	// truth is a step with 5 s of its own work that reads at half the under-store's rate and
	// at the cache's.
	truth := RunTimeModel{Rates: rates, Fixed: 5, UnderStoreScale: 2, Scale: 1}
	run := func(input, cached int64) Run {
		return Run{Seconds: truth.Predict(input, cached), InputBytes: input, CachedBytes: cached}
	}
	for name, tc := range map[string]struct {
		runs []Run
		// input and cached are the run to predict.
		input, cached int64
		want, within  float64
	}{
		"no run: its reads at the rates": {
			input: 1000 * mib, cached: 500 * mib, want: 5 + 0.5, within: 0.01,
		},
		"one run: its own work is what its reads at the rates leave": {
			runs:  []Run{{Seconds: 30, InputBytes: 1000 * mib}},
			input: 1000 * mib, cached: 0, want: 30, within: 0.01,
		},
		"one run, then half cached: the cached half read at the cache's rate": {
			runs:  []Run{{Seconds: 30, InputBytes: 1000 * mib}},
			input: 1000 * mib, cached: 500 * mib, want: 30 - 5 + 0.5, within: 0.01,
		},
		"runs at several cached shares learn the step's rates": {
			runs:  []Run{run(1000*mib, 0), run(1000*mib, 250*mib), run(1000*mib, 1000*mib), run(2000*mib, 500*mib)},
			input: 1000 * mib, cached: 500 * mib, want: truth.Predict(1000*mib, 500*mib), within: 0.05,
		},
		"a step whose reads do not matter: the runs say so": {
			runs:  []Run{{Seconds: 60, InputBytes: 1000 * mib}, {Seconds: 61, InputBytes: 1000 * mib, CachedBytes: 1000 * mib}, {Seconds: 59, InputBytes: 1000 * mib, CachedBytes: 500 * mib}},
			input: 1000 * mib, cached: 1000 * mib, want: 60, within: 0.05,
		},
		"cached bytes above the input count as the input": {
			runs:  []Run{{Seconds: 30, InputBytes: 1000 * mib}},
			input: 1000 * mib, cached: 5000 * mib, want: 30 - 10 + 1, within: 0.01,
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := FitRunTime(tc.runs, rates)
			got := m.Predict(tc.input, tc.cached)
			if math.Abs(got-tc.want) > tc.within*tc.want {
				t.Errorf("predicted %.2f s, want %.2f s (within %.0f%%); model %+v", got, tc.want, tc.within*100, m)
			}
			if m.Fixed < 0 || m.UnderStoreScale < 0 || m.Scale < 0 {
				t.Errorf("a negative term: %+v", m)
			}
		})
	}
}

// TestFitRunTimeNeverGoesNegative: runs faster with less cached (noise, or a busier cache)
// would ask for a negative term; it is held at zero instead.
func TestFitRunTimeNeverGoesNegative(t *testing.T) {
	runs := []Run{
		{Seconds: 10, InputBytes: 1000 * mib},
		{Seconds: 40, InputBytes: 1000 * mib, CachedBytes: 1000 * mib},
		{Seconds: 25, InputBytes: 1000 * mib, CachedBytes: 500 * mib},
	}
	m := FitRunTime(runs, Rates{})
	if m.Fixed < 0 || m.UnderStoreScale < 0 || m.Scale < 0 {
		t.Fatalf("a negative term: %+v", m)
	}
	if m.Rates.UnderStore != DefaultUnderStoreRate || m.Rates.Cache != DefaultCacheRate {
		t.Errorf("rates of zero are the defaults: %+v", m.Rates)
	}
	for _, r := range runs {
		if got := m.Predict(r.InputBytes, r.CachedBytes); got < 0 {
			t.Errorf("predicted %.2f s for %+v", got, r)
		}
	}
}
