package controllers

import (
	"testing"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
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

func TestAnOutputsSizeComesFromTheMaster(t *testing.T) {
	usage := &masterpb.DatasetUsage{Files: 3, TotalBytes: 300, CachedBytes: 150, CheckpointedBytes: 100}

	out := &datav1alpha1.Dataset{Spec: datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "step"}}}
	setUsage(out, usage)
	if st := out.Status; st.Files != 3 || st.TotalBytes != 300 || st.CachedPercentage != "50%" || st.CheckpointedBytes != 100 {
		t.Errorf("an output's status = %+v; want 3 files, 300 bytes, 50%% cached, 100 checkpointed, as the master says", st)
	}

	// A Dataset read from a source keeps the size its source probe found.
	src := &datav1alpha1.Dataset{Spec: datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: "s3://b/p"}}}
	src.Status.TotalBytes, src.Status.Files = 600, 6
	setUsage(src, usage)
	if st := src.Status; st.Files != 6 || st.TotalBytes != 600 || st.CachedPercentage != "25%" {
		t.Errorf("a source Dataset's status = %+v; want its probed 6 files and 600 bytes, 25%% cached", st)
	}
}
