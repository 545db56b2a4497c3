package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// setDatasetStatus writes the conditions and phase of a Dataset: a problem with what it refers
// to, or else whether its claim can be served. It is the only place that sets them on the
// normal path.
func setDatasetStatus(ds *datav1alpha1.Dataset, p *problem, serving *metav1.Condition) {
	ds.Status.ObservedGeneration = ds.Generation
	ready := metav1.Condition{Type: datav1alpha1.ConditionReady, ObservedGeneration: ds.Generation}
	switch {
	case p != nil:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, p.reason, p.message
	default:
		ready.Status, ready.Reason, ready.Message = serving.Status, serving.Reason, serving.Message
	}
	meta.SetStatusCondition(&ds.Status.Conditions, ready)
	meta.RemoveStatusCondition(&ds.Status.Conditions, ConditionDeletionBlocked)

	// Loading, Degraded, Lost and Recomputing come from the cache workers and the master, which
	// report cached and lost blocks; the operator alone knows only Pending or Ready.
	if ready.Status == metav1.ConditionTrue {
		ds.Status.Phase = datav1alpha1.DatasetReady
	} else {
		ds.Status.Phase = datav1alpha1.DatasetPending
	}
}

// setDeletionBlocked says why a deleted Dataset is still there.
func setDeletionBlocked(ds *datav1alpha1.Dataset, why string) {
	meta.SetStatusCondition(&ds.Status.Conditions, metav1.Condition{
		Type:               ConditionDeletionBlocked,
		Status:             metav1.ConditionTrue,
		Reason:             "UncheckpointedDependents",
		Message:            why,
		ObservedGeneration: ds.Generation,
	})
}
