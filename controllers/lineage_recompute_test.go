package controllers

import (
	"slices"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/strata-cache/strata/master/masterpb"
)

func TestAvoidNodes(t *testing.T) {
	hostIn := func(values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: values}
	}
	gpu := corev1.NodeSelectorRequirement{Key: "gpu", Operator: corev1.NodeSelectorOpExists}
	notLost := corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"lost-1", "lost-2"}}
	required := func(terms ...[]corev1.NodeSelectorRequirement) *corev1.Affinity {
		sel := &corev1.NodeSelector{}
		for _, exprs := range terms {
			sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, corev1.NodeSelectorTerm{MatchExpressions: exprs})
		}
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: sel}}
	}
	preferred := []corev1.PreferredSchedulingTerm{{Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{hostIn("a")}}}}

	tests := map[string]struct {
		affinity *corev1.Affinity
		nodes    []string
		want     *corev1.Affinity
	}{
		"no lost node changes nothing": {affinity: nil, nodes: nil, want: nil},
		"a pod without affinity gets the exclusion alone": {
			nodes: []string{"lost-1", "lost-2"},
			want:  required([]corev1.NodeSelectorRequirement{notLost}),
		},
		"a preference is kept beside the exclusion": {
			affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: preferred}},
			nodes:    []string{"lost-1", "lost-2"},
			want: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: preferred,
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
					{MatchExpressions: []corev1.NodeSelectorRequirement{notLost}}}},
			}},
		},
		"every term of a required affinity gets the exclusion": {
			affinity: required([]corev1.NodeSelectorRequirement{hostIn("a", "lost-1")}, []corev1.NodeSelectorRequirement{gpu}),
			nodes:    []string{"lost-1", "lost-2"},
			want:     required([]corev1.NodeSelectorRequirement{hostIn("a", "lost-1"), notLost}, []corev1.NodeSelectorRequirement{gpu, notLost}),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			spec := &corev1.PodSpec{Affinity: tc.affinity}
			avoidNodes(spec, tc.nodes)
			if !apiequality.Semantic.DeepEqual(spec.Affinity, tc.want) {
				t.Errorf("got affinity %+v, want %+v", spec.Affinity, tc.want)
			}
		})
	}
}

func TestOnDisruptions(t *testing.T) {
	ignore := batchv1.PodFailurePolicyRule{
		Action:          batchv1.PodFailurePolicyActionIgnore,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
	}
	exitTwo := batchv1.PodFailurePolicyRule{
		Action:          batchv1.PodFailurePolicyActionFailJob,
		OnExitCodes:     &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{2}},
		OnPodConditions: nil,
	}
	job := func(restart corev1.RestartPolicy, rules ...batchv1.PodFailurePolicyRule) batchv1.JobSpec {
		spec := batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: restart}}}
		if rules != nil {
			spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: rules}
		}
		return spec
	}
	tests := map[string]struct{ spec, want batchv1.JobSpec }{
		"pods never restarted get the rule":            {job(corev1.RestartPolicyNever), job(corev1.RestartPolicyNever, ignore)},
		"the template's own rules come after it":       {job(corev1.RestartPolicyNever, exitTwo), job(corev1.RestartPolicyNever, ignore, exitTwo)},
		"pods restarted in place cannot have a policy": {job(corev1.RestartPolicyOnFailure), job(corev1.RestartPolicyOnFailure)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			onDisruptions(&tc.spec, batchv1.PodFailurePolicyActionIgnore)
			if !apiequality.Semantic.DeepEqual(tc.spec, tc.want) {
				t.Errorf("got %+v, want %+v", tc.spec.PodFailurePolicy, tc.want.PodFailurePolicy)
			}
		})
	}
}

func TestLostNodesOf(t *testing.T) {
	w := func(node string, state masterpb.WorkerState) *masterpb.Worker {
		return &masterpb.Worker{Id: "pool/" + node, Node: node, State: state}
	}
	lost, alive := masterpb.WorkerState_WORKER_STATE_LOST, masterpb.WorkerState_WORKER_STATE_ALIVE
	tests := map[string]struct {
		workers []*masterpb.Worker
		want    []string
	}{
		"no worker":                   {},
		"every worker alive":          {workers: []*masterpb.Worker{w("a", alive), w("b", alive)}},
		"lost workers name the nodes": {workers: []*masterpb.Worker{w("b", lost), w("a", lost), w("c", alive)}, want: []string{"a", "b"}},
		"a node with a live worker is well, whatever else it lost (a deleted pool's)": {
			workers: []*masterpb.Worker{w("a", lost), w("a", alive)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := lostNodesOf(tc.workers); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
