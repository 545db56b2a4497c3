package cache

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/miniotest"
)

// Sizes of the benchmarks: modest, so that one run takes seconds, yet blocks large enough
// that per-call overheads do not dominate.
const (
	benchBlockSize = 4 << 20
	benchBlocks    = 16
	benchBucket    = "bench"
	benchObject    = "data/file-0"
)

// shmDir is a fresh directory on tmpfs (/dev/shm), the medium of a MEM tier, removed at the
// end; it falls back to the benchmark's temporary directory where there is no /dev/shm.
func shmDir(b *testing.B, name string) string {
	b.Helper()
	d, err := os.MkdirTemp("/dev/shm", "strata-bench-"+name+"-")
	if err != nil {
		b.Logf("no /dev/shm (%v); %s lives in a temporary directory, so it measures that disk, not memory", err, name)
		return b.TempDir()
	}
	b.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// benchStore opens a tier store whose MEM tier is on tmpfs and large enough for every block of
// the benchmark; its index is on disk, as in production.
func benchStore(b *testing.B) *tierstore.Store {
	b.Helper()
	s, err := tierstore.Open(context.Background(), tierstore.Config{
		IndexDir: filepath.Join(b.TempDir(), "index"),
		Tiers: []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{shmDir(b, "mem")},
			Quota: 4 * benchBlocks * benchBlockSize}},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func benchCache(b *testing.B, store *tierstore.Store, src Source, sourceID string, fetch understore.ParallelOptions) *Cache {
	b.Helper()
	m, err := NewMetrics(prometheus.NewRegistry(), store)
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(Config{Store: store, Source: src, SourceID: sourceID, BlockSize: benchBlockSize, Metrics: m, Fetch: fetch})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c
}

// BenchmarkDataPath puts the cache next to its limits, in one run:
//
//   - hot reads of cached blocks, sequential and random, next to reading the same bytes as
//     plain files from tmpfs (the physical limit of a MEM tier);
//   - cold reads through the cache from MinIO next to ranged reads straight from MinIO with minio-go;
//   - writes of blocks into the MEM tier next to writing them through to MinIO.
//
// The MinIO cases are skipped when there is no MinIO binary (see `make minio`).
func BenchmarkDataPath(b *testing.B) {
	ctx := context.Background()
	obj := randomBytes(benchBlocks*benchBlockSize, 42)

	// The same blocks as plain files on tmpfs.
	plain := shmDir(b, "plain")
	for i := range benchBlocks {
		if err := os.WriteFile(filepath.Join(plain, fmt.Sprint(i)), obj[i*benchBlockSize:(i+1)*benchBlockSize], 0o640); err != nil {
			b.Fatal(err)
		}
	}
	// A warm cache over an in-memory source: every block read once.
	hot := benchCache(b, benchStore(b), newSource(map[string][]byte{"f": obj}), "hot", understore.ParallelOptions{})
	for i := range benchBlocks {
		if _, err := hot.ReadBlock(ctx, "f", "", -1, int64(i)); err != nil {
			b.Fatal(err)
		}
	}
	sequential := func(i int) int { return i % benchBlocks }
	rng := rand.New(rand.NewPCG(1, 1))
	randomOrder := make([]int, 4096)
	for i := range randomOrder {
		randomOrder[i] = rng.IntN(benchBlocks)
	}
	random := func(i int) int { return randomOrder[i%len(randomOrder)] }

	for _, order := range []struct {
		name string
		at   func(int) int
	}{{"sequential", sequential}, {"random", random}} {
		b.Run("hot/"+order.name+"/cache", func(b *testing.B) {
			b.SetBytes(benchBlockSize)
			for i := 0; b.Loop(); i++ {
				if _, err := hot.ReadBlock(ctx, "f", "", -1, int64(order.at(i))); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("hot/"+order.name+"/tmpfs-files", func(b *testing.B) {
			b.SetBytes(benchBlockSize)
			for i := 0; b.Loop(); i++ {
				if _, err := os.ReadFile(filepath.Join(plain, fmt.Sprint(order.at(i)))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}

	if miniotest.Binary() == "" {
		b.Log("no MinIO binary: skipping the cold-read and write-through cases; run `make minio` or set STRATA_MINIO")
		return
	}
	srv := miniotest.Start(b)
	srv.MakeBucket(b, benchBucket)
	srv.Put(b, benchBucket, benchObject, obj)
	s3, err := understore.NewS3(understore.S3Config{Endpoint: srv.Endpoint, Bucket: benchBucket, AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
	if err != nil {
		b.Fatal(err)
	}

	// Every cold read is a miss: each pass over the object goes through a cache with a new
	// source id, so its blocks have new ids. The tier fills up and drops the oldest (clean)
	// blocks as a long cold scan would, and each block is stored while the next one is
	// fetched. The block is fetched as one range, or as four 1 MiB ranges in parallel.
	for _, fetch := range []struct {
		name string
		opts understore.ParallelOptions
	}{
		{"one-range", understore.ParallelOptions{ChunkSize: benchBlockSize, Concurrency: 1}},
		{"4x1MiB-ranges-in-parallel", understore.ParallelOptions{ChunkSize: 1 << 20, Concurrency: 4}},
	} {
		b.Run("cold/cache-from-minio/"+fetch.name, func(b *testing.B) {
			store := benchStore(b)
			var cold *Cache
			b.SetBytes(benchBlockSize)
			for i := 0; b.Loop(); i++ {
				if i%benchBlocks == 0 {
					cold = benchCache(b, store, s3, fmt.Sprintf("cold-%d", i/benchBlocks), fetch.opts)
				}
				if _, err := cold.ReadBlock(ctx, benchObject, "", -1, int64(i%benchBlocks)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("cold/minio-go-direct", func(b *testing.B) {
		buf := make([]byte, benchBlockSize)
		b.SetBytes(benchBlockSize)
		for i := 0; b.Loop(); i++ {
			off := int64(i%benchBlocks) * benchBlockSize
			var opts minio.GetObjectOptions
			if err := opts.SetRange(off, off+benchBlockSize-1); err != nil {
				b.Fatal(err)
			}
			o, err := srv.Client.GetObject(ctx, benchBucket, benchObject, opts)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(o, buf); err != nil {
				b.Fatal(err)
			}
			_ = o.Close()
		}
	})

	block := obj[:benchBlockSize]
	// A block written into the MEM tier is either clean (a copy exists elsewhere, so the
	// store skips fsyncs) or not yet checkpointed (its file and index entry are synced, so it
	// survives a worker crash while tmpfs does).
	for _, w := range []struct {
		name string
		opts tierstore.PutOptions
	}{{"clean", tierstore.PutOptions{Clean: true}}, {"not-yet-checkpointed", tierstore.PutOptions{}}} {
		b.Run("write/mem-tier/"+w.name, func(b *testing.B) {
			store := benchStore(b)
			b.SetBytes(benchBlockSize)
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("w-%d", i)
				if _, err := store.Put(ctx, id, bytes.NewReader(block), benchBlockSize, w.opts); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := store.Delete(ctx, id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
	b.Run("write/minio-write-through", func(b *testing.B) {
		b.SetBytes(benchBlockSize)
		for i := 0; b.Loop(); i++ {
			if _, err := srv.Client.PutObject(ctx, benchBucket, fmt.Sprintf("out/w-%d", i), bytes.NewReader(block), benchBlockSize,
				minio.PutObjectOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
