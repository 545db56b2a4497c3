package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/miniotest"
)

const blockSize = 1024

// countingSource is an under-store over in-memory files that counts its reads. With a gate,
// every read waits for the gate to open (or its context to end), so a test can hold a fetch
// in flight; cancelled receives the context error of reads that gave up.
type countingSource struct {
	files     map[string][]byte
	calls     atomic.Int32
	asked     atomic.Int64 // bytes asked for, over every read
	gate      chan struct{}
	cancelled chan error
}

func newSource(files map[string][]byte) *countingSource {
	return &countingSource{files: files, cancelled: make(chan error, 64)}
}

// ReadVersionAt serves every version: each file has one.
func (s *countingSource) ReadVersionAt(ctx context.Context, p, _ string, buf []byte, off int64) (int, error) {
	s.calls.Add(1)
	s.asked.Add(int64(len(buf)))
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			s.cancelled <- ctx.Err()
			return 0, ctx.Err()
		}
	}
	data, ok := s.files[p]
	if !ok {
		return 0, &understore.Error{Op: "read", Store: "mem://", Path: p, Kind: understore.ErrNotFound}
	}
	if off >= int64(len(data)) {
		return 0, io.EOF
	}
	n := copy(buf, data[off:])
	if n < len(buf) {
		return n, io.EOF
	}
	return n, nil
}

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 99))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// openStore opens a tier store with one MEM tier of quota bytes in a temporary directory.
func openStore(t testing.TB, quota int64) *tierstore.Store {
	t.Helper()
	root := t.TempDir()
	s, err := tierstore.Open(context.Background(), tierstore.Config{
		IndexDir: filepath.Join(root, "index"),
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(root, "mem")}, Quota: quota}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

type fixture struct {
	store *tierstore.Store
	src   *countingSource
	cache *Cache
	m     *Metrics
	reg   *prometheus.Registry
}

func newFixture(t *testing.T, quota int64, files map[string][]byte) *fixture {
	t.Helper()
	f := &fixture{store: openStore(t, quota), src: newSource(files), reg: prometheus.NewRegistry()}
	var err error
	if f.m, err = NewMetrics(f.reg, f.store); err != nil {
		t.Fatal(err)
	}
	f.cache, err = New(Config{Store: f.store, Source: f.src, SourceID: "dataset-uid", BlockSize: blockSize,
		Fetch: understore.ParallelOptions{ChunkSize: blockSize}, Metrics: f.m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.cache.Close)
	return f
}

// settled waits until no fetch or store of the block is under way, so that what follows sees
// the block stored (or its store failed).
func (f *fixture) settled(g *WithT, file string, index int64) {
	id := BlockID("dataset-uid", file, "", index)
	g.Eventually(func() bool {
		f.cache.flight.mu.Lock()
		defer f.cache.flight.mu.Unlock()
		return f.cache.flight.calls[id] == nil
	}).WithTimeout(10*time.Second).Should(BeTrue(), "the fetch of block %d of %s has ended", index, file)
}

// waiters is how many readers wait for the fetch of a block.
func (f *fixture) waiters(file string, index int64) int {
	f.cache.flight.mu.Lock()
	defer f.cache.flight.mu.Unlock()
	if c := f.cache.flight.calls[BlockID("dataset-uid", file, "", index)]; c != nil {
		return c.waiters
	}
	return 0
}

func TestConcurrentMissesOnOneBlockFetchItOnce(t *testing.T) {
	g := NewWithT(t)
	data := randomBytes(3*blockSize, 1)
	f := newFixture(t, 1<<20, map[string][]byte{"part-0": data})
	f.src.gate = make(chan struct{})

	const readers = 50
	var wg sync.WaitGroup
	results := make([][]byte, readers)
	errs := make([]error, readers)
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = f.cache.ReadBlock(context.Background(), "part-0", "", -1, 1)
		}()
	}
	// Every reader has missed and joined the one fetch, which the gate holds.
	g.Eventually(func() int { return f.waiters("part-0", 1) }).WithTimeout(10*time.Second).
		Should(Equal(readers), "all readers wait for the one fetch")
	g.Expect(testutil.ToFloat64(f.m.misses)).To(Equal(float64(readers)))
	close(f.src.gate)
	wg.Wait()

	g.Expect(f.src.calls.Load()).To(BeEquivalentTo(1), "the under-store was read once")
	g.Expect(testutil.ToFloat64(f.m.fetches)).To(Equal(1.0))
	for i := range readers {
		g.Expect(errs[i]).NotTo(HaveOccurred())
		g.Expect(results[i]).To(Equal(data[blockSize : 2*blockSize]))
	}
	for i := range readers {
		g.Expect(&results[i][0]).To(BeIdenticalTo(&results[0][0]), "reader %d shares the one fetched block: no copy per reader", i)
	}

	f.settled(g, "part-0", 1)
	again, err := f.cache.ReadBlock(context.Background(), "part-0", "", -1, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(Equal(data[blockSize : 2*blockSize]))
	g.Expect(f.src.calls.Load()).To(BeEquivalentTo(1), "the next read hits the local tier")
	g.Expect(testutil.ToFloat64(f.m.hits.WithLabelValues("mem"))).To(Equal(1.0))
}

func TestReadBlock(t *testing.T) {
	file := randomBytes(2*blockSize+100, 2)
	cases := map[string]struct {
		quota    int64
		file     string
		index    int64
		damage   func(t *testing.T, f *fixture) // run after a first read has cached the block
		want     []byte
		wantErr  error
		reads    int // under-store reads for the first read and a second one
		failures float64
	}{
		"a miss reads the under-store once, then the block is served locally": {
			file: "f", index: 0, want: file[:blockSize], reads: 1,
		},
		"the last block of a file is short": {
			file: "f", index: 2, want: file[2*blockSize:], reads: 1,
		},
		"a block past the end of the file is out of range": {
			file: "f", index: 3, wantErr: ErrOutOfRange, reads: 2,
		},
		"a negative index is out of range": {
			file: "f", index: -1, wantErr: ErrOutOfRange, reads: 0,
		},
		"a missing file fails with the under-store's error": {
			file: "nope", index: 0, wantErr: understore.ErrNotFound, reads: 2,
		},
		"a corrupt local copy is removed and read again from the under-store": {
			file: "f", index: 1, want: file[blockSize : 2*blockSize], reads: 2,
			damage: func(t *testing.T, f *fixture) {
				info, err := f.store.Info(BlockID("dataset-uid", "f", "", 1))
				if err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(info.Dir, info.ID)
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				b[7] ^= 1
				if err := os.WriteFile(p, b, 0o640); err != nil {
					t.Fatal(err)
				}
			},
		},
		"a block the tiers cannot take is still served": {
			quota: blockSize / 2, file: "f", index: 0, want: file[:blockSize], reads: 2, failures: 2,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			quota := tc.quota
			if quota == 0 {
				quota = 1 << 20
			}
			f := newFixture(t, quota, map[string][]byte{"f": file})
			for i := range 2 {
				got, err := f.cache.ReadBlock(context.Background(), tc.file, "", -1, tc.index)
				if tc.wantErr != nil {
					g.Expect(err).To(MatchError(tc.wantErr))
					g.Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("block %d of %s", tc.index, tc.file)))
				} else {
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(got).To(Equal(tc.want))
				}
				f.settled(g, tc.file, tc.index)
				if i == 0 && tc.damage != nil {
					tc.damage(t, f)
				}
			}
			g.Expect(f.src.calls.Load()).To(BeEquivalentTo(tc.reads))
			g.Expect(testutil.ToFloat64(f.m.storeFailures)).To(Equal(tc.failures))
		})
	}
}

func TestAReaderThatGivesUpDoesNotFailTheOthers(t *testing.T) {
	g := NewWithT(t)
	data := randomBytes(blockSize, 3)
	f := newFixture(t, 1<<20, map[string][]byte{"f": data})
	f.src.gate = make(chan struct{})

	impatient, giveUp := context.WithCancel(context.Background())
	impatientErr := make(chan error, 1)
	patient := make(chan []byte, 1)
	go func() {
		_, err := f.cache.ReadBlock(impatient, "f", "", -1, 0)
		impatientErr <- err
	}()
	go func() {
		b, err := f.cache.ReadBlock(context.Background(), "f", "", -1, 0)
		if err != nil {
			t.Error(err)
		}
		patient <- b
	}()
	g.Eventually(func() int { return f.waiters("f", 0) }).WithTimeout(10*time.Second).
		Should(Equal(2), "both readers wait for the one fetch")
	giveUp()
	g.Expect(<-impatientErr).To(MatchError(context.Canceled))
	close(f.src.gate)
	g.Expect(<-patient).To(Equal(data))
	g.Expect(f.src.calls.Load()).To(BeEquivalentTo(1))
}

func TestWhenEveryReaderGivesUpTheFetchStops(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, 1<<20, map[string][]byte{"f": randomBytes(blockSize, 4)})
	f.src.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := f.cache.ReadBlock(ctx, "f", "", -1, 0)
		done <- err
	}()
	g.Eventually(func() int32 { return f.src.calls.Load() }).WithTimeout(10 * time.Second).Should(BeEquivalentTo(1))
	cancel()
	g.Expect(<-done).To(MatchError(context.Canceled))
	g.Expect(<-f.src.cancelled).To(MatchError(context.Canceled), "the under-store read was cancelled")

	// The next reader starts a fresh fetch rather than joining the cancelled one.
	close(f.src.gate)
	_, err := f.cache.ReadBlock(context.Background(), "f", "", -1, 0)
	g.Expect(err).NotTo(HaveOccurred())
}

func TestCloseStopsFetchesUnderWay(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, 1<<20, map[string][]byte{"f": randomBytes(blockSize, 5)})
	f.src.gate = make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := f.cache.ReadBlock(context.Background(), "f", "", -1, 0)
		done <- err
	}()
	g.Eventually(func() int32 { return f.src.calls.Load() }).WithTimeout(10 * time.Second).Should(BeEquivalentTo(1))
	f.cache.Close()
	g.Expect(<-f.src.cancelled).To(MatchError(context.Canceled))
	g.Expect(<-done).To(MatchError(context.Canceled))
	_, err := f.cache.ReadBlock(context.Background(), "f", "", -1, 0)
	g.Expect(err).To(MatchError(ErrClosed))
}

func TestBlockIDs(t *testing.T) {
	g := NewWithT(t)
	a := BlockID("dataset-a", "dir/part-0.parquet", "", 3)
	g.Expect(a).To(MatchRegexp(`^[0-9a-f]{32}-3$`))
	g.Expect(BlockID("dataset-b", "dir/part-0.parquet", "", 3)).NotTo(Equal(a), "two sources never share blocks")
	g.Expect(BlockID("dataset-a", "dir/part-0.parquet", "", 4)).NotTo(Equal(a))
	g.Expect(BlockID("dataset-a", "../../etc/passwd", "", 0)).To(MatchRegexp(`^[0-9a-f]{32}-0$`), "any path gives a safe id")
}

func TestMetricsAreRegisteredOnTheGivenRegistry(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, 1<<20, map[string][]byte{"f": randomBytes(blockSize, 6)})
	_, err := f.cache.ReadBlock(context.Background(), "f", "", -1, 0)
	g.Expect(err).NotTo(HaveOccurred())
	f.settled(g, "f", 0)
	_, err = f.cache.ReadBlock(context.Background(), "f", "", -1, 0)
	g.Expect(err).NotTo(HaveOccurred())

	families, err := f.reg.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	values := make(map[string]float64)
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			values[mf.GetName()] += v
		}
	}
	g.Expect(values).To(And(
		HaveKeyWithValue("strata_worker_cache_hits_total", 1.0),
		HaveKeyWithValue("strata_worker_cache_misses_total", 1.0),
		HaveKeyWithValue("strata_worker_under_store_fetches_total", 1.0),
		HaveKeyWithValue("strata_worker_under_store_fetched_bytes_total", float64(blockSize)),
		HaveKeyWithValue("strata_worker_tier_used_bytes", float64(blockSize)),
		HaveKeyWithValue("strata_worker_tier_quota_bytes", float64(1<<20)),
		HaveKeyWithValue("strata_worker_tier_blocks", 1.0),
		HaveKey("strata_worker_tier_promotions_total"),
		HaveKey("strata_worker_tier_demotions_total"),
		HaveKey("strata_worker_tier_evictions_total"),
	))
	g.Expect(testutil.CollectAndCount(newTierCollector(f.store), "strata_worker_tier_used_bytes")).To(Equal(1))

	_, err = NewMetrics(f.reg, f.store)
	g.Expect(err).To(MatchError(ContainSubstring("registering cache metrics")), "a second registration on one registry is refused")
}

func TestReadThroughFromMinIO(t *testing.T) {
	g := NewWithT(t)
	srv := miniotest.Start(t)
	srv.MakeBucket(t, "data")
	obj := randomBytes(5*blockSize/2, 7)
	srv.Put(t, "data", "in/part-0", obj)
	s3, err := understore.NewS3(understore.S3Config{Endpoint: srv.Endpoint, Bucket: "data", Prefix: "in", AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
	g.Expect(err).NotTo(HaveOccurred())
	reg := prometheus.NewRegistry()
	store := openStore(t, 1<<20)
	m, err := NewMetrics(reg, store)
	g.Expect(err).NotTo(HaveOccurred())
	c, err := New(Config{Store: store, Source: s3, SourceID: "s3://data/in", BlockSize: blockSize,
		Fetch: understore.ParallelOptions{ChunkSize: 256, Concurrency: 3}, Metrics: m})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()

	info, err := s3.Stat(context.Background(), "part-0")
	g.Expect(err).NotTo(HaveOccurred())
	for pass := range 2 {
		var got []byte
		for i := int64(0); ; i++ {
			b, err := c.ReadBlock(context.Background(), "part-0", info.ETag, -1, i)
			if errors.Is(err, ErrOutOfRange) {
				break
			}
			g.Expect(err).NotTo(HaveOccurred())
			got = append(got, b...)
			g.Eventually(func() error { _, err := store.Info(BlockID("s3://data/in", "part-0", info.ETag, i)); return err }).
				WithTimeout(10*time.Second).Should(Succeed(), "block %d is stored", i)
		}
		g.Expect(got).To(Equal(obj), "pass %d", pass)
	}
	g.Expect(testutil.ToFloat64(m.fetches)).To(Equal(3.0), "three blocks fetched once each")
	g.Expect(testutil.ToFloat64(m.hits.WithLabelValues("mem"))).To(Equal(3.0))

	_, err = c.ReadBlock(context.Background(), "missing", "", -1, 0)
	g.Expect(err).To(MatchError(understore.ErrNotFound))
	g.Expect(err.Error()).To(ContainSubstring("s3://data/in/missing"))

	// Replacing the object: its cached blocks stay the old version's, and no block mixes the two.
	replaced := randomBytes(3*blockSize, 8)
	srv.Put(t, "data", "in/part-0", replaced)
	old, err := c.ReadBlock(context.Background(), "part-0", info.ETag, -1, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(old).To(Equal(obj[blockSize:2*blockSize]), "a cached block of the old version is that version's")
	g.Expect(store.Delete(context.Background(), BlockID("s3://data/in", "part-0", info.ETag, 2))).To(Succeed())
	_, err = c.ReadBlock(context.Background(), "part-0", info.ETag, -1, 2)
	g.Expect(err).To(MatchError(understore.ErrChanged), "a block of the old version that is not cached cannot be had any more")
	now, err := s3.Stat(context.Background(), "part-0")
	g.Expect(err).NotTo(HaveOccurred())
	fresh, err := c.ReadBlock(context.Background(), "part-0", now.ETag, -1, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fresh).To(Equal(replaced[blockSize:2*blockSize]), "the new version's blocks are its own")
	g.Expect(BlockID("s3://data/in", "part-0", now.ETag, 1)).NotTo(Equal(BlockID("s3://data/in", "part-0", info.ETag, 1)))
}

func TestBlocksOfPinnedFilesAreStoredPinned(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, 16*blockSize, map[string][]byte{"labels/a.txt": []byte("pinned"), "images/a.jpg": []byte("not pinned")})
	f.cache.cfg.Pinned = func(file string, _, _ int64) bool { return strings.HasPrefix(file, "labels/") }
	for _, file := range []string{"labels/a.txt", "images/a.jpg"} {
		_, err := f.cache.ReadBlock(context.Background(), file, "", -1, 0)
		g.Expect(err).NotTo(HaveOccurred())
		f.settled(g, file, 0)
	}
	pinned, err := f.store.Info(BlockID("dataset-uid", "labels/a.txt", "", 0))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pinned.Pinned).To(BeTrue())
	other, err := f.store.Info(BlockID("dataset-uid", "images/a.jpg", "", 0))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(other.Pinned).To(BeFalse())

	t.Run("a share of a file: the pin is asked with the block's index and the file's blocks", func(t *testing.T) {
		g := NewWithT(t)
		data := randomBytes(3*blockSize+10, 9)
		f := newFixture(t, 16*blockSize, map[string][]byte{"train/x.bin": data})
		f.cache.cfg.Root, f.cache.cfg.Dataset = "/datasets/ns/d/uid", "ns/d/uid"
		f.cache.cfg.Pinned = func(_ string, index, blocks int64) bool { return blocks == 4 && index%2 == 1 }
		for i := range int64(4) {
			_, err := f.cache.ReadBlock(context.Background(), "train/x.bin", "", int64(len(data)), i)
			g.Expect(err).NotTo(HaveOccurred())
			f.settled(g, "train/x.bin", i)
			info, err := f.store.Info(BlockID("dataset-uid", "train/x.bin", "", i))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(info.Pinned).To(Equal(i%2 == 1), "block %d", i)
			var origin workerpb.BlockOrigin
			g.Expect(proto.Unmarshal(info.Origin, &origin)).To(Succeed())
			g.Expect(origin.GetFileBlocks()).To(Equal(int64(4)), "the origin says how many blocks the file has, for the pins a sweep makes")
		}
	})
}

// A block of a file whose size the listing gave is read to the file's end and no further: one
// request for a small file, not a block's worth of ranges past the end of the object.
func TestReadBlockOfAKnownSize(t *testing.T) {
	small, large := randomBytes(100, 1), randomBytes(2*blockSize+300, 2)
	for _, tc := range []struct {
		name        string
		file        string
		size, index int64
		want        []byte
		wantErr     error
		wantReads   int32
		wantAsked   int64
	}{
		{"a small file: one read of its bytes", "small", 100, 0, small, nil, 1, 100},
		{"a whole block of a large file", "large", int64(len(large)), 1, large[blockSize : 2*blockSize], nil, 4, blockSize},
		{"the last, short block", "large", int64(len(large)), 2, large[2*blockSize:], nil, 2, 300},
		{"past the end: no read at all", "small", 100, 1, nil, ErrOutOfRange, 0, 0},
		{"listed longer than the store holds: a changed file", "small", 150, 0, nil, understore.ErrChanged, 1, 150},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			store := openStore(t, 1<<20)
			src := newSource(map[string][]byte{"small": small, "large": large})
			m, err := NewMetrics(prometheus.NewRegistry(), store)
			g.Expect(err).NotTo(HaveOccurred())
			// Ranges of a quarter block, as the parallel fetch splits a block.
			c, err := New(Config{Store: store, Source: src, SourceID: "dataset-uid", BlockSize: blockSize,
				Fetch: understore.ParallelOptions{ChunkSize: blockSize / 4, Concurrency: 4}, Metrics: m})
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(c.Close)

			got, err := c.ReadBlock(context.Background(), tc.file, "", tc.size, tc.index)
			if tc.wantErr != nil {
				g.Expect(err).To(MatchError(tc.wantErr))
			} else {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(got).To(Equal(tc.want))
			}
			g.Expect(src.calls.Load()).To(Equal(tc.wantReads), "reads of the under-store")
			g.Expect(src.asked.Load()).To(Equal(tc.wantAsked), "bytes asked of the under-store")
		})
	}
}

// TestPrefetchReadsABlockAheadOnce: a prefetched block is in the tier when its reader gets to
// it (one read of the under-store in all), or the reader joins the prefetch under way; a block
// held already, or past the end, is not read; at most maxPrefetches run at once.
func TestPrefetchReadsABlockAheadOnce(t *testing.T) {
	g := NewWithT(t)
	data := randomBytes(6*blockSize, 1)
	f := newFixture(t, 1<<20, map[string][]byte{"part-0": data})
	size := int64(len(data))

	f.cache.Prefetch("part-0", "", size, 1)
	g.Eventually(func() error {
		_, err := f.store.Info(BlockID("dataset-uid", "part-0", "", 1))
		return err
	}).Should(Succeed(), "the prefetched block is stored")
	f.settled(g, "part-0", 1)
	g.Eventually(func() int { return len(f.cache.prefetching) }).Should(BeZero(), "the prefetch has ended")
	g.Expect(testutil.ToFloat64(f.m.prefetches)).To(Equal(1.0))
	got, err := f.cache.ReadBlock(context.Background(), "part-0", "", size, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(data[blockSize : 2*blockSize]))
	g.Expect(f.src.calls.Load()).To(BeEquivalentTo(1), "read once, ahead of the reader")
	g.Expect(testutil.ToFloat64(f.m.hits.WithLabelValues("mem"))).To(Equal(1.0))

	f.cache.Prefetch("part-0", "", size, 1)
	f.cache.Prefetch("part-0", "", size, 6)
	g.Consistently(func() float64 { return testutil.ToFloat64(f.m.prefetches) }, "100ms").Should(Equal(1.0),
		"a block held already, and one past the end, are not prefetched")

	t.Log("a reader that gets to a block being prefetched joins its fetch")
	f.src.gate = make(chan struct{})
	f.cache.Prefetch("part-0", "", size, 2)
	g.Eventually(func() int { return f.waiters("part-0", 2) }).Should(Equal(1))
	read := make(chan []byte, 1)
	go func() {
		b, _ := f.cache.ReadBlock(context.Background(), "part-0", "", size, 2)
		read <- b
	}()
	g.Eventually(func() int { return f.waiters("part-0", 2) }).Should(Equal(2))

	t.Log("a third prefetch while two are under way is dropped")
	f.cache.Prefetch("part-0", "", size, 3)
	f.cache.Prefetch("part-0", "", size, 4)
	g.Eventually(func() int { return f.waiters("part-0", 3) }).Should(Equal(1))
	g.Consistently(func() int { return f.waiters("part-0", 4) }, "100ms").Should(BeZero())
	close(f.src.gate)
	g.Eventually(read).Should(Receive(Equal(data[2*blockSize : 3*blockSize])))
	f.settled(g, "part-0", 2)
	f.settled(g, "part-0", 3)
	g.Expect(testutil.ToFloat64(f.m.fetches)).To(Equal(3.0), "blocks 1, 2 and 3, each once")
}
