package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/lineage"
)

// nextUses is, for every Dataset a Lineage of one namespace will still read, how many pipeline
// stages away that read is (Kariz's MRD distance; see lineage.Pipeline.NextUses).
func nextUses(lineages []datav1alpha1.Lineage) map[string]int {
	byName := make(map[string]*datav1alpha1.Lineage, len(lineages))
	for i := range lineages {
		byName[lineages[i].Name] = &lineages[i]
	}
	return pipelineOf(lineages).NextUses(func(step string) lineage.Phase { return phaseOf(byName[step]) })
}

// phaseOf says where a Lineage stands: running (its Job or a recomputation), done (written, and
// nothing lost), waiting (for its inputs or its outputs' claims, or not looked at yet), or never
// (failed or bad).
func phaseOf(l *datav1alpha1.Lineage) lineage.Phase {
	if l.Status.ActiveRecomputation != nil {
		return lineage.Running
	}
	ready := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionReady)
	if ready == nil {
		return lineage.Waiting
	}
	switch ready.Reason {
	case ReasonRunning, ReasonPublishing:
		return lineage.Running
	case ReasonWaitingForInputs, ReasonWaitingForOutputClaims:
		return lineage.Waiting
	case ReasonWritten:
		// Written, unless lost outputs wait for their inputs to be recomputed: then it runs again.
		if c := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionRecomputing); c != nil && c.Reason == ReasonWaitingForLostInputs {
			return lineage.Waiting
		}
		return lineage.Done
	default:
		return lineage.Never
	}
}
