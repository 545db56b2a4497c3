package outputfs_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/internal/dfsperf"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestDFSPerfWorkloadsRunThroughAnOutputMount runs every workload of strata-bench through an
// output mount: write-once files (sealed at close, written at any offsets before), stat,
// listings, removals of sealed files and renames of folders all hold, the master has the
// files written, and every seal is timed in the seal histogram.
func TestDFSPerfWorkloadsRunThroughAnOutputMount(t *testing.T) {
	fusetest.Require(t)
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorker(t, master, "pool/node-a", 256<<20)
	reg := prometheus.NewRegistry()
	metrics, err := outputfs.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	mnt := mountOutputIn(t, master, w, blockSize, filepath.Join(t.TempDir(), "staging"), testr.New(t),
		func(c *outputfs.Config) { c.Metrics = metrics })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := dfsperf.NewRunner(dfsperf.Config{
		Dir: mnt.Dir(), Threads: 2, Files: 5, FileSize: 100_000, IOSize: 16 << 10, ReadShare: 0.5, Rounds: 2, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, wl := range dfsperf.Workloads {
		res, err := r.Run(ctx, wl)
		if err != nil {
			t.Fatal(err)
		}
		if res.Ops == 0 {
			t.Errorf("%s made no operation", wl.Name)
		}
	}
	files, err := masterFiles(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	if size, ok := files["strata-bench/iterative/round1/t1/f4"]; !ok || size != 100_000 {
		t.Errorf("the master has the last round's last file at %d bytes (%v), want 100000", size, ok)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("removing what the workloads wrote: %v", err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sealed float64
	var timed uint64
	for _, f := range families {
		switch f.GetName() {
		case "strata_worker_output_sealed_files_total":
			sealed = f.GetMetric()[0].GetCounter().GetValue()
		case "strata_worker_output_seal_seconds":
			timed = f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	// create's 10 empty files, seq-write's and rand-write's 10 each, iterative's 20, and mixed's writes.
	if sealed < 50 || timed != uint64(sealed) {
		t.Errorf("%v files sealed, %d seals timed: want at least 50, each timed", sealed, timed)
	}
}
