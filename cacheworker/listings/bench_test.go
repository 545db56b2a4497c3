package listings

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/testenv"
)

// BenchmarkListAMillionObjectsFromMinIO puts a million small objects (STRATA_BENCH_OBJECTS
// changes how many) into a real MinIO, then lists them as a mount does (understore's S3 lister
// through a Lister, which keeps the listing on disk), and reports the listing's time, its rate
// and the bytes the kept listing takes per object. Putting the objects takes most of the run.
//
//	go test -run '^$' -bench ListAMillionObjects -benchtime 1x -timeout 2h ./cacheworker/listings/
func BenchmarkListAMillionObjectsFromMinIO(b *testing.B) {
	n := testenv.BenchObjects(b, 1_000_000)
	srv := miniotest.Start(b)
	srv.MakeBucket(b, "data")
	start := time.Now()
	srv.PutMany(b, "data", n, miniotest.TrainingKey, 100)
	b.Logf("put %d objects in %s (%.0f/s)", n, time.Since(start).Round(time.Second), float64(n)/time.Since(start).Seconds())
	store, err := understore.NewS3(understore.S3Config{Endpoint: srv.Endpoint, Bucket: "data", AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	kept, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		l := &Lister{Source: store, UID: "bench", Store: kept, Log: logr.Discard()}
		start := time.Now()
		listed := 0
		for _, err := range l.List(context.Background(), "") {
			if err != nil {
				b.Fatal(err)
			}
			listed++
		}
		took := time.Since(start)
		if listed != n {
			b.Fatalf("listed %d objects of %d", listed, n)
		}
		st, err := os.Stat(filepath.Join(kept.dir, "bench.gob"))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(took.Seconds(), "s/list")
		b.ReportMetric(float64(n)/took.Seconds(), "objects/s")
		b.ReportMetric(float64(st.Size())/float64(n), "kept-B/object")
	}
}
