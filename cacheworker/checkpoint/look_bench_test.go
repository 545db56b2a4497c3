package checkpoint

import (
	"testing"

	"github.com/strata-cache/strata/cacheworker/tierstore/tierstoretest"
)

// BenchmarkALookAtABusyNode is one look of the checkpointer at a node's tier store, which a
// round takes and the background loop takes every Poll (5 s) even with nothing to do: the node
// holds 50,000 cached blocks of sources (clean) and 20 output files not yet checkpointed, of a
// Dataset that is checkpointed.
//
//	go test -run '^$' -bench ALookAtABusyNode -benchtime 20x ./cacheworker/checkpoint/
func BenchmarkALookAtABusyNode(b *testing.B) {
	const outputs = 20
	store := tierstoretest.BusyNode(b, 50_000, outputs)
	settings := settingsOf(b, Dataset{Name: tierstoretest.OutputDataset, Root: tierstoretest.OutputRoot, Strategy: "Edge",
		Target: Target{URI: "s3://bucket/out"}})
	b.ResetTimer()
	for range b.N {
		if files, _ := heldFiles(store, settings); len(files) != outputs {
			b.Fatalf("found %d files, want %d", len(files), outputs)
		}
	}
}
