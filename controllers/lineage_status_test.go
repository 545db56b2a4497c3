package controllers

import (
	"context"
	"reflect"
	"testing"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

func TestALineagesReadyConditionFollowsItsJob(t *testing.T) {
	l := &datav1alpha1.Lineage{ObjectMeta: metav1.ObjectMeta{Name: "train", UID: "l-uid"}, Spec: datav1alpha1.LineageSpec{Outputs: []string{"model"}}}
	owned := func(conds ...batchv1.JobCondition) *batchv1.Job {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train-run"}, Status: batchv1.JobStatus{Conditions: conds}}
		j.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(l, datav1alpha1.GroupVersion.WithKind("Lineage"))}
		return j
	}
	cases := []struct {
		name    string
		job     *batchv1.Job
		reason  string
		message string
	}{
		{name: "a Job of another owner", job: &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train-run"}}, reason: ReasonJobFailed, message: "does not own is in the way"},
		{name: "running", job: owned(), reason: ReasonRunning, message: "is writing model"},
		{name: "a condition not true yet", job: owned(batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionFalse}), reason: ReasonRunning},
		{name: "written", job: owned(batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}), reason: ReasonWritten, message: "wrote model"},
		{name: "failed", job: owned(batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"}),
			reason: ReasonJobFailed, message: "BackoffLimitExceeded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c := runCondition(l, tc.job)
			g.Expect(c.Type).To(Equal(datav1alpha1.ConditionReady))
			g.Expect(c.Reason).To(Equal(tc.reason))
			want := metav1.ConditionFalse
			if tc.reason == ReasonWritten {
				want = metav1.ConditionTrue
			}
			g.Expect(c.Status).To(Equal(want))
			g.Expect(c.Message).To(ContainSubstring(tc.message))
		})
	}
}

func TestALineageIsCheckedAgainstItsNamespaceBeforeItRuns(t *testing.T) {
	output := func(name, lineage string) datav1alpha1.Dataset {
		return datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: lineage}}}
	}
	input := datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "raw"}, Spec: datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: "s3://b/"}}}
	cases := []struct {
		name     string
		lineages []datav1alpha1.Lineage
		datasets []datav1alpha1.Dataset
		reason   string // "" for none: it may run
	}{
		{name: "fine", lineages: []datav1alpha1.Lineage{step("a", "", []string{"raw"}, []string{"x"}, false)},
			datasets: []datav1alpha1.Dataset{input, output("x", "a")}},
		{name: "a missing input", lineages: []datav1alpha1.Lineage{step("a", "", []string{"raw"}, []string{"x"}, false)},
			datasets: []datav1alpha1.Dataset{output("x", "a")}, reason: ReasonInputNotFound},
		{name: "an output of another Lineage", lineages: []datav1alpha1.Lineage{step("a", "", []string{"raw"}, []string{"x"}, false)},
			datasets: []datav1alpha1.Dataset{input, output("x", "b")}, reason: ReasonOutputNotDeclared},
		{name: "a cycle", lineages: []datav1alpha1.Lineage{step("a", "", []string{"y"}, []string{"x"}, false), step("b", "", []string{"x"}, []string{"y"}, false)},
			datasets: []datav1alpha1.Dataset{output("x", "a"), output("y", "b")}, reason: ReasonCycle},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ns := &namespace{datasets: map[string]*datav1alpha1.Dataset{}, lineages: map[string]*datav1alpha1.Lineage{}, pipeline: pipelineOf(tc.lineages)}
			for i := range tc.datasets {
				ns.datasets[tc.datasets[i].Name] = &tc.datasets[i]
			}
			for i := range tc.lineages {
				ns.lineages[tc.lineages[i].Name] = &tc.lineages[i]
			}
			c := checkLineage(&tc.lineages[0], ns)
			if tc.reason == "" {
				g.Expect(c).To(BeNil())
				return
			}
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(tc.reason))
		})
	}
}

// TestAnOutputNotReadyKeepsWhatTheMasterHeld: while a Lineage is not Ready (its pods' files
// published again, an input gone for a while), its outputs are Pending but keep the bytes the
// master held, so that a master that forgot them meanwhile is found out once it is Ready again.
func TestAnOutputNotReadyKeepsWhatTheMasterHeld(t *testing.T) {
	l := &datav1alpha1.Lineage{
		Spec: datav1alpha1.LineageSpec{Outputs: []string{"index", "new"}},
		Status: datav1alpha1.LineageStatus{Outputs: []datav1alpha1.LineageOutputStatus{
			{Name: "index", State: datav1alpha1.OutputInMemory, Bytes: 100, Replicas: 1},
		}},
	}
	(&LineageReconciler{}).setOutputs(context.Background(), l, false)
	want := []datav1alpha1.LineageOutputStatus{
		{Name: "index", State: datav1alpha1.OutputPending, Bytes: 100},
		{Name: "new", State: datav1alpha1.OutputPending},
	}
	if !reflect.DeepEqual(l.Status.Outputs, want) {
		t.Errorf("outputs %+v, want %+v", l.Status.Outputs, want)
	}
}
