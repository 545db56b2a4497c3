package dataplane

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/testenv"
)

// BenchmarkANewMountTakesAPeersListing compares, in one run on the same objects, the two ways a
// node's new mount gets its tree: listing the source (a real MinIO holding STRATA_BENCH_OBJECTS
// small objects, 100,000 by default), and taking the listing another node's mount shows, from
// that worker over gRPC (GetListing, mounted_only), which gives every node one tree.
//
//	STRATA_BENCH_OBJECTS=100000 go test -run '^$' -bench ANewMountTakesAPeersListing -benchtime 3x ./cacheworker/dataplane/
func BenchmarkANewMountTakesAPeersListing(b *testing.B) {
	n := testenv.BenchObjects(b, 100_000)
	srv := miniotest.Start(b)
	srv.MakeBucket(b, "data")
	srv.PutMany(b, "data", n, miniotest.TrainingKey, 100)
	store, err := understore.NewS3(understore.S3Config{Endpoint: srv.Endpoint, Bucket: "data", AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	kept, err := listings.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	peer := listingWorker(b, kept, "bench") // the other node, whose mount shows the listing kept
	peers := newPeers(b)
	ctx := context.Background()

	var fromSource, fromPeer time.Duration
	for b.Loop() {
		start := time.Now()
		listed := 0
		for _, err := range (&listings.Lister{Source: store, UID: "bench", Store: kept, Log: logr.Discard()}).List(ctx, "") {
			if err != nil {
				b.Fatal(err)
			}
			listed++
		}
		fromSource += time.Since(start)
		start = time.Now()
		l, err := peers.GetListing(ctx, peer, "bench", true)
		if err != nil {
			b.Fatal(err)
		}
		fromPeer += time.Since(start)
		if listed != n || len(l.Objects) != n {
			b.Fatalf("listed %d objects from MinIO and %d from the peer, of %d", listed, len(l.Objects), n)
		}
	}
	b.ReportMetric(fromSource.Seconds()/float64(b.N), "s/list-source")
	b.ReportMetric(fromPeer.Seconds()/float64(b.N), "s/take-peer")
	b.ReportMetric(fromSource.Seconds()/fromPeer.Seconds(), "x-faster")
}
