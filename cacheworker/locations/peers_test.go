package locations_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/membership"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

const (
	blockSize = 1 << 20
	dataset   = "ns/images"
	root      = "/datasets/ns/images"
)

// countingSource counts the reads that reach the under-store.
type countingSource struct {
	understore.RangeReader
	reads atomic.Int64
}

func (s *countingSource) ReadVersionAt(ctx context.Context, path, etag string, p []byte, off int64) (int, error) {
	s.reads.Add(1)
	return s.RangeReader.ReadVersionAt(ctx, path, etag, p, off)
}

// node is one worker as cmd/worker wires it: a tier store, its data plane on loopback, its
// registration with the master and a read-through cache of the test's dataset.
type node struct {
	id     string
	store  *tierstore.Store
	srv    *grpc.Server
	member *membership.Member
	dir    *locations.Directory
	cache  *cache.Cache
	source *countingSource
	reg    *prometheus.Registry
	cancel context.CancelFunc
}

func startNode(t *testing.T, id string, master *client.Client, under understore.RangeReader) *node {
	t.Helper()
	tmp := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	peers := dataplane.NewPeers()
	dir := locations.NewDirectory(master, peers, id, logr.Discard())
	store, err := tierstore.Open(ctx, tierstore.Config{
		Tiers: []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory,
			Dirs: []string{filepath.Join(tmp, "mem")}, Quota: 64 << 20}},
		IndexDir: filepath.Join(tmp, "index"),
		OnRemove: dir.Forget, // as cmd/worker wires it
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{id: id, store: store, srv: grpc.NewServer(), source: &countingSource{RangeReader: under},
		reg: prometheus.NewRegistry(), cancel: cancel, dir: dir}
	workerpb.RegisterWorkerServer(n.srv, dataplane.NewServer(store, n.dir.Enqueue, 0, nil, logr.Discard()))
	go func() { _ = n.srv.Serve(lis) }()

	n.member, err = membership.New(membership.Config{
		ID: id, Address: lis.Addr().String(), Node: "node-" + id, Interval: 100 * time.Millisecond,
		Report: n.dir.ReportAll, Log: logr.Discard(),
	}, master, store, n.reg)
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := cache.NewMetrics(n.reg, store)
	if err != nil {
		t.Fatal(err)
	}
	n.cache, err = cache.New(cache.Config{
		Store: store, Source: n.source, SourceID: "uid-1", BlockSize: blockSize,
		Peers: n.dir, Dataset: dataset, Root: root, Stored: n.dir.Enqueue, Metrics: metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { _ = n.member.Run(ctx); done <- struct{}{} }()
	go func() { _ = n.dir.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() {
		n.cancel()
		<-done
		<-done
		n.cache.Close()
		n.srv.Stop()
		_ = peers.Close()
		_ = store.Close()
	})
	return n
}

// TestPeersServeWhatTheyHold runs two workers against a real Raft master: what one fetched from
// the under-store, the other reads from it; a worker declared lost registers again by itself and
// reports what it still holds; a peer that is gone costs a fallback to the under-store, not an error.
func TestPeersServeWhatTheyHold(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	content := bytes.Repeat([]byte("strata peer read "), 3*blockSize/17+5) // three blocks and a bit
	master, under, a, b := startPeers(t, content)

	By := func(step string) { t.Log(step) }
	By("worker a reads block 1 from the under-store and reports it")
	got, err := a.cache.ReadBlock(ctx, "train.bin", "", -1, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(content[blockSize : 2*blockSize]))
	g.Expect(a.source.reads.Load()).To(BeNumerically(">", 0))
	id := cache.BlockID("uid-1", "train.bin", "", 1)
	g.Eventually(func() ([]string, error) { return holders(ctx, master, id) }).WithTimeout(10*time.Second).
		Should(ConsistOf("pool/a"), "the master learns that worker a holds the block")

	By("worker b reads the same block from worker a, not from the under-store")
	got, err = b.cache.ReadBlock(ctx, "train.bin", "", -1, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(content[blockSize : 2*blockSize]))
	g.Expect(b.source.reads.Load()).To(BeZero(), "a block a peer holds is not fetched from the under-store")
	g.Expect(testutil.ToFloat64(counter(t, b.reg, "strata_worker_peer_fetches_total"))).To(Equal(1.0))
	g.Eventually(func() ([]string, error) { return holders(ctx, master, id) }).WithTimeout(10*time.Second).
		Should(ConsistOf("pool/a", "pool/b"), "worker b reports its copy too")

	By("the master declares worker a lost; a registers again and reports the block it still has")
	_, err = master.MarkWorkerLost(ctx, "pool/a", "test: node NotReady")
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() float64 { return testutil.ToFloat64(counter(t, a.reg, "strata_worker_registrations_total")) }).
		WithTimeout(10*time.Second).Should(Equal(2.0), "worker a registers a second time")
	g.Eventually(func() ([]string, error) { return holders(ctx, master, id) }).WithTimeout(10*time.Second).
		Should(ConsistOf("pool/a", "pool/b"), "worker a's copy is live again at the master")

	By("a block worker a deletes (as eviction would drop it) is forgotten at the master")
	g.Expect(a.store.Delete(ctx, id)).To(Succeed())
	g.Eventually(func() ([]string, error) { return holders(ctx, master, id) }).WithTimeout(10*time.Second).
		Should(ConsistOf("pool/b"), "only worker b still holds the block")

	By("a peer that is gone costs a fallback to the under-store")
	c := startNode(t, "pool/c", master, under)
	g.Eventually(c.member.Registered).WithTimeout(10 * time.Second).Should(BeTrue())
	a.srv.Stop()
	b.srv.Stop()
	got, err = c.cache.ReadBlock(ctx, "train.bin", "", -1, 1)
	g.Expect(err).NotTo(HaveOccurred(), "a reader never fails because a peer is down")
	g.Expect(got).To(Equal(content[blockSize : 2*blockSize]))
	g.Expect(c.source.reads.Load()).To(BeNumerically(">", 0), "the block came from the under-store")
}

// startPeers starts a real master with the test's dataset registered, a local under-store whose
// train.bin holds content, and two workers over them, pool/a and pool/b, registered.
func startPeers(t *testing.T, content []byte) (*client.Client, understore.RangeReader, *node, *node) {
	t.Helper()
	g := NewWithT(t)
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	_, err := master.RegisterDataset(context.Background(), &masterpb.RegisterDatasetRequest{Name: dataset, Root: root, Source: "file:///data"})
	g.Expect(err).NotTo(HaveOccurred())
	dataDir := t.TempDir()
	g.Expect(os.WriteFile(filepath.Join(dataDir, "train.bin"), content, 0o600)).To(Succeed())
	under, err := understore.NewLocal(understore.LocalConfig{Dir: dataDir, AllowedRoots: []string{dataDir}})
	g.Expect(err).NotTo(HaveOccurred())
	a := startNode(t, "pool/a", master, under)
	b := startNode(t, "pool/b", master, under)
	g.Eventually(func() bool { return a.member.Registered() && b.member.Registered() }).
		WithTimeout(10*time.Second).Should(BeTrue(), "both workers register with the master")
	return master, under, a, b
}

func holders(ctx context.Context, master *client.Client, id string) ([]string, error) {
	resp, err := master.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{BlockIds: []uint64{locations.MasterBlockID(id)}})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, b := range resp.GetBlocks() {
		for _, l := range b.GetLocations() {
			if !l.GetLost() {
				out = append(out, l.GetWorker())
			}
		}
	}
	return out, nil
}

// counter finds a registered counter by name.
func counter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return collectorFunc(func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name && len(mf.GetMetric()) > 0 {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	})
}

// collectorFunc is a gauge whose value is read when collected, so testutil.ToFloat64 reads the
// registry's current value.
type collectorFunc func() float64

func (f collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	ch <- prometheus.NewDesc("test_value", "value read from the registry", nil, nil)
}

func (f collectorFunc) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("test_value", "value read from the registry", nil, nil),
		prometheus.GaugeValue, f())
}

// TestTheVersionsOfAnObjectAreRecordedApart replaces a source object after a worker cached a
// block of it: the new version's block at the same offset is recorded at the master too (the
// master holds one block per offset of a file), and a peer serves each version's block to a
// reader of that version only.
func TestTheVersionsOfAnObjectAreRecordedApart(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	first := bytes.Repeat([]byte("first "), 3*blockSize/6)
	dataDir := t.TempDir()
	g.Expect(os.WriteFile(filepath.Join(dataDir, "train.bin"), first, 0o600)).To(Succeed())
	under, err := understore.NewLocal(understore.LocalConfig{Dir: dataDir, AllowedRoots: []string{dataDir}})
	g.Expect(err).NotTo(HaveOccurred())
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	_, err = master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: dataset, Root: root, Source: "file:///data"})
	g.Expect(err).NotTo(HaveOccurred())
	a, b := startNode(t, "pool/a", master, under), startNode(t, "pool/b", master, under)
	g.Eventually(func() bool { return a.member.Registered() && b.member.Registered() }).WithTimeout(10 * time.Second).Should(BeTrue())

	v1, err := under.Stat(ctx, "train.bin")
	g.Expect(err).NotTo(HaveOccurred())
	_, err = a.cache.ReadBlock(ctx, "train.bin", v1.ETag, -1, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() ([]string, error) { return holders(ctx, master, cache.BlockID("uid-1", "train.bin", v1.ETag, 1)) }).
		WithTimeout(10 * time.Second).Should(ConsistOf("pool/a"))

	second := bytes.Repeat([]byte("SECOND"), 3*blockSize/6)
	g.Expect(os.WriteFile(filepath.Join(dataDir, "train.bin"), second, 0o600)).To(Succeed())
	later := time.Now().Add(time.Second)
	g.Expect(os.Chtimes(filepath.Join(dataDir, "train.bin"), later, later)).To(Succeed())
	v2, err := under.Stat(ctx, "train.bin")
	g.Expect(err).NotTo(HaveOccurred())
	got, err := a.cache.ReadBlock(ctx, "train.bin", v2.ETag, -1, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(second[blockSize : 2*blockSize]))
	g.Eventually(func() ([]string, error) { return holders(ctx, master, cache.BlockID("uid-1", "train.bin", v2.ETag, 1)) }).
		WithTimeout(10*time.Second).Should(ConsistOf("pool/a"), "the new version's block is recorded beside the old one's")

	old, err := b.cache.ReadBlock(ctx, "train.bin", v1.ETag, -1, 1)
	g.Expect(err).NotTo(HaveOccurred(), "a reader of the old version gets its block from the peer that holds it")
	g.Expect(old).To(Equal(first[blockSize : 2*blockSize]))
	fresh, err := b.cache.ReadBlock(ctx, "train.bin", v2.ETag, -1, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fresh).To(Equal(second[blockSize : 2*blockSize]))
	g.Expect(b.source.reads.Load()).To(BeZero(), "both came from the peer")
	_, err = b.cache.ReadBlock(ctx, "train.bin", v1.ETag, -1, 2)
	g.Expect(err).To(MatchError(understore.ErrChanged), "a block of the old version that nobody holds is not read from the new one")
}
