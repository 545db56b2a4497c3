package controllers

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// step is a Lineage reading inputs and writing outputs, its Ready condition's reason ready
// ("" for none yet), and a recomputation running if recomputing.
func step(name, ready string, inputs, outputs []string, recomputing bool) datav1alpha1.Lineage {
	l := datav1alpha1.Lineage{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: datav1alpha1.LineageSpec{Inputs: inputs, Outputs: outputs}}
	if ready != "" {
		l.Status.Conditions = []metav1.Condition{{Type: datav1alpha1.ConditionReady, Reason: ready}}
	}
	if recomputing {
		l.Status.ActiveRecomputation = &datav1alpha1.RecomputationStatus{JobName: name + "-recompute"}
	}
	return l
}

func TestNextUsesCountTheStagesBeforeAStepReadsADataset(t *testing.T) {
	in := func(names ...string) []string { return names }
	cases := map[string]struct {
		lineages []datav1alpha1.Lineage
		want     map[string]int
	}{
		"a chain: the running step reads now, each later one a stage further": {
			lineages: []datav1alpha1.Lineage{
				step("a", ReasonWritten, in("raw"), in("x"), false),
				step("b", ReasonRunning, in("x"), in("y"), false),
				step("c", ReasonWaitingForInputs, in("y"), in("z"), false),
				step("d", "", in("z", "raw"), in("w"), false),
			},
			want: map[string]int{"x": 0, "y": 1, "z": 2, "raw": 2},
		},
		"a dataset read by two steps is as near as the nearer": {
			lineages: []datav1alpha1.Lineage{
				step("a", ReasonRunning, in("raw"), in("x"), false),
				step("b", ReasonWaitingForInputs, in("x"), in("y"), false),
				step("c", ReasonRunning, in("x2"), in("y2"), false),
				step("d", ReasonWaitingForInputs, in("y", "y2"), in("z"), false),
			},
			want: map[string]int{"raw": 0, "x": 1, "x2": 0, "y": 2, "y2": 2},
		},
		"written steps read nothing more; a recomputation reads again": {
			lineages: []datav1alpha1.Lineage{
				step("a", ReasonWritten, in("raw"), in("x"), false),
				step("b", ReasonWritten, in("x"), in("y"), true),
			},
			want: map[string]int{"x": 0},
		},
		"a step behind a failed one never reads": {
			lineages: []datav1alpha1.Lineage{
				step("a", ReasonJobFailed, in("raw"), in("x"), false),
				step("b", ReasonWaitingForInputs, in("x"), in("y"), false),
			},
			want: map[string]int{},
		},
		"a cycle never runs": {
			lineages: []datav1alpha1.Lineage{
				step("a", "", in("y"), in("x"), false),
				step("b", "", in("x"), in("y"), false),
			},
			want: map[string]int{},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Expect(nextUses(tc.lineages)).To(Equal(tc.want))
		})
	}
}
