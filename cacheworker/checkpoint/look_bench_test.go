package checkpoint

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// BenchmarkALookAtABusyNode is one look of the checkpointer at a node's tier store, which a
// round takes and the background loop takes every Poll (5 s) even with nothing to do: the node
// holds 50,000 cached blocks of sources (clean) and 20 output files not yet checkpointed, of a
// Dataset that is checkpointed.
//
//	go test -run '^$' -bench ALookAtABusyNode -benchtime 20x ./cacheworker/checkpoint/
func BenchmarkALookAtABusyNode(b *testing.B) {
	const cached, outputs = 50_000, 20
	ctx := context.Background()
	dir, err := os.MkdirTemp("/dev/shm", "strata-bench-look-")
	if err != nil {
		dir = b.TempDir()
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	store, err := tierstore.Open(ctx, tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{dir}, Quota: 1 << 30}},
		IndexDir: filepath.Join(b.TempDir(), "index"),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	put := func(id string, origin *workerpb.BlockOrigin, clean bool) {
		raw, err := proto.Marshal(origin)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := store.Put(ctx, id, bytes.NewReader([]byte{1}), 1, tierstore.PutOptions{Origin: raw, Clean: clean}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range cached {
		put(fmt.Sprintf("src-%06d", i), &workerpb.BlockOrigin{Path: fmt.Sprintf("/strata/ns/in/f-%06d", i), Dataset: "ns/in/u0", SourceVersion: "v1"}, true)
	}
	for i := range outputs {
		token := fmt.Sprintf("%032x", i)
		put(token+"-0", &workerpb.BlockOrigin{Path: fmt.Sprintf("/strata/ns/out/part-%02d", i), Dataset: "ns/out/u1", FileToken: token}, false)
	}
	settings := settingsOf(b, Dataset{Name: "ns/out/u1", Root: "/strata/ns/out", Strategy: "Edge", Target: Target{URI: "s3://bucket/out"}})
	b.ResetTimer()
	for range b.N {
		if files, _ := heldFiles(store, settings); len(files) != outputs {
			b.Fatalf("found %d files, want %d", len(files), outputs)
		}
	}
}
