package lineage

import (
	"math"
)

// Run is one run of a step that succeeded: how long it took, and how much of its input it read
// and found cached when it started.
type Run struct {
	Seconds     float64
	InputBytes  int64
	CachedBytes int64
}

// Rates are the bandwidths a step reads its input at: from the under-store (what is not
// cached) and from the cache. A model learns the step's own from its runs; these stand in for
// what too few runs cannot tell apart.
type Rates struct {
	UnderStore, Cache float64 // bytes per second
}

// The rates a step is assumed to read at until its runs say otherwise, where the caller knows
// none better: an under-store reached over a modest network, and a read through a worker's
// mount from its memory tier on a small node.
const (
	DefaultUnderStoreRate = 100 << 20
	DefaultCacheRate      = 1 << 30
)

// RunTimeModel predicts a step's run time from the share of its input that is cached (Kariz
// §3.3, after Ernest): T = Fixed + UnderStoreScale·(uncached bytes / under-store rate) +
// CacheScale·(cached bytes / cache rate). Fixed is the step's own work (start-up and compute);
// the scales say how far the step's reads fall short of the rates (1: it reads at the rate).
// Kariz's terms for the executors' communication are left out: a Lineage's parallelism is its
// Job's, the same from one run to the next.
type RunTimeModel struct {
	Rates                  Rates
	Fixed                  float64 // seconds
	UnderStoreScale, Scale float64
}

// Predict is the run time, in seconds, of a run that reads inputBytes of which cachedBytes are
// cached.
func (m RunTimeModel) Predict(inputBytes, cachedBytes int64) float64 {
	x := m.features(inputBytes, cachedBytes)
	return m.Fixed + m.UnderStoreScale*x[1] + m.Scale*x[2]
}

// features are a run's terms: 1 (for Fixed), the seconds its uncached bytes take at the
// under-store's rate, and its cached bytes' at the cache's.
func (m RunTimeModel) features(inputBytes, cachedBytes int64) [3]float64 {
	cached := min(max(cachedBytes, 0), max(inputBytes, 0))
	uncached := max(inputBytes, 0) - cached
	return [3]float64{1, float64(uncached) / m.Rates.UnderStore, float64(cached) / m.Rates.Cache}
}

// priorWeight is how much the rates count against the runs: as a tenth of one run. One run
// alone gives Fixed as its time less its reads at the rates; runs whose cached shares differ
// soon outweigh the rates.
const priorWeight = 0.1

// FitRunTime fits a model to a step's runs by least squares with non-negative terms (Kariz fits
// Ernest's model with a non-negative Lasso), drawn towards scales of 1, so that a step that ran
// once is predicted by its reads at rates. Rates of zero or less are taken as their defaults.
func FitRunTime(runs []Run, rates Rates) RunTimeModel {
	if rates.UnderStore <= 0 {
		rates.UnderStore = DefaultUnderStoreRate
	}
	if rates.Cache <= 0 {
		rates.Cache = DefaultCacheRate
	}
	m := RunTimeModel{Rates: rates, UnderStoreScale: 1, Scale: 1}
	if len(runs) == 0 {
		return m
	}
	// The normal equations of Σ (T - θ·x)² + Σ_k λ_k (θ_k - 1)² for the scales k = 1, 2;
	// Fixed (k = 0) is not drawn anywhere.
	var a [3][3]float64
	var b [3]float64
	var meanSquare [3]float64
	for _, r := range runs {
		x := m.features(r.InputBytes, r.CachedBytes)
		for i := range 3 {
			for j := range 3 {
				a[i][j] += x[i] * x[j]
			}
			b[i] += x[i] * r.Seconds
			meanSquare[i] += x[i] * x[i] / float64(len(runs))
		}
	}
	for k := 1; k < 3; k++ {
		lambda := priorWeight*meanSquare[k] + 1e-9
		a[k][k] += lambda
		b[k] += lambda
	}
	theta := nonNegativeSolve(a, b)
	m.Fixed, m.UnderStoreScale, m.Scale = theta[0], theta[1], theta[2]
	return m
}

// nonNegativeSolve minimises θᵀAθ - 2bᵀθ over θ ≥ 0 (A symmetric positive semi-definite, 3×3)
// by trying every set of free terms, the others held at zero, and keeping the best feasible
// solution: eight small systems, exact where an iterative method would only approach it.
func nonNegativeSolve(a [3][3]float64, b [3]float64) [3]float64 {
	var best [3]float64
	bestValue := 0.0 // θ = 0 is always feasible, and its value is 0
	for mask := 1; mask < 8; mask++ {
		var free []int
		for i := range 3 {
			if mask&(1<<i) != 0 {
				free = append(free, i)
			}
		}
		sub := make([][]float64, len(free))
		rhs := make([]float64, len(free))
		for r, i := range free {
			sub[r] = make([]float64, len(free))
			for c, j := range free {
				sub[r][c] = a[i][j]
			}
			rhs[r] = b[i]
		}
		x, ok := solve(sub, rhs)
		if !ok {
			continue
		}
		var theta [3]float64
		feasible := true
		for r, i := range free {
			if x[r] < 0 {
				feasible = false
			}
			theta[i] = x[r]
		}
		if !feasible {
			continue
		}
		if v := quadratic(a, b, theta); v < bestValue {
			best, bestValue = theta, v
		}
	}
	return best
}

// quadratic is θᵀAθ - 2bᵀθ.
func quadratic(a [3][3]float64, b, theta [3]float64) float64 {
	var v float64
	for i := range 3 {
		for j := range 3 {
			v += theta[i] * a[i][j] * theta[j]
		}
		v -= 2 * b[i] * theta[i]
	}
	return v
}

// solve solves the small system m·x = v by Gaussian elimination with partial pivoting; false
// when m is singular.
func solve(m [][]float64, v []float64) ([]float64, bool) {
	n := len(v)
	for col := range n {
		pivot := col
		for r := col + 1; r < n; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[pivot][col]) {
				pivot = r
			}
		}
		if math.Abs(m[pivot][col]) < 1e-12 {
			return nil, false
		}
		m[col], m[pivot] = m[pivot], m[col]
		v[col], v[pivot] = v[pivot], v[col]
		for r := col + 1; r < n; r++ {
			f := m[r][col] / m[col][col]
			for c := col; c < n; c++ {
				m[r][c] -= f * m[col][c]
			}
			v[r] -= f * v[col]
		}
	}
	x := make([]float64, n)
	for r := n - 1; r >= 0; r-- {
		s := v[r]
		for c := r + 1; c < n; c++ {
			s -= m[r][c] * x[c]
		}
		x[r] = s / m[r][r]
	}
	return x, true
}
