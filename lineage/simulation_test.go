package lineage

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The experiment of Tachyon §7.2.1: an iterative workflow whose job i reads the output of job
// i-1, job run times Gaussian with a mean of 10 s, 15 s to checkpoint any output, one
// checkpoint at a time, and one failure at a uniformly random time that loses every output not
// checkpointed yet. The recovery time is what recomputing the lost outputs that the running
// job needs costs: the run times of the jobs after the last checkpointed output.
const (
	meanRuntime = 10 * time.Second
	// runtimeSpread is the standard deviation of the run times; the paper does not give it.
	runtimeSpread  = 3 * time.Second
	checkpointTime = 15 * time.Second
)

// workflow is one draw of the run times of a chain of jobs.
type workflow struct {
	finish []time.Duration // when job i's output exists
}

func newWorkflow(jobs int, r *rand.Rand) workflow {
	w := workflow{finish: make([]time.Duration, jobs)}
	var t time.Duration
	for i := range jobs {
		run := time.Duration(r.NormFloat64()*float64(runtimeSpread)) + meanRuntime
		t += max(run, time.Second)
		w.finish[i] = t
	}
	return w
}

func (w workflow) runtime(i int) time.Duration {
	if i == 0 {
		return w.finish[0]
	}
	return w.finish[i] - w.finish[i-1]
}

// edgeCheckpoints runs the Edge planner over the workflow and returns when each output's
// checkpoint completes (math.MaxInt64 for never).
func edgeCheckpoints(w workflow) []time.Duration {
	n := len(w.finish)
	done := make([]time.Duration, n)
	for i := range done {
		done[i] = math.MaxInt64
	}
	started := make([]bool, n)
	planner := &Planner{EdgeFraction: 1}
	t := time.Duration(0)
	from := 0 // outputs before the newest one checkpointed can never be picked: leave them out
	for {
		// The outputs that exist at t; one being checkpointed counts as checkpointed, so that
		// the planner does not pick it twice.
		var files []File
		i := from
		for ; i < n && w.finish[i] <= t; i++ {
			f := File{ID: fmt.Sprint(i), Created: time.Unix(0, int64(w.finish[i])), Checkpointed: started[i]}
			if i > 0 {
				f.Parents = []string{fmt.Sprint(i - 1)}
			}
			files = append(files, f)
		}
		f, kind := planner.Next(NewGraph(files))
		if f == nil {
			// Nothing to do until the next output appears.
			if i == n {
				return done
			}
			t = w.finish[i]
			continue
		}
		var picked int
		_, _ = fmt.Sscan(f.ID, &picked)
		started[picked] = true
		from = max(from, picked)
		t += checkpointTime
		done[picked] = t
		planner.Done(kind, checkpointTime)
	}
}

// intervalCheckpoints checkpoints the newest output every interval; a checkpoint that comes
// while the checkpointer is busy waits its turn, as in the paper ("lagging behind").
func intervalCheckpoints(w workflow, interval time.Duration) []time.Duration {
	n := len(w.finish)
	done := make([]time.Duration, n)
	for i := range done {
		done[i] = math.MaxInt64
	}
	end := w.finish[n-1]
	free, last := time.Duration(0), -1
	for tick := interval; tick < end; tick += interval {
		newest, _ := slices.BinarySearch(w.finish, tick+1)
		newest-- // the last output finished by tick
		if newest < 0 || newest == last {
			continue
		}
		last = newest
		start := max(tick, free)
		free = start + checkpointTime
		done[newest] = free
	}
	return done
}

// recovery is the recomputation a failure at failAt costs.
func recovery(w workflow, done []time.Duration, failAt time.Duration) time.Duration {
	running, _ := slices.BinarySearch(w.finish, failAt+1) // the job that is running
	var lost time.Duration
	for i := running - 1; i >= 0 && done[i] > failAt; i-- {
		lost += w.runtime(i)
	}
	return lost
}

type outcome struct {
	average, worst time.Duration
	// bound is Theorem 1's 3·M, M the longest time to compute or checkpoint one output.
	bound time.Duration
}

// simulate averages the recovery time of policy over trials workflows of jobs jobs.
func simulate(jobs, trials int, policy func(workflow) []time.Duration) outcome {
	r := rand.New(rand.NewPCG(1, 2))
	var sum time.Duration
	var o outcome
	for range trials {
		w := newWorkflow(jobs, r)
		done := policy(w)
		failAt := time.Duration(r.Int64N(int64(w.finish[jobs-1])))
		d := recovery(w, done, failAt)
		sum += d
		o.worst = max(o.worst, d)
		m := checkpointTime
		for i := range jobs {
			m = max(m, w.runtime(i))
		}
		o.bound = max(o.bound, 3*m)
	}
	o.average = sum / time.Duration(trials)
	return o
}

var intervals = []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second, 20 * time.Second,
	30 * time.Second, 45 * time.Second, 60 * time.Second, 90 * time.Second, 120 * time.Second}

// TestEdgeBeatsEveryFixedInterval reproduces Figure 9: Edge's average recovery time is below
// that of every fixed checkpoint interval, and its worst stays within Theorem 1's bound. Run
// with -v for the table recorded in docs/benchmarks.md.
func TestEdgeBeatsEveryFixedInterval(t *testing.T) {
	const jobs, trials = 100, 2000
	edge := simulate(jobs, trials, edgeCheckpoints)
	var table strings.Builder
	fmt.Fprintf(&table, "\n| checkpointing | average recovery | worst recovery |\n|---|---|---|\n")
	fmt.Fprintf(&table, "| Edge | %.1f s | %.1f s |\n", edge.average.Seconds(), edge.worst.Seconds())
	for _, interval := range intervals {
		fixed := simulate(jobs, trials, func(w workflow) []time.Duration { return intervalCheckpoints(w, interval) })
		fmt.Fprintf(&table, "| every %s | %.1f s | %.1f s |\n", interval, fixed.average.Seconds(), fixed.worst.Seconds())
		if fixed.average <= edge.average {
			t.Errorf("a checkpoint every %s recovers in %s on average, Edge in %s: Edge should beat every fixed interval",
				interval, fixed.average, edge.average)
		}
	}
	t.Log(table.String())
	if edge.worst > edge.bound {
		t.Errorf("Edge's worst recovery %s exceeds Theorem 1's bound 3·M = %s", edge.worst, edge.bound)
	}
}

// TestEdgeRecoveryDoesNotGrowWithDepth: with Edge, a failure costs about the same in a chain
// of 1000 jobs as in one of 50, because the checkpoints follow the newest output; a short fixed
// interval falls further behind the longer the chain runs.
func TestEdgeRecoveryDoesNotGrowWithDepth(t *testing.T) {
	const trials = 500
	shortInterval := func(w workflow) []time.Duration { return intervalCheckpoints(w, 5*time.Second) }
	var lines strings.Builder
	fmt.Fprintf(&lines, "\n| jobs in the chain | Edge average | every 5s average |\n|---|---|---|\n")
	var edgeShallow, edgeDeep, fixedShallow, fixedDeep time.Duration
	for _, jobs := range []int{50, 200, 1000} {
		e, f := simulate(jobs, trials, edgeCheckpoints), simulate(jobs, trials, shortInterval)
		fmt.Fprintf(&lines, "| %d | %.1f s | %.1f s |\n", jobs, e.average.Seconds(), f.average.Seconds())
		if e.worst > e.bound {
			t.Errorf("%d jobs: Edge's worst recovery %s exceeds 3·M = %s", jobs, e.worst, e.bound)
		}
		switch jobs {
		case 50:
			edgeShallow, fixedShallow = e.average, f.average
		case 1000:
			edgeDeep, fixedDeep = e.average, f.average
		}
	}
	t.Log(lines.String())
	if float64(edgeDeep) > 1.25*float64(edgeShallow) {
		t.Errorf("Edge's recovery grew with depth: %s for 1000 jobs, %s for 50", edgeDeep, edgeShallow)
	}
	if fixedDeep < 4*fixedShallow {
		t.Errorf("a 5 s interval should fall behind as the chain grows: %s for 1000 jobs, %s for 50", fixedDeep, fixedShallow)
	}
}
