package replication_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/replication"
	"github.com/strata-cache/strata/cacheworker/tierstore/tierstoretest"
)

// BenchmarkAPassOnABusyNode is a replication pass with nothing to copy, as a worker makes one
// every few seconds: the node holds 50,000 cached blocks of sources (clean) and 20 output
// blocks of a Dataset that is not replicated.
//
//	go test -run '^$' -bench APassOnABusyNode -benchtime 20x ./cacheworker/replication/
func BenchmarkAPassOnABusyNode(b *testing.B) {
	ctx := context.Background()
	store := tierstoretest.BusyNode(b, 50_000, 20)
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
