package fusefs

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/miniotest"
)

const (
	testBlockSize = 64 << 10
	sourceID      = "dataset-uid"
	bucket        = "data"
	prefix        = "sets/v1/"
)

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// dataset is the test Dataset: its files by path, and its empty folders.
type dataset struct {
	files   map[string][]byte
	markers []string
}

// testDataset has nested folders, a file of several blocks and a part, a file of exactly one
// block, a hundred small files, an empty file, an empty folder (a marker), and names with
// spaces and non-ASCII characters.
func testDataset() dataset {
	d := dataset{files: map[string][]byte{
		"big.bin":                  randomBytes(5*testBlockSize+1234, 1),
		"one-block.bin":            randomBytes(testBlockSize, 2),
		"données/été 2024.csv":     []byte("jour,température\n2024-07-01,31.5\n"),
		"nested/a/b/c/deep.txt":    []byte("deep down"),
		"nested/a/side by side.md": randomBytes(3*testBlockSize/2, 3),
		"empty.txt":                {},
	}, markers: []string{"empty folder/"}}
	for i := range 100 {
		d.files[fmt.Sprintf("small/part-%03d.txt", i)] = randomBytes(100+i*37, uint64(100+i))
	}
	return d
}

// fixture is a Dataset in a real MinIO read through a real tier store and cache.
type fixture struct {
	srv     *miniotest.Server
	data    dataset
	objects understore.Store
	store   *tierstore.Store
	cache   *cache.Cache
	reg     *prometheus.Registry
	m       *Metrics
	logs    *logLines
}

func newFixture(t *testing.T, data dataset) *fixture {
	t.Helper()
	f := &fixture{srv: miniotest.Start(t), data: data, reg: prometheus.NewRegistry(), logs: &logLines{}}
	f.srv.MakeBucket(t, bucket)
	for p, b := range data.files {
		f.srv.Put(t, bucket, prefix+p, b)
	}
	for _, p := range data.markers {
		f.srv.Put(t, bucket, prefix+p, nil)
	}
	var err error
	f.objects, err = understore.NewS3(understore.S3Config{Endpoint: f.srv.Endpoint, Bucket: bucket, Prefix: prefix,
		AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	f.store, err = tierstore.Open(context.Background(), tierstore.Config{
		IndexDir: filepath.Join(root, "index"),
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(root, "mem")}, Quota: 64 << 20}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.store.Close() })
	cm, err := cache.NewMetrics(f.reg, f.store)
	if err != nil {
		t.Fatal(err)
	}
	f.cache, err = cache.New(cache.Config{Store: f.store, Source: f.objects, SourceID: sourceID, BlockSize: testBlockSize,
		Fetch: understore.ParallelOptions{ChunkSize: testBlockSize}, Metrics: cm})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.cache.Close)
	if f.m, err = NewMetrics(f.reg); err != nil {
		t.Fatal(err)
	}
	return f
}

// localBlocks opens the fixture's blocks in the tier store, as the mounter wires it.
type localBlocks struct{ store *tierstore.Store }

func (l localBlocks) OpenBlock(ctx context.Context, file, etag string, index int64) (*os.File, error) {
	f, _, err := l.store.OpenBlock(ctx, cache.BlockID(sourceID, file, etag, index))
	return f, err
}

// config is the mount's configuration; change adjusts it.
func (f *fixture) config(change func(*Config)) Config {
	cfg := Config{Objects: f.objects, Blocks: f.cache, BlockSize: testBlockSize, Metrics: f.m, Name: "strata:test/dataset",
		Log: funcr.New(f.logs.add, funcr.Options{})}
	if change != nil {
		change(&cfg)
	}
	return cfg
}

// mount mounts cfg in a new folder and unmounts it when the test ends, whatever happened.
func mount(t *testing.T, cfg Config) *Server {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Mount(context.Background(), dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Unmount(ctx); err != nil {
			t.Errorf("unmounting %s: %v; detaching it", dir, err)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	return s
}

// counter reads a counter or gauge of reg by name.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

// stored reports whether the tier store holds block index of file, of the version in MinIO.
func (f *fixture) stored(file string, index int64) bool {
	info, err := f.objects.Stat(context.Background(), file)
	if err != nil {
		return false
	}
	_, err = f.store.Info(cache.BlockID(sourceID, file, info.ETag, index))
	return err == nil
}

func sum(b []byte) [32]byte { return sha256.Sum256(b) }

// logLines collects log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

// count returns how many lines contain all of subs.
func (l *logLines) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		n++
	}
	return n
}
