package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// Stages of a Lineage that are no number of steps away.
const (
	// stageDone: its Job wrote its outputs, and it reads nothing more.
	stageDone = -1
	// stageNever: it cannot run (it failed, it is bad, or it waits for a Lineage that cannot).
	stageNever = -2
)

// nextUses is, for every Dataset a Lineage of one namespace will still read, how many pipeline
// stages away that read is (Kariz's MRD distance): 0 when the reading Lineage runs, or may run
// now; when it waits, one more than the stage of the producer of the input it waits for. A
// Dataset no Lineage will read again (every reader has run, failed or is bad) has none.
func nextUses(lineages []datav1alpha1.Lineage) map[string]int {
	byName := map[string]*datav1alpha1.Lineage{}
	producer := map[string]string{}
	for i := range lineages {
		l := &lineages[i]
		byName[l.Name] = l
		for _, out := range l.Spec.Outputs {
			producer[out] = l.Name
		}
	}
	stages := map[string]int{}
	var stage func(name string, visiting map[string]bool) int
	stage = func(name string, visiting map[string]bool) int {
		if s, ok := stages[name]; ok {
			return s
		}
		if visiting[name] {
			return stageNever // a cycle: its Lineages never run (their Ready condition says Cycle)
		}
		visiting[name] = true
		defer delete(visiting, name)
		l := byName[name]
		var s int
		switch phaseOf(l) {
		case phaseDone:
			s = stageDone
		case phaseNever:
			s = stageNever
		case phaseRunning:
			s = 0
		case phaseWaiting:
			// It runs once its inputs' producers are done.
			for _, in := range l.Spec.Inputs {
				p, ok := producer[in]
				if !ok {
					continue // read from an under-store: there already
				}
				switch ps := stage(p, visiting); {
				case ps == stageNever:
					s = stageNever
				case ps >= 0 && s != stageNever:
					s = max(s, ps+1)
				}
			}
		}
		stages[name] = s
		return s
	}
	uses := map[string]int{}
	for i := range lineages {
		l := &lineages[i]
		s := stage(l.Name, map[string]bool{})
		if s < 0 {
			continue
		}
		for _, in := range l.Spec.Inputs {
			if u, ok := uses[in]; !ok || s < u {
				uses[in] = s
			}
		}
	}
	return uses
}

// phase is where a Lineage stands, for nextUses.
type phase int

const (
	phaseWaiting phase = iota // for its inputs, or not looked at yet
	phaseRunning              // its Job, or its recomputation
	phaseDone                 // written, nothing lost
	phaseNever                // failed or bad: it does not run
)

func phaseOf(l *datav1alpha1.Lineage) phase {
	if l.Status.ActiveRecomputation != nil {
		return phaseRunning
	}
	ready := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionReady)
	if ready == nil {
		return phaseWaiting
	}
	switch ready.Reason {
	case ReasonRunning:
		return phaseRunning
	case ReasonWaitingForInputs:
		return phaseWaiting
	case ReasonWritten:
		// Written, unless lost outputs wait for their inputs to be recomputed: then it runs again.
		if c := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionRecomputing); c != nil && c.Reason == ReasonWaitingForLostInputs {
			return phaseWaiting
		}
		return phaseDone
	default:
		return phaseNever
	}
}
