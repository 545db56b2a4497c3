// Package kariz plans what the pipelines of a namespace read ahead into memory and keep there
// (Kariz, FAST '21): the critical-path-aware, marginal-utility planner CMR, with MRD and CP, the
// policies it is measured against.
//
// A pipeline runs in stage-sets: the steps whose inputs are ready run together, and the next set
// starts when the slowest of them ends (Pipeline.Stages numbers them). Caching part of a step's
// input shortens the step in proportion (its run time is linear in the cached bytes:
// lineage.RunTimeModel), but only the slowest steps of a set decide when the set ends. CMR
// (Algorithm 1, Candidates) lists, for each set, the input that brings its slowest step down to
// the next slowest, then both down to the third, and so on, each candidate worth the seconds it
// takes off the set; and (Algorithm 2, Plan) picks candidates of every future set by seconds
// saved per byte of memory, a Dataset several pipelines read counted once among them, within the
// memory the plan may hold and the under-store bandwidth that the steps' own reads leave free
// before each set starts. A step's input is cached in strides spread over its files (Strides),
// so that every partition of the step finds the same share in memory.
package kariz

import (
	"cmp"
	"math"
	"slices"
)

// Input is a Dataset a step reads, and how many bytes of it.
type Input struct {
	Dataset string
	Bytes   int64
}

// Stage is a step as the planner sees it.
type Stage struct {
	Name string
	// DAG names the pipeline the step belongs to; a Dataset that steps of several read is
	// shared among them.
	DAG string
	// Set is the stage-set the step runs in: 0 runs now, 1 next, and so on.
	Set    int
	Inputs []Input
	// Remote and Cached are the step's predicted run times, in seconds, with none of its input
	// cached and with all of it (lineage.RunTimeModel).
	Remote, Cached float64
	// OtherReads are bytes the step reads from the under-store besides Inputs, which the plan
	// does not hold (Datasets no policy of this plan prefetches): they take the under-store's
	// bandwidth, not the plan's memory.
	OtherReads int64
}

// inputBytes is the size of everything the step reads.
func (s Stage) inputBytes() int64 {
	var n int64
	for _, in := range s.Inputs {
		n += in.Bytes
	}
	return n
}

// savedPerByte is how many seconds each cached byte of its input takes off the step (Kariz's
// α); 0 for a step that caching does not speed up.
func (s Stage) savedPerByte() float64 {
	n := s.inputBytes()
	if n == 0 || s.Remote <= s.Cached {
		return 0
	}
	return (s.Remote - s.Cached) / float64(n)
}

// TimeWith is the step's run time with cached bytes of its input in memory.
func (s Stage) TimeWith(cached int64) float64 {
	return s.Remote - s.savedPerByte()*float64(min(max(cached, 0), s.inputBytes()))
}

// Candidate is input of the steps of one stage-set to cache, which takes Value seconds off the
// set's run time (Kariz Algorithm 1). A set's candidates come in order: each assumes the ones
// before it are cached.
type Candidate struct {
	Set int
	// Bytes is how much more of each step's input to cache, by step name.
	Bytes map[string]int64
	// Value is the seconds it takes off the set.
	Value float64
}

// Size is the bytes the candidate caches.
func (c Candidate) Size() int64 {
	var n int64
	for _, b := range c.Bytes {
		n += b
	}
	return n
}

// Candidates lists the caching candidates of the steps of one stage-set, in the order they are
// taken (Kariz Algorithm 1): the first brings the slowest step down to the next slowest, the
// next brings both down to the third, and so on, until the slowest steps are at the least their
// inputs allow (the set's floor: the highest of its steps' run times with all input cached). A
// step that ends before the floor is in no candidate: caching for it would save nothing. Each
// candidate's seconds saved per byte is no higher than the one before's.
func Candidates(set []Stage) []Candidate {
	if len(set) == 0 {
		return nil
	}
	steps := slices.Clone(set)
	slices.SortStableFunc(steps, func(a, b Stage) int { return cmp.Compare(b.Remote, a.Remote) })
	floor := 0.0
	for _, s := range steps {
		floor = max(floor, min(s.Cached, s.Remote))
	}
	var out []Candidate
	for k := 0; k < len(steps) && steps[k].Remote > floor; k++ {
		next := floor
		if k+1 < len(steps) {
			next = max(steps[k+1].Remote, floor)
		}
		saved := steps[k].Remote - next
		if saved <= 0 {
			continue // a tie: the next candidate brings both down
		}
		c := Candidate{Set: steps[0].Set, Bytes: map[string]int64{}, Value: saved}
		for _, s := range steps[:k+1] {
			c.Bytes[s.Name] = int64(math.Round(saved / s.savedPerByte()))
		}
		out = append(out, c)
	}
	return out
}
