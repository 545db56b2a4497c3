package lineage

import (
	"testing"

	. "github.com/onsi/gomega"
)

func in(names ...string) []string { return names }

func TestACycleIsNamedStepByStep(t *testing.T) {
	for name, tc := range map[string]struct {
		steps []Step
		from  string
		want  []string
	}{
		"a chain has none": {
			steps: []Step{{Name: "a", Inputs: in("raw"), Outputs: in("x")}, {Name: "b", Inputs: in("x"), Outputs: in("y")}},
			from:  "b",
		},
		"two steps that read each other's outputs": {
			steps: []Step{{Name: "a", Inputs: in("y"), Outputs: in("x")}, {Name: "b", Inputs: in("x"), Outputs: in("y")}},
			from:  "a", want: in("a", "b", "a"),
		},
		"a step that reads its own output": {
			steps: []Step{{Name: "a", Inputs: in("x"), Outputs: in("x")}},
			from:  "a", want: in("a", "a"),
		},
		"a step behind a cycle is on none itself": {
			steps: []Step{
				{Name: "a", Inputs: in("y"), Outputs: in("x")}, {Name: "b", Inputs: in("x"), Outputs: in("y")},
				{Name: "c", Inputs: in("y"), Outputs: in("z")},
			},
			from: "c",
		},
	} {
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Expect(NewPipeline(tc.steps).Cycle(tc.from)).To(Equal(tc.want))
		})
	}
}

func TestDAGsLinkTheStepsThroughWhatTheyPassOn(t *testing.T) {
	for name, tc := range map[string]struct {
		steps []Step
		want  map[string]string
	}{
		"a chain is one": {
			steps: []Step{{Name: "b", Inputs: in("raw"), Outputs: in("x")}, {Name: "a", Inputs: in("x"), Outputs: in("y")}},
			want:  map[string]string{"a": "a", "b": "a"},
		},
		"two chains reading one source are two, sharing it": {
			steps: []Step{
				{Name: "etl", Inputs: in("imagenet"), Outputs: in("x")}, {Name: "train", Inputs: in("x"), Outputs: in("model")},
				{Name: "audit", Inputs: in("imagenet"), Outputs: in("report")},
			},
			want: map[string]string{"etl": "etl", "train": "etl", "audit": "audit"},
		},
		"an aggregation joins its branches": {
			steps: []Step{
				{Name: "left", Inputs: in("a"), Outputs: in("l")}, {Name: "right", Inputs: in("b"), Outputs: in("r")},
				{Name: "join", Inputs: in("l", "r"), Outputs: in("out")},
			},
			want: map[string]string{"left": "join", "right": "join", "join": "join"},
		},
		"a step that reads a Dataset nobody writes yet is its own": {
			steps: []Step{{Name: "a", Inputs: in("missing"), Outputs: in("x")}},
			want:  map[string]string{"a": "a"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Expect(NewPipeline(tc.steps).DAGs()).To(Equal(tc.want))
		})
	}
}

func TestStagesCountTheStepsBeforeEachRuns(t *testing.T) {
	steps := []Step{
		{Name: "a", Inputs: in("raw"), Outputs: in("x")},
		{Name: "b", Inputs: in("x"), Outputs: in("y")},
		{Name: "c", Inputs: in("y", "raw"), Outputs: in("z")},
		{Name: "loop1", Inputs: in("l2"), Outputs: in("l1")},
		{Name: "loop2", Inputs: in("l1"), Outputs: in("l2")},
		{Name: "after-loop", Inputs: in("l2"), Outputs: in("w")},
	}
	for name, tc := range map[string]struct {
		phases map[string]Phase
		stages map[string]int
		uses   map[string]int
	}{
		"nothing run yet: the first step may run now, each later one a stage further": {
			stages: map[string]int{"a": 0, "b": 1, "c": 2, "loop1": StageNever, "loop2": StageNever, "after-loop": StageNever},
			uses:   map[string]int{"raw": 0, "x": 1, "y": 2},
		},
		"a written step reads nothing more": {
			phases: map[string]Phase{"a": Done, "b": Running},
			stages: map[string]int{"a": StageDone, "b": 0, "c": 1, "loop1": StageNever, "loop2": StageNever, "after-loop": StageNever},
			uses:   map[string]int{"x": 0, "y": 1, "raw": 1},
		},
		"a step behind a failed one never runs": {
			phases: map[string]Phase{"a": Never},
			stages: map[string]int{"a": StageNever, "b": StageNever, "c": StageNever, "loop1": StageNever, "loop2": StageNever, "after-loop": StageNever},
			uses:   map[string]int{},
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			p := NewPipeline(steps)
			phase := func(s string) Phase { return tc.phases[s] }
			g.Expect(p.Stages(phase)).To(Equal(tc.stages))
			g.Expect(p.NextUses(phase)).To(Equal(tc.uses))
		})
	}
}

func TestLevelsCountTheProducersBeforeEachStep(t *testing.T) {
	steps := []Step{
		{Name: "c", Inputs: in("y", "raw"), Outputs: in("z")},
		{Name: "a", Inputs: in("raw"), Outputs: in("x")},
		{Name: "b", Inputs: in("x"), Outputs: in("y")},
		{Name: "side", Inputs: in("x", "raw2"), Outputs: in("s")},
		{Name: "loop1", Inputs: in("l2"), Outputs: in("l1")},
		{Name: "loop2", Inputs: in("l1"), Outputs: in("l2")},
		{Name: "after-loop", Inputs: in("l2"), Outputs: in("w")},
	}
	NewWithT(t).Expect(NewPipeline(steps).Levels()).To(Equal(map[string]int{
		"a": 0, "b": 1, "c": 2, "side": 1,
		"loop1": LevelCycle, "loop2": LevelCycle, "after-loop": LevelCycle,
	}))
}

func TestTheFilesOfAPipelineChainThroughItsSteps(t *testing.T) {
	g := NewWithT(t)
	p := NewPipeline([]Step{
		{Name: "a", Inputs: in("raw"), Outputs: in("x")},
		{Name: "b", Inputs: in("x"), Outputs: in("y", "y2")},
		{Name: "c", Inputs: in("y"), Outputs: in("z")},
	})
	producer, ok := p.Producer("y2")
	g.Expect(ok).To(BeTrue())
	g.Expect(producer).To(Equal("b"))
	_, ok = p.Producer("raw")
	g.Expect(ok).To(BeFalse(), "read from an under-store")

	files := p.Files(func(string, string) bool { return false })
	g.Expect(files.Depth("z")).To(Equal(3))
	g.Expect(files.Depth("y2")).To(Equal(2))
	checkpointedX := p.Files(func(_, out string) bool { return out == "x" })
	g.Expect(checkpointedX.Depth("z")).To(Equal(2), "a checkpoint ends the chain a loss would recompute")
}

func TestDownstreamGoesThroughTheDatasetsItIsToldTo(t *testing.T) {
	p := NewPipeline([]Step{
		{Name: "a", Inputs: in("raw"), Outputs: in("x")},
		{Name: "b", Inputs: in("x"), Outputs: in("y")},
		{Name: "c", Inputs: in("y", "raw2"), Outputs: in("z")},
		{Name: "side", Inputs: in("x"), Outputs: in("s")},
		{Name: "loop1", Inputs: in("l2"), Outputs: in("l1")},
		{Name: "loop2", Inputs: in("l1"), Outputs: in("l2")},
	})
	all := func(string) bool { return true }
	for _, tc := range []struct {
		name    string
		from    []string
		through func(string) bool
		want    []string
	}{
		{"every step after x", in("x"), all, in("s", "y", "z")},
		{"not past a Dataset that is there", in("x"), func(d string) bool { return d != "y" }, in("s")},
		{"nothing reads it", in("z"), all, nil},
		{"from several", in("y", "raw"), all, in("s", "x", "y", "z")},
		{"a cycle ends", in("l1"), all, in("l1", "l2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(p.Downstream(tc.from, tc.through)).To(Equal(tc.want))
		})
	}
}
