package dfsperf_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-cache/strata/internal/dfsperf"
)

func smallConfig(dir string) dfsperf.Config {
	return dfsperf.Config{Dir: dir, Threads: 3, Files: 4, FileSize: 10_000, IOSize: 4096, ReadShare: 0.5, Rounds: 3, Seed: 7}
}

// TestEveryWorkloadCountsWhatItDid runs every workload on a folder and checks the operations
// and bytes each reports against what its definition makes.
func TestEveryWorkloadCountsWhatItDid(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	r, err := dfsperf.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	files := int64(cfg.Threads * cfg.Files)
	writesPerFile := (cfg.FileSize + int64(cfg.IOSize) - 1) / int64(cfg.IOSize) // 3 writes: 4096, 4096, 1808
	want := map[string]struct{ ops, bytes int64 }{
		"create":     {files, 0},
		"exists":     {files, 0},
		"rename":     {files, 0},
		"list":       {files, 0},
		"delete":     {files, 0},
		"seq-write":  {files * writesPerFile, files * cfg.FileSize},
		"rand-write": {files * writesPerFile, files * cfg.FileSize},
		// Each file's three reads, and the one that finds its end.
		"seq-read":  {files * (writesPerFile + 1), files * cfg.FileSize},
		"rand-read": {files * (cfg.FileSize / int64(cfg.IOSize)), -1},
		// Round 0 writes; rounds 1 and 2 read the round before's files whole and write.
		"iterative": {files*writesPerFile*3 + 2*files*(writesPerFile+1), 3*files*cfg.FileSize + 2*files*cfg.FileSize},
	}
	for _, w := range dfsperf.Workloads {
		res, err := r.Run(context.Background(), w)
		if err != nil {
			t.Fatalf("%s: %v", w.Name, err)
		}
		if res.Workload != w.Name || res.Threads != cfg.Threads || res.Seconds <= 0 || res.P99Micros < res.P50Micros {
			t.Errorf("%s: result %+v", w.Name, res)
		}
		exp, ok := want[w.Name]
		if !ok {
			if res.Ops == 0 { // mixed: its split of reads and writes is random
				t.Errorf("%s: no operation", w.Name)
			}
			continue
		}
		if res.Ops != exp.ops || exp.bytes >= 0 && res.Bytes != exp.bytes {
			t.Errorf("%s: %d ops, %d bytes; want %d ops, %d bytes", w.Name, res.Ops, res.Bytes, exp.ops, exp.bytes)
		}
	}
	written, err := os.ReadFile(filepath.Join(cfg.Dir, "strata-bench", "iterative", "round2", "t1", "f3"))
	if err != nil || int64(len(written)) != cfg.FileSize {
		t.Errorf("the last round's file: %d bytes (%v), want %d", len(written), err, cfg.FileSize)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "strata-bench")); !os.IsNotExist(err) {
		t.Errorf("the benchmark's folder is still there after Close (%v)", err)
	}
}

// A workload run alone runs what it needs first, untimed: the reads read files seq-write made.
func TestAWorkloadRunsWhatItNeedsFirst(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	r, err := dfsperf.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	for _, name := range []string{"delete", "seq-read"} {
		w, _ := dfsperf.Lookup(name)
		res, err := r.Run(context.Background(), w)
		if err != nil {
			t.Fatal(err)
		}
		if res.Ops == 0 {
			t.Errorf("%s did nothing", name)
		}
	}
}

// With --read-dir, the reads read that folder's files, shared among the threads.
func TestReadsReadTheReadFolder(t *testing.T) {
	cfg := smallConfig(t.TempDir())
	cfg.ReadDir = t.TempDir()
	for _, name := range []string{"a", "b", filepath.Join("sub", "c")} {
		p := filepath.Join(cfg.ReadDir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, 5000), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := dfsperf.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	w, _ := dfsperf.Lookup("seq-read")
	res, err := r.Run(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != 15000 {
		t.Errorf("read %d bytes, want the three files' 15000", res.Bytes)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "strata-bench", "seq-write")); !os.IsNotExist(err) {
		t.Errorf("seq-write ran although --read-dir has the files to read (%v)", err)
	}
}

func TestBadConfigurationsSayWhatToFix(t *testing.T) {
	dir := t.TempDir()
	empty := t.TempDir()
	tests := map[string]struct {
		change func(*dfsperf.Config)
		want   string
	}{
		"no folder":            {func(c *dfsperf.Config) { c.Dir = "" }, "--dir"},
		"no thread":            {func(c *dfsperf.Config) { c.Threads = 0 }, "--threads=0"},
		"no file":              {func(c *dfsperf.Config) { c.Files = 0 }, "--files=0"},
		"a read share of 2":    {func(c *dfsperf.Config) { c.ReadShare = 2 }, "--read-share=2"},
		"no write size":        {func(c *dfsperf.Config) { c.IOSize = 0 }, "--io-size=0"},
		"a folder not there":   {func(c *dfsperf.Config) { c.Dir = filepath.Join(dir, "missing") }, "no such file"},
		"an empty read folder": {func(c *dfsperf.Config) { c.Dir = t.TempDir(); c.ReadDir = empty }, "holds no file"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := smallConfig(dir)
			tc.change(&cfg)
			r, err := dfsperf.NewRunner(cfg)
			if err == nil {
				defer func() { _ = r.Close() }()
				w, _ := dfsperf.Lookup("seq-read")
				_, err = r.Run(context.Background(), w)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
