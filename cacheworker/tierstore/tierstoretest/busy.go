// Package tierstoretest makes tier stores for tests and benchmarks of what works on one.
package tierstoretest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// OutputDataset is the Dataset of the output blocks BusyNode holds, under OutputRoot.
const (
	OutputDataset = "ns/out/u1"
	OutputRoot    = "/strata/ns/out"
)

// BusyNode is a tier store whose MEM tier is on /dev/shm (a temporary folder when there is
// none), holding what a busy node does: cached copies of sources (clean blocks, one per file)
// and a few output files of OutputDataset not yet checkpointed (one block each, not clean).
func BusyNode(tb testing.TB, cached, outputs int) *tierstore.Store {
	tb.Helper()
	ctx := context.Background()
	dir, err := os.MkdirTemp("/dev/shm", "strata-busy-node-")
	if err != nil {
		dir = tb.TempDir()
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	store, err := tierstore.Open(ctx, tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{dir}, Quota: 1 << 30}},
		IndexDir: filepath.Join(tb.TempDir(), "index"),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = store.Close() })
	put := func(id string, origin *workerpb.BlockOrigin, clean bool) {
		raw, err := proto.Marshal(origin)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := store.Put(ctx, id, bytes.NewReader([]byte{1}), 1, tierstore.PutOptions{Origin: raw, Clean: clean}); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range cached {
		put(fmt.Sprintf("src-%06d", i), &workerpb.BlockOrigin{Path: fmt.Sprintf("/strata/ns/in/f-%06d", i), Dataset: "ns/in/u0", SourceVersion: "v1"}, true)
	}
	for i := range outputs {
		token := fmt.Sprintf("%032x", i)
		put(blockindex.OutputBlockID(token, 0), &workerpb.BlockOrigin{Path: fmt.Sprintf("%s/part-%02d", OutputRoot, i), Dataset: OutputDataset, FileToken: token}, false)
	}
	return store
}
