package controllers

import (
	"testing"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

func TestAnOutputsPhaseFollowsItsLineage(t *testing.T) {
	cases := []struct {
		phase datav1alpha1.DatasetPhase
		state datav1alpha1.OutputState
		want  datav1alpha1.DatasetPhase
	}{
		{datav1alpha1.DatasetReady, datav1alpha1.OutputPending, datav1alpha1.DatasetLoading},
		{datav1alpha1.DatasetReady, datav1alpha1.OutputInMemory, datav1alpha1.DatasetReady},
		{datav1alpha1.DatasetReady, datav1alpha1.OutputCheckpointed, datav1alpha1.DatasetReady},
		{datav1alpha1.DatasetReady, datav1alpha1.OutputLost, datav1alpha1.DatasetDegraded},
		{datav1alpha1.DatasetReady, datav1alpha1.OutputRecomputing, datav1alpha1.DatasetRecomputing},
		// A Dataset that cannot be served says so whatever its Lineage reports.
		{datav1alpha1.DatasetPending, datav1alpha1.OutputLost, datav1alpha1.DatasetPending},
	}
	for _, tc := range cases {
		ds := &datav1alpha1.Dataset{Status: datav1alpha1.DatasetStatus{Phase: tc.phase}}
		setOutputPhase(ds, tc.state)
		if ds.Status.Phase != tc.want {
			t.Errorf("phase %s, output %s: got %s, want %s", tc.phase, tc.state, ds.Status.Phase, tc.want)
		}
	}
}
