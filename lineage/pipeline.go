package lineage

import "slices"

// Step is a computation of a namespace's pipeline (a Lineage): the Datasets it reads and the
// Datasets it writes.
type Step struct {
	Name    string
	Inputs  []string
	Outputs []string
}

// Pipeline is the steps of one namespace, linked by the Datasets they pass on: a step waits for
// the producers of its inputs. The operator checks Lineages against it (cycles), measures what
// a loss would cost (Files, then Graph.Depth) and ranks Datasets by their next use (NextUses),
// which the workers' eviction follows.
type Pipeline struct {
	steps    map[string]*Step
	order    []string // the steps' names, as given
	producer map[string]string
}

// NewPipeline links steps. Of two steps that name one output, the last given is its producer.
func NewPipeline(steps []Step) *Pipeline {
	p := &Pipeline{steps: make(map[string]*Step, len(steps)), producer: map[string]string{}}
	for i := range steps {
		s := &steps[i]
		p.steps[s.Name] = s
		p.order = append(p.order, s.Name)
		for _, out := range s.Outputs {
			p.producer[out] = s.Name
		}
	}
	return p
}

// Producer is the step that writes dataset; false for a Dataset read from an under-store.
func (p *Pipeline) Producer(dataset string) (string, bool) {
	name, ok := p.producer[dataset]
	return name, ok
}

// DAGs names the pipeline, of the namespace's several, that each step belongs to: the steps
// linked through the Datasets one writes and another reads, each pipeline named by its first
// step in name order. Steps that only read the same Dataset of an under-store are not linked:
// they are two pipelines sharing an input, which Kariz's multi-DAG planning counts once per
// pipeline.
func (p *Pipeline) DAGs() map[string]string {
	parent := make(map[string]string, len(p.steps))
	var root func(string) string
	root = func(s string) string {
		if parent[s] == s {
			return s
		}
		r := root(parent[s])
		parent[s] = r
		return r
	}
	for name := range p.steps {
		parent[name] = name
	}
	for name := range p.steps {
		for _, up := range p.upstream(name) {
			a, b := root(name), root(up)
			// The smaller name roots the two, so that each pipeline is named by its first step.
			if a < b {
				parent[b] = a
			} else {
				parent[a] = b
			}
		}
	}
	dags := make(map[string]string, len(p.steps))
	for name := range p.steps {
		dags[name] = root(name)
	}
	return dags
}

// upstream are the producers of step's inputs, in the order of its inputs.
func (p *Pipeline) upstream(step string) []string {
	s, ok := p.steps[step]
	if !ok {
		return nil
	}
	var out []string
	for _, in := range s.Inputs {
		if prod, ok := p.producer[in]; ok {
			out = append(out, prod)
		}
	}
	return out
}

// Cycle is a cycle of steps through step, as "a", "b", "a" (a reads what b writes, which reads
// what a writes), or nil when step is on none.
func (p *Pipeline) Cycle(step string) []string {
	visited := map[string]bool{}
	var walk func(name string, path []string) []string
	walk = func(name string, path []string) []string {
		for _, up := range p.upstream(name) {
			if up == step {
				return append(path, up)
			}
			if visited[up] {
				continue
			}
			visited[up] = true
			if found := walk(up, append(path, up)); found != nil {
				return found
			}
		}
		return nil
	}
	return walk(step, []string{step})
}

// Levels says, for each step, how many steps stand before it on its longest chain of producers: 0 for a step
// that reads only under-stores. A step on a cycle, or downstream of one, has LevelCycle.
func (p *Pipeline) Levels() map[string]int {
	level := func(_ string, ups []int) int {
		l := 0
		for _, up := range ups {
			if up == LevelCycle {
				return LevelCycle
			}
			l = max(l, up+1)
		}
		return l
	}
	e := newEvaluation(p.upstream, level, LevelCycle)
	out := make(map[string]int, len(p.steps))
	for _, name := range p.order {
		out[name] = e.of(name)
	}
	return out
}

// LevelCycle is the level of a step that a cycle of steps stands before (see Levels).
const LevelCycle = -1

// Downstream are the Datasets written, directly or through other steps, from datasets: the
// outputs of every step that reads one of them, then of every step that reads one of those,
// and so on, going on only through the outputs through says (a Dataset that is there needs
// nothing from upstream). They are sorted; one of datasets is among them only if it is written
// from another of them, or by a cycle.
func (p *Pipeline) Downstream(datasets []string, through func(dataset string) bool) []string {
	seen := map[string]bool{}
	frontier := slices.Clone(datasets)
	var found []string
	for len(frontier) > 0 {
		var next []string
		for _, name := range p.order {
			s := p.steps[name]
			if !slices.ContainsFunc(s.Inputs, func(in string) bool { return slices.Contains(frontier, in) }) {
				continue
			}
			for _, out := range s.Outputs {
				if !seen[out] && through(out) {
					seen[out] = true
					found = append(found, out)
					next = append(next, out)
				}
			}
		}
		frontier = next
	}
	slices.Sort(found)
	return found
}

// Files is the graph of the pipeline's output files, each computed from its step's inputs;
// ended says which end every chain as a checkpoint does (checkpointed, or not written yet), for
// Graph.Depth.
func (p *Pipeline) Files(ended func(step, output string) bool) *Graph {
	var files []File
	for _, name := range p.order {
		s := p.steps[name]
		for _, out := range s.Outputs {
			files = append(files, File{ID: out, Parents: s.Inputs, Checkpointed: ended(name, out)})
		}
	}
	return NewGraph(files)
}

// Phase is where a step stands, for NextUses.
type Phase int

// The phases of a step.
const (
	// Waiting for its inputs, or not looked at yet.
	Waiting Phase = iota
	// Running: its Job, or its recomputation.
	Running
	// Done: written, nothing lost.
	Done
	// Never: failed or bad; it does not run.
	Never
)

// Stages of a step that is no number of steps away from running.
const (
	// StageDone: it wrote its outputs and reads nothing more.
	StageDone = -1
	// StageNever: it cannot run (it failed, it is bad, it is on a cycle, or it waits for a step
	// that cannot run).
	StageNever = -2
)

// Stages says, for each step, how many pipeline stages away it runs: 0 when it runs or may run
// now; when it waits, one more than the furthest of the producers it waits for; StageDone or
// StageNever otherwise. phase says where each step stands.
func (p *Pipeline) Stages(phase func(step string) Phase) map[string]int {
	deps := func(step string) []string {
		if phase(step) == Waiting {
			return p.upstream(step)
		}
		return nil
	}
	stage := func(step string, ups []int) int {
		switch phase(step) {
		case Done:
			return StageDone
		case Never:
			return StageNever
		case Running:
			return 0
		}
		s := 0
		for _, up := range ups {
			switch {
			case up == StageNever:
				return StageNever
			case up >= 0:
				s = max(s, up+1)
			}
		}
		return s
	}
	e := newEvaluation(deps, stage, StageNever)
	out := make(map[string]int, len(p.steps))
	for _, name := range p.order {
		out[name] = e.of(name)
	}
	return out
}

// NextUses is, for every Dataset a step will still read, how many stages away that read is
// (Kariz's MRD distance): the stage of its nearest reader that will run. A Dataset no step will
// read again has none.
func (p *Pipeline) NextUses(phase func(step string) Phase) map[string]int {
	stages := p.Stages(phase)
	uses := map[string]int{}
	for _, name := range p.order {
		s := stages[name]
		if s < 0 {
			continue
		}
		for _, in := range p.steps[name].Inputs {
			if u, ok := uses[in]; !ok || s < u {
				uses[in] = s
			}
		}
	}
	return uses
}
