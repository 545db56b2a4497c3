package controllers

// The conditions of a Lineage, computed from what the reconciler found; nothing here changes
// the cluster.

import (
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// checkLineage checks l against its namespace: its inputs exist, its outputs name it, and it is
// on no cycle. It returns the Ready condition that says what is wrong, or nil.
func checkLineage(l *datav1alpha1.Lineage, ns *namespace) *metav1.Condition {
	for _, in := range l.Spec.Inputs {
		if _, ok := ns.datasets[in]; !ok {
			return notReady(ReasonInputNotFound, "input Dataset %q does not exist in namespace %s: create it, or remove it from spec.inputs", in, l.Namespace)
		}
	}
	for _, out := range l.Spec.Outputs {
		ds, ok := ns.datasets[out]
		if !ok || ds.Spec.Lineage == nil || ds.Spec.Lineage.Name != l.Name {
			return notReady(ReasonOutputNotDeclared,
				"output %q must be a Dataset of namespace %s with spec.lineage.name: %s, so that pods can mount it and lost data is recomputed: create it",
				out, l.Namespace, l.Name)
		}
	}
	if c := ns.cycle(l); c != "" {
		return notReady(ReasonCycle, "the Lineages form a cycle, %s: each reads an output of the one before, so none can run first; remove one of the inputs", c)
	}
	return nil
}

// runCondition is l's Ready condition from its Job: True once the Job wrote the outputs.
func runCondition(l *datav1alpha1.Lineage, job *batchv1.Job) *metav1.Condition {
	if !metav1.IsControlledBy(job, l) {
		return notReady(ReasonJobFailed, "a Job %s that this Lineage does not own is in the way: delete it or rename the Lineage", job.Name)
	}
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return &metav1.Condition{Type: datav1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonWritten,
				Message: fmt.Sprintf("Job %s wrote %s", job.Name, strings.Join(l.Spec.Outputs, ", "))}
		case batchv1.JobFailed:
			return notReady(ReasonJobFailed, "Job %s failed (%s: %s); it is not retried: see `kubectl logs job/%s`, fix the template, and recreate the Lineage",
				job.Name, c.Reason, c.Message, job.Name)
		}
	}
	return notReady(ReasonRunning, "Job %s is writing %s", job.Name, strings.Join(l.Spec.Outputs, ", "))
}

// checkpointedCondition says whether every output is in the under-store, and of those that are
// not, which have nowhere to go (no spec.checkpoint).
func checkpointedCondition(l *datav1alpha1.Lineage, ns *namespace) metav1.Condition {
	c := metav1.Condition{Type: datav1alpha1.ConditionCheckpointed, Status: metav1.ConditionFalse, Reason: ReasonNotCheckpointed,
		ObservedGeneration: l.Generation}
	var pending, nowhere []string
	for _, o := range l.Status.Outputs {
		switch {
		case o.State == datav1alpha1.OutputCheckpointed:
		case ns.datasets[o.Name] != nil && ns.datasets[o.Name].Spec.Checkpoint == nil:
			nowhere = append(nowhere, o.Name)
		default:
			pending = append(pending, o.Name)
		}
	}
	if len(pending)+len(nowhere) == 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, ReasonAllCheckpointed, "every output is in the under-store"
		return c
	}
	var parts []string
	if len(pending) > 0 {
		parts = append(parts, fmt.Sprintf("%s not checkpointed yet", strings.Join(pending, ", ")))
	}
	if len(nowhere) > 0 {
		parts = append(parts, fmt.Sprintf("%s never checkpointed: set spec.checkpoint on the Dataset to give it an under-store", strings.Join(nowhere, ", ")))
	}
	c.Message = fmt.Sprintf("%s; lineage recovers what is lost (depth %d)", strings.Join(parts, "; "), l.Status.UncheckpointedDepth)
	return c
}
