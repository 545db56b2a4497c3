package controllers

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

// setDatasetStatus writes the conditions and phase of a Dataset: a problem with what it refers
// to, or else whether its claim can be served. It is the only place that sets them on the
// normal path.
func setDatasetStatus(ds *datav1alpha1.Dataset, p *problem, serving, preloaded *metav1.Condition) {
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
	if preloaded != nil {
		meta.SetStatusCondition(&ds.Status.Conditions, *preloaded)
	} else if ready.Status == metav1.ConditionTrue {
		// No preload asked for (any more); a Dataset not yet servable keeps what it had.
		meta.RemoveStatusCondition(&ds.Status.Conditions, ConditionPreloaded)
	}
	switch {
	case ready.Status != metav1.ConditionTrue:
		ds.Status.Phase = datav1alpha1.DatasetPending
	case preloaded != nil && preloaded.Reason == ReasonPreloading:
		// Servable already, and being read once so that pods find it warm.
		ds.Status.Phase = datav1alpha1.DatasetLoading
	default:
		ds.Status.Phase = datav1alpha1.DatasetReady
	}
}

// setOutputPhase refines the phase of a servable output Dataset from the state its Lineage
// reports: Loading until written, Degraded when lost, Recomputing while a Job writes it again.
func setOutputPhase(ds *datav1alpha1.Dataset, state datav1alpha1.OutputState) {
	if ds.Status.Phase != datav1alpha1.DatasetReady {
		return
	}
	switch state {
	case datav1alpha1.OutputPending:
		ds.Status.Phase = datav1alpha1.DatasetLoading
	case datav1alpha1.OutputLost:
		ds.Status.Phase = datav1alpha1.DatasetDegraded
	case datav1alpha1.OutputRecomputing:
		ds.Status.Phase = datav1alpha1.DatasetRecomputing
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

// setUsage records what the workers hold of a Dataset: cached bytes, their share of the source
// (rounded down, so 100% means every byte), and the bytes of each tier.
func setUsage(ds *datav1alpha1.Dataset, usage *masterpb.DatasetUsage) {
	if ds.Spec.Lineage != nil {
		// An output has no source to probe: its files are those written so far.
		ds.Status.TotalBytes = usage.GetTotalBytes()
		ds.Status.Files = int64(usage.GetFiles())
		ds.Status.Size = humanBytes(usage.GetTotalBytes())
	}
	ds.Status.CheckpointedBytes = usage.GetCheckpointedBytes()
	ds.Status.CachedBytes = usage.GetCachedBytes()
	ds.Status.CachedPercentage = ""
	if total := ds.Status.TotalBytes; total > 0 {
		ds.Status.CachedPercentage = fmt.Sprintf("%d%%", min(100, usage.GetCachedBytes()*100/total))
	}
	ds.Status.Tiers = nil
	for _, t := range usage.GetTiers() {
		ds.Status.Tiers = append(ds.Status.Tiers, datav1alpha1.TierUsage{Tier: t.GetTier(), Bytes: t.GetUsedBytes()})
	}
	ds.Status.Nodes = nil
	for _, n := range usage.GetNodes() {
		if len(ds.Status.Nodes) == datav1alpha1.MaxStatusNodes {
			break
		}
		ds.Status.Nodes = append(ds.Status.Nodes, datav1alpha1.NodeUsage{Node: n.GetNode(), Bytes: n.GetCachedBytes()})
	}
}
