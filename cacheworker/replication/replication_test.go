package replication_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/replication"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

const (
	dataset = "team-a/features/uid-1"
	root    = "/datasets/team-a/features/uid-1"
	rack    = "topology.strata.dev/rack"
)

// worker is one node's part: a tier store, its data plane (which stores the replicas others
// send and reports them, as a worker does), and its directory of block locations.
type worker struct {
	id, node string
	store    *tierstore.Store
	dir      *locations.Directory
}

func startWorker(t *testing.T, master *client.Client, id, node string) *worker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	peers := dataplane.NewPeers()
	dir := locations.NewDirectory(master, peers, id, logr.Discard())
	base := t.TempDir()
	store, err := tierstore.Open(ctx, tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(base, "mem")}, Quota: 64 << 20}},
		IndexDir: filepath.Join(base, "index"), OnRemove: dir.Forget,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	workerpb.RegisterWorkerServer(srv, dataplane.NewServer(store, dir.Enqueue, 1<<20, nil, logr.Discard()))
	go func() { _ = srv.Serve(lis) }()
	if _, err := master.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: id, Address: lis.Addr().String(), Node: node}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = dir.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Stop()
		_ = peers.Close()
		_ = store.Close()
	})
	return &worker{id: id, node: node, store: store, dir: dir}
}

// seal stores a block of a new output file on w and publishes the file at the master, as an
// output mount's seal does.
func seal(t *testing.T, master *client.Client, w *worker, name string, seed uint64) (id string, data []byte) {
	t.Helper()
	ctx := context.Background()
	data = make([]byte, 200<<10)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	token := name + "-token"
	id = token + "-0"
	origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: root + "/" + name, Dataset: dataset, Root: root, FileToken: token})
	if err != nil {
		t.Fatal(err)
	}
	info, err := w.store.Put(ctx, id, bytes.NewReader(data), int64(len(data)), tierstore.PutOptions{Origin: origin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: dataset, Root: root}); err != nil {
		t.Fatal(err)
	}
	if _, err := master.SealFile(ctx, &masterpb.SealFileRequest{Path: root + "/" + name, Dataset: dataset, ClientToken: token,
		Blocks: []*masterpb.CommitBlockRequest{w.dir.CommitRequest(info, root+"/"+name, 0)}}); err != nil {
		t.Fatal(err)
	}
	return id, data
}

// policies is a policies file that replicates the Dataset in count copies within a rack.
func policies(t *testing.T, count int, selective bool, racks map[string]string) *policy.Set {
	t.Helper()
	topology := map[string]map[string]string{}
	for node, r := range racks {
		topology[node] = map[string]string{rack: r}
	}
	raw, err := json.Marshal(policy.File{
		Datasets: []policy.Dataset{{Name: dataset, Replication: &policy.Replication{Count: count, ScopeLabel: rack, Selective: selective}}},
		Topology: topology,
	})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// newReplicator is w's replicator under set, asking master where blocks are.
func newReplicator(t *testing.T, master replication.Master, w *worker, set *policy.Set, recheck time.Duration, m *replication.Metrics) *replication.Replicator {
	peers := dataplane.NewPeers()
	t.Cleanup(func() { _ = peers.Close() })
	return replication.New(replication.Config{Self: w.id, Node: w.node, Store: w.store, Master: master, Sender: peers,
		Policies: func() *policy.Set { return set }, Recheck: recheck, Metrics: m, Log: testr.New(t)})
}

// holders are the workers the master says hold block id, live ones only.
func holders(master *client.Client, id string) []string {
	resp, err := master.GetBlockLocations(context.Background(), &masterpb.GetBlockLocationsRequest{BlockIds: []uint64{locations.MasterBlockID(id)}})
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range resp.GetBlocks()[0].GetLocations() {
		if !l.GetLost() {
			out = append(out, l.GetWorker())
		}
	}
	slices.Sort(out)
	return out
}

// TestReplicasStayInTheWritersRackAndComeBackAfterALoss runs three workers, two in one rack:
// a block written on the first gets its one replica on the other worker of its rack, never on
// the third; when the writer's node is lost the replica serves the block, its output is not
// lost, and the worker left makes a new copy when the rack has a node again.
func TestReplicasStayInTheWritersRackAndComeBackAfterALoss(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	a := startWorker(t, master, "pool/node-a", "node-a")
	b := startWorker(t, master, "pool/node-b", "node-b")
	startWorker(t, master, "pool/node-c", "node-c")
	set := policies(t, 2, true, map[string]string{"node-a": "r1", "node-b": "r1", "node-c": "r2", "node-d": "r1"})
	replicator := func(w *worker) (*replication.Replicator, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		m, err := replication.NewMetrics(reg)
		g.Expect(err).NotTo(HaveOccurred())
		// Every pass looks at every block again, as the first pass after Recheck does.
		return newReplicator(t, master, w, set, time.Nanosecond, m), reg
	}
	id, data := seal(t, master, a, "part-0", 1)
	g.Expect(holders(master, id)).To(Equal([]string{a.id}))

	t.Log("the writer copies the block to the other node of its rack")
	ra, _ := replicator(a)
	res, err := ra.Pass(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Copied).To(Equal(1))
	g.Eventually(func() []string { return holders(master, id) }).Should(Equal([]string{a.id, b.id}), "the replica is recorded, by the worker that holds it")
	got, _, err := b.store.Get(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(data))
	info, err := b.store.Info(id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Clean).To(BeFalse(), "a replica is no checkpoint: it is not dropped without one")

	t.Log("a block with all its copies is not copied again, by either holder")
	res, err = ra.Pass(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(replication.Result{}))
	rb, regB := replicator(b)
	res, err = rb.Pass(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(replication.Result{}))

	t.Log("the writer's node is lost: the output is not lost, and the replica serves the block")
	_, err = master.MarkWorkerLost(ctx, a.id, "test: node gone")
	g.Expect(err).NotTo(HaveOccurred())
	usage, err := master.GetDatasetUsage(ctx, &masterpb.GetDatasetUsageRequest{Name: dataset})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.GetLostFiles()).To(BeZero())
	peers := dataplane.NewPeers()
	t.Cleanup(func() { _ = peers.Close() })
	read, err := locations.NewDirectory(master, peers, "pool/reader", logr.Discard()).ReadBlock(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(read).To(Equal(data))

	t.Log("no other node of the rack is left: the block waits, and the lag says so")
	res, err = rb.Pass(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(replication.Result{Unreplicated: 1}), "node-c is in another rack")
	g.Expect(gauge(t, regB, "strata_worker_replication_lag_bytes")).To(BeEquivalentTo(len(data)))
	g.Expect(gauge(t, regB, "strata_worker_replication_lag_seconds")).To(BeNumerically(">", 0))

	t.Log("a node of the rack comes (back) with an empty tier: the copy is made again")
	d := startWorker(t, master, "pool/node-d", "node-d")
	res, err = rb.Pass(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Copied).To(Equal(1))
	g.Eventually(func() []string { return holders(master, id) }).Should(Equal([]string{b.id, d.id}))
	g.Expect(gauge(t, regB, "strata_worker_replication_lag_bytes")).To(BeZero())
}

// TestCopiesAnotherNodeHoldsCountInASelectivePolicy: a block a reader on another node of the
// scope kept already has its copies; a checkpointed (clean) block needs none.
func TestCopiesAnotherNodeHoldsCountInASelectivePolicy(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	a := startWorker(t, master, "pool/node-a", "node-a")
	b := startWorker(t, master, "pool/node-b", "node-b")
	set := policies(t, 2, true, map[string]string{"node-a": "r1", "node-b": "r1"})
	r := newReplicator(t, master, a, set, 0, nil)

	id, data := seal(t, master, a, "read-elsewhere", 2)
	// What outputfs does on node b when it reads the block from node a, for a selective policy.
	info, err := a.store.Info(id)
	g.Expect(err).NotTo(HaveOccurred())
	kept, err := b.store.Put(ctx, id, bytes.NewReader(data), int64(len(data)), tierstore.PutOptions{Origin: info.Origin})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b.dir.Report(ctx, kept)).To(Succeed())
	res, err := r.Pass(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(replication.Result{}), "the copy b kept counts")

	clean, _ := seal(t, master, a, "checkpointed", 3)
	g.Expect(a.store.SetClean(ctx, clean)).To(Succeed())
	res, err = r.Pass(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(replication.Result{}), "the under-store holds a checkpointed block")
	g.Expect(holders(master, clean)).To(Equal([]string{a.id}))
}

// gauge is the value of the gauge name on reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestACopyOfAForgottenVersionIsNotRecorded: a replica (or a kept copy) reported after its
// file was forgotten for a recomputation publishes no hollow file in its place, and one of an
// earlier version is not recorded as a copy of the new one.
func TestACopyOfAForgottenVersionIsNotRecorded(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	a := startWorker(t, master, "pool/node-a", "node-a")
	b := startWorker(t, master, "pool/node-b", "node-b")
	id, data := seal(t, master, a, "part-0", 1)
	info, err := a.store.Info(id)
	g.Expect(err).NotTo(HaveOccurred())
	copied, err := b.store.Put(ctx, id, bytes.NewReader(data), int64(len(data)), tierstore.PutOptions{Origin: info.Origin})
	g.Expect(err).NotTo(HaveOccurred())

	_, err = master.DeleteFile(ctx, root+"/part-0")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b.dir.Report(ctx, copied)).To(Succeed())
	_, err = master.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/part-0"})
	g.Expect(status.Code(err)).To(Equal(codes.NotFound), "no file is made for a copy of a forgotten one")

	_, err = master.SealFile(ctx, &masterpb.SealFileRequest{Path: root + "/part-0", Dataset: dataset, ClientToken: "recomputed"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b.dir.Report(ctx, copied)).To(Succeed())
	f, err := master.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/part-0"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.GetBlockIds()).To(BeEmpty(), "the new version holds none of the old one's blocks")
}

// countingMaster counts the lookups of block locations a replicator makes.
type countingMaster struct {
	replication.Master
	lookups atomic.Int64
}

func (m *countingMaster) GetBlockLocations(ctx context.Context, req *masterpb.GetBlockLocationsRequest) (*masterpb.GetBlockLocationsResponse, error) {
	m.lookups.Add(1)
	return m.Master.GetBlockLocations(ctx, req)
}

// TestASettledBlockWaitsForItsRecheck: a block a pass found with nothing to do (no node of its
// rack to copy to) is not looked up at the master again before Recheck, and still counts in
// the lag meanwhile.
func TestASettledBlockWaitsForItsRecheck(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	a := startWorker(t, master, "pool/node-a", "node-a")
	startWorker(t, master, "pool/node-b", "node-b")
	set := policies(t, 2, true, map[string]string{"node-a": "r1", "node-b": "r2"})
	counting := &countingMaster{Master: master}
	r := newReplicator(t, counting, a, set, time.Hour, nil)
	seal(t, master, a, "alone", 1)
	for range 3 {
		res, err := r.Pass(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res).To(Equal(replication.Result{Unreplicated: 1}))
	}
	g.Expect(counting.lookups.Load()).To(BeEquivalentTo(1), "looked up once, then left alone until the recheck")
}
