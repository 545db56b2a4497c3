package lineage

// evaluation computes a value for each node of a graph from the values of the nodes it depends
// on, depth first, each node once. A graph may hold a cycle (admission refuses one, but a
// namespace can hold one while its Lineages are being edited): a node met again on its own path
// takes onCycle rather than being walked forever. The file graph's depth and the pipeline's
// stages are both evaluations; Pipeline.Cycle finds the cycle itself.
type evaluation[T any] struct {
	// deps are the nodes id's value depends on.
	deps func(id string) []string
	// value is id's value, given those of its deps in order.
	value   func(id string, deps []T) T
	onCycle T
	memo    map[string]T
	onPath  map[string]bool
}

func newEvaluation[T any](deps func(string) []string, value func(string, []T) T, onCycle T) *evaluation[T] {
	return &evaluation[T]{deps: deps, value: value, onCycle: onCycle, memo: map[string]T{}, onPath: map[string]bool{}}
}

func (e *evaluation[T]) of(id string) T {
	if v, ok := e.memo[id]; ok {
		return v
	}
	if e.onPath[id] {
		return e.onCycle
	}
	e.onPath[id] = true
	deps := e.deps(id)
	vals := make([]T, len(deps))
	for i, d := range deps {
		vals[i] = e.of(d)
	}
	delete(e.onPath, id)
	v := e.value(id, vals)
	e.memo[id] = v
	return v
}
