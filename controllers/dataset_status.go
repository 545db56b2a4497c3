package controllers

// The status of a Dataset (its conditions, phase and counts), set from what the reconciler
// found; nothing here changes the cluster.

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/humanize"
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
		meta.RemoveStatusCondition(&ds.Status.Conditions, datav1alpha1.ConditionPreloaded)
	}
	switch {
	case ready.Status != metav1.ConditionTrue:
		ds.Status.Phase = datav1alpha1.DatasetPending
	case preloaded != nil && preloaded.Reason == datav1alpha1.ReasonPreloading:
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
		ds.Status.Size = humanize.Bytes(usage.GetTotalBytes())
	}
	ds.Status.CheckpointedBytes = usage.GetCheckpointedBytes()
	ds.Status.CachedBytes = usage.GetCachedBytes()
	ds.Status.Replicas = 0
	if ds.Spec.Lineage != nil {
		ds.Status.Replicas = int32(usage.GetMinCopies())
	}
	ds.Status.CachedPercentage = ""
	if total := ds.Status.TotalBytes; total > 0 {
		ds.Status.CachedPercentage = humanize.Percent(usage.GetCachedBytes(), total)
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

// setSourceSummary records what a probe counted; an incomplete count leaves the old one.
func setSourceSummary(ds *datav1alpha1.Dataset, sum *sourceSummary) {
	if sum == nil || !sum.complete {
		return
	}
	ds.Status.Files = sum.files
	ds.Status.TotalBytes = sum.bytes
	ds.Status.Size = humanize.Bytes(sum.bytes)
	ds.Status.LeftOutObjects = int64(len(sum.leftOut))
	ds.Status.LeftOut = nil
	for _, o := range sum.leftOut[:min(len(sum.leftOut), maxLeftOutNamed)] {
		ds.Status.LeftOut = append(ds.Status.LeftOut, datav1alpha1.LeftOutObject{Key: o.Key, Reason: o.Reason})
	}
}

// setSourceReachable records whether a Dataset's source answered its last probe. While a
// source that served before is unreachable (outage), the condition says since when and what
// pods get meanwhile; the Ready condition stays as it was, since the cache serves on.
func setSourceReachable(ds *datav1alpha1.Dataset, probed *sourceSummary, outage, p *problem) {
	if outage == nil && p != nil && p.reason == ReasonSourceUnreachable {
		outage = p
	}
	switch {
	case outage != nil:
		since := time.Now().UTC()
		if c := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionSourceReachable); c != nil && c.Status == metav1.ConditionFalse {
			since = c.LastTransitionTime.UTC()
		}
		msg := fmt.Sprintf("unreachable since %s: %s", since.Format(time.RFC3339), outage.message)
		if p == nil {
			msg += "; meanwhile pods read what the nodes cache: a node mounts the Dataset with the last good listing it or another node keeps, " +
				"and a file that is not cached fails with EIO until the source answers again"
		}
		meta.SetStatusCondition(&ds.Status.Conditions, metav1.Condition{
			Type: datav1alpha1.ConditionSourceReachable, Status: metav1.ConditionFalse, Reason: ReasonSourceUnreachable,
			Message: msg, ObservedGeneration: ds.Generation,
		})
	case probed != nil:
		meta.SetStatusCondition(&ds.Status.Conditions, metav1.Condition{
			Type: datav1alpha1.ConditionSourceReachable, Status: metav1.ConditionTrue, Reason: ReasonSourceReachable,
			Message: "the source answers its listing", ObservedGeneration: ds.Generation,
		})
	}
}

// setCheckpointTarget records an output's CheckpointTargetReachable condition, or removes it
// from a Dataset that has no spec.checkpoint (any more).
func setCheckpointTarget(ds *datav1alpha1.Dataset, cond *metav1.Condition) {
	if cond == nil {
		meta.RemoveStatusCondition(&ds.Status.Conditions, datav1alpha1.ConditionCheckpointTargetReachable)
		return
	}
	meta.SetStatusCondition(&ds.Status.Conditions, *cond)
}

// setMountedView makes the status count the tree the mounts show, when a node mounts the
// Dataset: the same listing they serve, not a later one of the operator's.
func setMountedView(ds *datav1alpha1.Dataset, view *DatasetView) {
	if view == nil {
		return
	}
	ds.Status.Files = view.Files
	ds.Status.TotalBytes = view.Bytes
	ds.Status.Size = humanize.Bytes(view.Bytes)
}

// setSyncFailed records a sync that did not reach every mount in the Synced condition, and
// reports whether the condition says something new (an event is then due).
func setSyncFailed(ds *datav1alpha1.Dataset, msg string) bool {
	was := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionSynced)
	meta.SetStatusCondition(&ds.Status.Conditions, metav1.Condition{
		Type: datav1alpha1.ConditionSynced, Status: metav1.ConditionFalse, Reason: ReasonSyncFailed, Message: msg, ObservedGeneration: ds.Generation,
	})
	return was == nil || was.Status != metav1.ConditionFalse || was.Message != msg
}

// setSynced records a sync that reached every mount, answering request, in status.sync and the
// Synced condition, and returns the condition's message.
func setSynced(ds *datav1alpha1.Dataset, out SyncOutcome, request string, at time.Time) string {
	ds.Status.Sync = &datav1alpha1.DatasetSyncStatus{
		LastSyncTime: &metav1.Time{Time: at}, Request: request, Mounts: out.Mounts,
		Added: out.Added, Removed: out.Removed, Changed: out.Changed,
	}
	msg := fmt.Sprintf("synced with the source on %d node(s) that mount the Dataset: %d file(s) added, %d removed, %d changed",
		out.Mounts, out.Added, out.Removed, out.Changed)
	if out.Mounts == 0 {
		msg = "no node mounts the Dataset; the next node to mount it lists the source"
	}
	meta.SetStatusCondition(&ds.Status.Conditions, metav1.Condition{
		Type: datav1alpha1.ConditionSynced, Status: metav1.ConditionTrue, Reason: ReasonSynced, Message: msg, ObservedGeneration: ds.Generation,
	})
	return msg
}
