package replication_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/replication"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// BenchmarkAPassOnABusyNode is a replication pass with nothing to copy, as a worker makes one
// every few seconds: the node holds 50,000 cached blocks of sources (clean) and 20 output
// blocks of a Dataset that is not replicated.
//
//	go test -run '^$' -bench APassOnABusyNode -benchtime 20x ./cacheworker/replication/
func BenchmarkAPassOnABusyNode(b *testing.B) {
	const cached, outputs = 50_000, 20
	ctx := context.Background()
	dir, err := os.MkdirTemp("/dev/shm", "strata-bench-pass-")
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
	raw, err := json.Marshal(policy.File{})
	if err != nil {
		b.Fatal(err)
	}
	set, err := policy.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	r := replication.New(replication.Config{Self: "pool/node-a", Node: "node-a", Store: store, Policies: func() *policy.Set { return set }, Log: logr.Discard()})
	b.ResetTimer()
	for range b.N {
		if res, err := r.Pass(ctx); err != nil || res.Copied != 0 {
			b.Fatalf("pass: %+v, %v", res, err)
		}
	}
}
