package fusefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/testenv"
)

// memoryBlocks serves every block of every file from one buffer: the FUSE serving path alone,
// with no tier store or under-store behind it.
type memoryBlocks struct{ block []byte }

func (m memoryBlocks) ReadBlock(context.Context, string, string, int64, int64) ([]byte, error) {
	return m.block, nil
}

// BenchmarkReadThroughTheMount reads a 256 MiB file through the mount, its pages dropped from
// the page cache first so that every byte is a FUSE read answered by the server.
//
//	go test -run '^$' -bench ReadThroughTheMount ./cacheworker/fusefs/
func BenchmarkReadThroughTheMount(b *testing.B) {
	fusetest.Require(b)
	const blockSize, fileSize = 8 << 20, 256 << 20
	dir := filepath.Join(b.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	s, err := Mount(context.Background(), dir, Config{
		Objects:   fakeLister{{Path: "big.bin", Size: fileSize}},
		Blocks:    memoryBlocks{block: make([]byte, blockSize)},
		BlockSize: blockSize,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Unmount(context.Background()) }()
	fusetest.ReadDroppedEachLoop(b, filepath.Join(dir, "big.bin"), fileSize)
}

// BenchmarkColdReadFromMinIO reads a 64 MiB object through the mount with nothing cached: every
// 8 MiB block is fetched from a real MinIO through the read-through cache and stored in a MEM
// tier (a fresh store and mount each time, outside the timer); with the cache's prefetch of the
// next block, and without it, alternating in one run; and again with 20 ms added to every
// ranged read, the time to first byte of a remote object store such as S3 (local MinIO answers
// in about a millisecond).
//
//	go test -run '^$' -bench ColdReadFromMinIO -benchtime 5x ./cacheworker/fusefs/
func BenchmarkColdReadFromMinIO(b *testing.B) {
	const bs, size = 8 << 20, 64 << 20
	srv := miniotest.Start(b)
	srv.MakeBucket(b, "cold")
	srv.Put(b, "cold", "big.bin", randomBytes(size, 9))
	objects, err := understore.NewS3(understore.S3Config{Endpoint: srv.Endpoint, Bucket: "cold", AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for _, run := range []struct {
		mode    string
		latency time.Duration
	}{
		{"prefetch", 0}, {"no prefetch", 0}, {"prefetch", 0}, {"no prefetch", 0},
		{"prefetch", 20 * time.Millisecond}, {"no prefetch", 20 * time.Millisecond},
		{"prefetch", 20 * time.Millisecond}, {"no prefetch", 20 * time.Millisecond},
	} {
		mode := run.mode
		var source understore.RangeReader = objects
		if run.latency > 0 {
			source = remote{objects, run.latency}
		}
		b.Run(fmt.Sprintf("%s/latency %s", mode, run.latency), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				b.StopTimer()
				root := b.TempDir()
				store, err := tierstore.Open(context.Background(), tierstore.Config{IndexDir: filepath.Join(root, "index"),
					Tiers: []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(root, "mem")}, Quota: 256 << 20}}})
				if err != nil {
					b.Fatal(err)
				}
				cm, err := cache.NewMetrics(prometheus.NewRegistry(), store)
				if err != nil {
					b.Fatal(err)
				}
				c, err := cache.New(cache.Config{Store: store, Source: source, SourceID: sourceID, BlockSize: bs, Metrics: cm})
				if err != nil {
					b.Fatal(err)
				}
				var blocks BlockReader = c
				if mode == "no prefetch" {
					blocks = struct{ BlockReader }{c} // hides Prefetch
				}
				dir := filepath.Join(root, "mnt")
				if err := os.Mkdir(dir, 0o755); err != nil {
					b.Fatal(err)
				}
				// Blocks already stored (the prefetched ones) are read from their files, as the
				// mounter wires a mount.
				s, err := Mount(context.Background(), dir, Config{Objects: objects, Blocks: blocks, Local: localBlocks{store}, BlockSize: bs})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				f, err := os.Open(filepath.Join(dir, "big.bin"))
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
				if err != nil || n != size {
					b.Fatal(n, err)
				}
				_ = f.Close()
				b.StopTimer()
				_ = s.Unmount(context.Background())
				c.Close()
				_ = store.Close()
				b.StartTimer()
			}
		})
	}
}

// remote adds a time to first byte to every ranged read of an under-store.
type remote struct {
	understore.RangeReader
	latency time.Duration
}

func (r remote) ReadVersionAt(ctx context.Context, path, etag string, p []byte, off int64) (int, error) {
	select {
	case <-time.After(r.latency):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return r.RangeReader.ReadVersionAt(ctx, path, etag, p, off)
}

// manyObjects lists n objects of a training set's shape (a thousand files per folder, keys of
// about 35 bytes, 32-character ETags), made as they are listed.
type manyObjects int

func (n manyObjects) List(context.Context, string) iter.Seq2[understore.ObjectInfo, error] {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	return func(yield func(understore.ObjectInfo, error) bool) {
		for i := range int(n) {
			o := understore.ObjectInfo{
				Path: fmt.Sprintf("train/shard-%04d/sample-%07d.jpg", i/1000, i), Size: int64(100<<10 + i%4096),
				ModTime: t0.Add(time.Duration(i) * time.Millisecond), ETag: fmt.Sprintf("%032x", uint64(i)*0x9e3779b97f4a7c15),
			}
			if !yield(o, nil) {
				return
			}
		}
	}
}

// BenchmarkMountAMillionObjects mounts a Dataset of a million objects (STRATA_BENCH_OBJECTS
// changes how many) and reports how long the mount took, the memory the mounted tree keeps per
// object (heap after a collection, less the heap before), and how long a walk of every name and
// size through the kernel takes.
//
//	go test -run '^$' -bench MountAMillionObjects -benchtime 1x ./cacheworker/fusefs/
func BenchmarkMountAMillionObjects(b *testing.B) {
	fusetest.Require(b)
	n := testenv.BenchObjects(b, 1_000_000)
	for b.Loop() {
		dir := filepath.Join(b.TempDir(), "mnt")
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		s, err := Mount(context.Background(), dir, Config{Objects: manyObjects(n), Blocks: memoryBlocks{}, BlockSize: 8 << 20})
		if err != nil {
			b.Fatal(err)
		}
		mounted := time.Since(start)
		runtime.GC()
		runtime.ReadMemStats(&after)
		start = time.Now()
		files := 0
		err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files++
			}
			return err
		})
		walked := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if files != n {
			b.Fatalf("the walk found %d files of %d", files, n)
		}
		b.ReportMetric(mounted.Seconds(), "s/mount")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "B/object")
		b.ReportMetric(walked.Seconds(), "s/walk")
		if err := s.Unmount(context.Background()); err != nil {
			b.Fatal(err)
		}
		runtime.KeepAlive(s)
	}
}

// BenchmarkReadLocalBlocksThroughTheMount reads a 256 MiB file of four 64 MiB blocks held in a
// MEM tier (on /dev/shm), its pages dropped first so that every byte is a FUSE read answered
// from the blocks' files (as #21's hot-seq-dropped through a worker's mount): spliced from the
// files into the FUSE device, and copied through the worker, alternating in one run.
//
//	go test -run '^$' -bench ReadLocalBlocksThroughTheMount -benchtime 10x ./cacheworker/fusefs/
func BenchmarkReadLocalBlocksThroughTheMount(b *testing.B) {
	const bs, size = 64 << 20, 256 << 20
	store := memoryTier(b)
	data := randomBytes(size, 3)
	for i := range int64(size / bs) {
		id := cache.BlockID(sourceID, "big.bin", "", i)
		if _, err := store.Put(context.Background(), id, bytes.NewReader(data[i*bs:(i+1)*bs]), bs, tierstore.PutOptions{Clean: true}); err != nil {
			b.Fatal(err)
		}
	}
	for _, mode := range []string{"spliced", "copied", "spliced", "copied"} {
		b.Run(mode, func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "mnt")
			if err := os.Mkdir(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			s, err := Mount(context.Background(), dir, Config{
				Objects: fakeLister{{Path: "big.bin", Size: size}}, Blocks: failingBlocks{errors.New("every block is local")},
				Local: localBlocks{store}, BlockSize: bs, DisableSplice: mode == "copied",
			})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = s.Unmount(context.Background()) }()
			fusetest.ReadDroppedEachLoop(b, filepath.Join(dir, "big.bin"), size)
		})
	}
}

// BenchmarkReadingSmallFilesHot walks a folder of 2,000 files of 16 KiB held in a MEM tier (on
// /dev/shm) and reads each whole, as #21's small-hot does through a worker's mount: each read
// once before the timer, so that every file's pages or backing file are hot; it reports
// files/s. The cost is the requests a file costs the mount (open, flush, release), not bytes.
//
//	go test -run '^$' -bench ReadingSmallFilesHot -benchtime 20x ./cacheworker/fusefs/
func BenchmarkReadingSmallFilesHot(b *testing.B) {
	const files, size = 2000, 16 << 10
	store := memoryTier(b)
	data := randomBytes(size, 4)
	var objects fakeLister
	for i := range files {
		name := fmt.Sprintf("small/f-%05d", i)
		objects = append(objects, understore.ObjectInfo{Path: name, Size: size})
		if _, err := store.Put(context.Background(), cache.BlockID(sourceID, name, "", 0), bytes.NewReader(data), size, tierstore.PutOptions{Clean: true}); err != nil {
			b.Fatal(err)
		}
	}
	dir := filepath.Join(b.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	s, err := Mount(context.Background(), dir, Config{
		Objects: objects, Blocks: failingBlocks{errors.New("every block is local")}, Local: localBlocks{store}, BlockSize: 64 << 20,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Unmount(context.Background()) }()
	buf := make([]byte, 2*size)
	walk := func() {
		entries, err := os.ReadDir(filepath.Join(dir, "small"))
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range entries {
			f, err := os.Open(filepath.Join(dir, "small", e.Name()))
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.ReadFull(f, buf)
			if n != size || !errors.Is(err, io.ErrUnexpectedEOF) {
				b.Fatalf("%s: read %d bytes (%v), want %d", e.Name(), n, err, size)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	walk()
	b.ResetTimer()
	for range b.N {
		walk()
	}
	b.ReportMetric(float64(b.N*files)/b.Elapsed().Seconds(), "files/s")
}

// memoryTier is a tier store of one MEM tier of 1 GiB on /dev/shm (a temporary folder when there
// is none), closed when b ends.
func memoryTier(b *testing.B) *tierstore.Store {
	b.Helper()
	root := fusetest.MemoryFolder(b)
	store, err := tierstore.Open(context.Background(), tierstore.Config{IndexDir: filepath.Join(root, "index"),
		Tiers: []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(root, "mem")}, Quota: 1 << 30}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	return store
}
