package checkpoint_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

const (
	blockSize = 64 << 10
	bucket    = "checkpoints"
	worker    = "pool/node-a"
)

// clock is a settable clock, shared by the tier store (blocks' creation) and the checkpointer.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// node is one worker's part: a tier store whose persist callback is its checkpointer's, a real
// master, and a real MinIO to checkpoint to.
type node struct {
	t      testing.TB
	master *client.Client
	// operator calls the master as the operator does.
	operator *client.Client
	minio    *miniotest.Server
	store    *tierstore.Store
	cp       *checkpoint.Checkpointer
	// calls counts the checkpointer's calls to the master.
	calls  *countedMaster
	reg    *prometheus.Registry
	clock  *clock
	nextID atomic.Uint64
	// bs is the size of the blocks files are sealed into.
	bs int64
}

// newNode is a worker's part whose master speaks mutual TLS, as in a cluster: the checkpointer
// calls it as the worker pool/node-a.
func newNode(t testing.TB, quota int64) *node {
	t.Helper()
	return newNodeWith(t, quota, mastertest.Options{GRPC: true, TLS: pkitest.New(t)})
}

func newNodeWith(t testing.TB, quota int64, masterOpts mastertest.Options) *node {
	t.Helper()
	masters := mastertest.New(t, 1, masterOpts)
	n := &node{t: t, bs: blockSize, master: masters.ClientAs(pki.Worker("pool", "node-a")), operator: masters.ClientAs(pki.Operator()),
		minio: miniotest.Start(t), reg: prometheus.NewRegistry(), clock: newClock()}
	n.minio.MakeBucket(t, bucket)
	metrics, err := checkpoint.NewMetrics(n.reg)
	if err != nil {
		t.Fatal(err)
	}
	n.calls = &countedMaster{Master: n.master}
	n.cp = checkpoint.New(checkpoint.Config{Master: n.calls, Metrics: metrics, Now: n.clock.Now, Poll: 50 * time.Millisecond, Log: testr.NewWithInterface(t, testr.Options{})})
	base := t.TempDir()
	n.store, err = tierstore.Open(context.Background(), tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(base, "mem")}, Quota: quota}},
		IndexDir: filepath.Join(base, "index"), Persist: n.cp.Persist, Now: n.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.store.Close() })
	n.cp.Attach(n.store)
	if _, err := n.master.RegisterWorker(context.Background(), &masterpb.RegisterWorkerRequest{Id: worker, Address: "127.0.0.1:1", Node: "node-a"}); err != nil {
		t.Fatal(err)
	}
	return n
}

// countedMaster is the master as the checkpointer calls it, counting the calls about each path;
// it can hold the answer to a GetFile of a path until the test lets it go.
type countedMaster struct {
	checkpoint.Master
	mu     sync.Mutex
	byPath map[string]int
	holds  map[string]*heldAnswer
}

// heldAnswer is a GetFile answer held: reached is closed when it is, released by the test.
// skip is how many GetFiles of the path pass before the one held.
type heldAnswer struct {
	skip              int
	reached, released chan struct{}
	releaseOnce       sync.Once
}

// release lets the held answer go; a test calls it again in a cleanup that runs before the
// background loop's (registered after n.run), so that a test failing before it released the
// answer fails instead of waiting forever for the loop it stops.
func (h *heldAnswer) release() { h.releaseOnce.Do(func() { close(h.released) }) }

// holdGetFile holds the answer to the GetFile of path after skip more.
func (m *countedMaster) holdGetFile(path string, skip int) *heldAnswer {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds == nil {
		m.holds = map[string]*heldAnswer{}
	}
	h := &heldAnswer{skip: skip, reached: make(chan struct{}), released: make(chan struct{})}
	m.holds[path] = h
	return h
}

func (m *countedMaster) count(path string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byPath == nil {
		m.byPath = map[string]int{}
	}
	m.byPath[path]++
}

// about is how many calls were made about path.
func (m *countedMaster) about(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byPath[path]
}

func (m *countedMaster) GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error) {
	m.count(req.GetPath())
	f, err := m.Master.GetFile(ctx, req)
	m.mu.Lock()
	h := m.holds[req.GetPath()]
	switch {
	case h != nil && h.skip > 0:
		h.skip--
		h = nil
	case h != nil:
		delete(m.holds, req.GetPath())
	}
	m.mu.Unlock()
	if h != nil {
		close(h.reached)
		<-h.released
	}
	return f, err
}

func (m *countedMaster) CheckpointFile(ctx context.Context, req *masterpb.CheckpointFileRequest) (*masterpb.File, error) {
	m.count(req.GetPath())
	return m.Master.CheckpointFile(ctx, req)
}

// run runs the background loop until the test ends.
func (n *node) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.cp.Run(ctx); close(done) }()
	n.t.Cleanup(func() { cancel(); <-done })
}

// settings is what the operator would write for datasets, checkpointed to MinIO under their names.
func (n *node) settings(endpoint string, datasets ...checkpoint.Dataset) {
	n.t.Helper()
	for i := range datasets {
		d := &datasets[i]
		d.Root = root(d.Name)
		d.Target = checkpoint.Target{URI: "s3://" + bucket + "/" + strings.ReplaceAll(d.Name, "/", "-"), Endpoint: endpoint,
			Credentials: map[string]string{understore.CredentialAccessKeyID: miniotest.AccessKey, understore.CredentialSecretAccessKey: miniotest.SecretKey}}
		if d.Strategy == "" {
			d.Strategy = datav1alpha1.CheckpointEdge
		}
	}
	raw, err := json.Marshal(checkpoint.File{Datasets: datasets})
	if err != nil {
		n.t.Fatal(err)
	}
	s, err := checkpoint.Parse(raw)
	if err != nil {
		n.t.Fatal(err)
	}
	n.cp.Apply(s)
}

func (n *node) endpoint() string { return "http://" + n.minio.Endpoint }

func root(dataset string) string { return "/datasets/" + dataset }

// file is an output file sealed on the node.
type file struct {
	dataset, rel, token string
	data                []byte
	blocks              []string
}

func (f file) path() string { return root(f.dataset) + "/" + f.rel }

// seal stores data as the blocks of a file of dataset, unclean, and publishes it at the master,
// as an output mount does.
func (n *node) seal(dataset, rel string, size int, seed uint64) file {
	n.t.Helper()
	return n.sealData(dataset, rel, randomBytes(size, seed), seed)
}

// sealData seals data as the file rel of dataset, its token made of seed.
func (n *node) sealData(dataset, rel string, data []byte, seed uint64) file {
	n.t.Helper()
	f, req := n.storeFile(dataset, rel, data, seed)
	n.publish(req)
	return f
}

// publish publishes a file stored by storeFile at the master, as the end of a seal does.
func (n *node) publish(req *masterpb.SealFileRequest) {
	n.t.Helper()
	if _, err := n.master.SealFile(context.Background(), req); err != nil {
		n.t.Fatal(err)
	}
}

// storeFile stores data as the blocks of the file rel of dataset, unclean, as the start of a
// seal does, and returns what publishes it.
func (n *node) storeFile(dataset, rel string, data []byte, seed uint64) (file, *masterpb.SealFileRequest) {
	n.t.Helper()
	ctx := context.Background()
	size := len(data)
	f := file{dataset: dataset, rel: rel, token: fmt.Sprintf("%032x", seed), data: data}
	if _, err := n.master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: dataset, Root: root(dataset)}); err != nil {
		n.t.Fatal(err)
	}
	req := &masterpb.SealFileRequest{Path: f.path(), Dataset: dataset, ClientToken: f.token}
	for i, off := int64(0), int64(0); off < int64(size); i, off = i+1, off+n.bs {
		end := min(off+n.bs, int64(size))
		id := f.token + "-" + strconv.FormatInt(i, 10)
		origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: f.path(), Dataset: dataset, Root: root(dataset), Index: i, Offset: off, FileToken: f.token})
		if err != nil {
			n.t.Fatal(err)
		}
		info, err := n.store.Put(ctx, id, bytes.NewReader(f.data[off:end]), end-off, tierstore.PutOptions{Origin: origin})
		if err != nil {
			n.t.Fatal(err)
		}
		f.blocks = append(f.blocks, id)
		req.Blocks = append(req.Blocks, &masterpb.CommitBlockRequest{BlockId: n.nextID.Add(1), Offset: off, Size: info.Size,
			Checksum: strconv.FormatUint(uint64(info.Checksum), 16), Worker: worker, Tier: "mem"})
	}
	return f, req
}

// object is the checkpoint of f in MinIO, or nil.
func (n *node) object(f file) []byte {
	key := strings.ReplaceAll(f.dataset, "/", "-") + "/" + f.rel
	obj, err := n.minio.Client.GetObject(context.Background(), bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil
	}
	defer func() { _ = obj.Close() }()
	data, err := io.ReadAll(obj)
	if err != nil {
		return nil
	}
	return data
}

// checkpointed says whether the master records f as checkpointed and every block of f is clean.
func (n *node) checkpointed(f file) bool {
	mf, err := n.master.GetFile(context.Background(), &masterpb.GetFileRequest{Path: f.path()})
	if err != nil || mf.GetCheckpointState() != masterpb.CheckpointState_CHECKPOINT_STATE_DONE {
		return false
	}
	for _, id := range f.blocks {
		if info, err := n.store.Info(id); err != nil || !info.Clean {
			return false
		}
	}
	return true
}

// count is the value of a checkpoint counter for reason.
func (n *node) count(name, reason string) float64 {
	families, err := n.reg.Gather()
	if err != nil {
		n.t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestEdgeWritesTheLeavesThenHotFiles: a file of a Dataset a Lineage has read already is not a
// leaf, and is left in memory, while the newer leaf is written; once read more than hotReads
// times it is hot, and written too.
func TestEdgeWritesTheLeavesThenHotFiles(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(),
		checkpoint.Dataset{Name: "ns/parent/u1", CachePolicy: "ns/p", EdgeFraction: 0.5, HotReads: 2, Consumed: true},
		checkpoint.Dataset{Name: "ns/leaf/u2", CachePolicy: "ns/p", EdgeFraction: 0.5, HotReads: 2})
	parent := n.seal("ns/parent/u1", "part-0", 3*blockSize+100, 1)
	n.clock.Advance(time.Second)
	leaf := n.seal("ns/leaf/u2", "dir/part-0", 2*blockSize, 2)
	n.run()

	g.Eventually(func() bool { return n.checkpointed(leaf) }).WithTimeout(30*time.Second).Should(BeTrue(), "the leaf is checkpointed")
	g.Expect(n.object(leaf)).To(Equal(leaf.data), "under its path in the Dataset, byte for byte")
	g.Expect(n.count("strata_worker_checkpoint_files_total", "edge")).To(BeEquivalentTo(1))
	g.Consistently(func() []byte { return n.object(parent) }).WithTimeout(time.Second).Should(BeNil(),
		"a file a Lineage read already, read no more than hotReads times, stays in memory")
	g.Expect(n.checkpointed(parent)).To(BeFalse())

	for range 3 {
		_, _, err := n.store.Get(context.Background(), parent.blocks[0])
		g.Expect(err).NotTo(HaveOccurred())
	}
	n.cp.Wake()
	g.Eventually(func() bool { return n.checkpointed(parent) }).WithTimeout(30*time.Second).Should(BeTrue(), "read three times, it is hot")
	g.Expect(n.object(parent)).To(Equal(parent.data))
	g.Expect(n.count("strata_worker_checkpoint_files_total", "hot")).To(BeEquivalentTo(1))
	mf, err := n.master.GetFile(context.Background(), &masterpb.GetFileRequest{Path: parent.path()})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mf.GetCheckpointUri()).To(Equal("s3://checkpoints/ns-parent-u1/part-0"))
}

// TestTemporaryDataIsNeverWrittenInTheBackground: a temporary Dataset, a file under a
// temporary path pattern, and a Dataset of strategy None stay in memory, while a file next to
// them is written.
func TestTemporaryDataIsNeverWrittenInTheBackground(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(),
		checkpoint.Dataset{Name: "ns/temp/u1", Temporary: true},
		checkpoint.Dataset{Name: "ns/mixed/u2", TemporaryPaths: []string{"_tmp/**"}},
		checkpoint.Dataset{Name: "ns/none/u3", Strategy: datav1alpha1.CheckpointNone})
	never := []file{
		n.seal("ns/temp/u1", "a", blockSize, 1),
		n.seal("ns/mixed/u2", "_tmp/scratch/b", blockSize, 2),
		n.seal("ns/none/u3", "c", blockSize, 3),
	}
	n.clock.Advance(time.Second)
	kept := n.seal("ns/mixed/u2", "result", blockSize, 4)
	n.run()

	g.Eventually(func() bool { return n.checkpointed(kept) }).WithTimeout(30 * time.Second).Should(BeTrue())
	for _, f := range never {
		g.Consistently(func() []byte { return n.object(f) }).WithTimeout(500*time.Millisecond).Should(BeNil(), "%s is never written", f.path())
	}
}

// TestIntervalWritesAtTheTickAfterTheFile: under strategy Interval a file waits for the first
// tick after it was written, ticks counted from the Dataset's creation.
func TestIntervalWritesAtTheTickAfterTheFile(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, 64<<20)
	created := n.clock.Now()
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/every/u1", Strategy: datav1alpha1.CheckpointInterval,
		IntervalSeconds: 60, CreatedUnix: created.Unix()})
	n.clock.Advance(70 * time.Second)
	f := n.seal("ns/every/u1", "x", blockSize, 1) // written after the first tick (60 s): due at 120 s
	n.run()
	n.clock.Advance(40 * time.Second) // 110 s
	n.cp.Wake()
	g.Consistently(func() []byte { return n.object(f) }).WithTimeout(500 * time.Millisecond).Should(BeNil())
	n.clock.Advance(10 * time.Second) // 120 s
	n.cp.Wake()
	g.Eventually(func() bool { return n.checkpointed(f) }).WithTimeout(30 * time.Second).Should(BeTrue())
	g.Expect(n.count("strata_worker_checkpoint_files_total", "interval")).To(BeEquivalentTo(1))
}

// TestAFullTierWritesBeforeItDrops: a tier full of output that is not checkpointed writes the
// file of the block it drops to the under-store first, whatever the strategy, and a Dataset
// without a target keeps its blocks: the write that needs their room fails and says why.
func TestAFullTierWritesBeforeItDrops(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, 6*blockSize)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1", Strategy: datav1alpha1.CheckpointNone, Temporary: true})
	first := n.seal("ns/out/u1", "first", 2*blockSize, 1)
	n.clock.Advance(time.Second)
	n.seal("ns/out/u1", "second", 2*blockSize, 2)
	n.clock.Advance(time.Second)
	n.seal("ns/out/u1", "third", 2*blockSize, 3) // past the high watermark: the coldest leave

	g.Expect(n.object(first)).To(Equal(first.data), "the file of the block dropped was written first, whole")
	mf, err := n.master.GetFile(ctx, &masterpb.GetFileRequest{Path: first.path()})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mf.GetCheckpointState()).To(Equal(masterpb.CheckpointState_CHECKPOINT_STATE_DONE))
	_, err = n.store.Info(first.blocks[0])
	g.Expect(errors.Is(err, tierstore.ErrNotFound)).To(BeTrue(), "and its block left memory: %v", err)
	g.Expect(n.count("strata_worker_checkpoint_files_total", "persist")).To(BeEquivalentTo(1))
	g.Expect(n.store.Stats()[0].Persisted).To(BeNumerically(">=", 1))

	// A Dataset with no target: its blocks stay, and once they fill the tier, writes fail.
	var err2 error
	for i := range 8 {
		n.clock.Advance(time.Second)
		origin, _ := proto.Marshal(&workerpb.BlockOrigin{Path: root("ns/bare/u2") + "/f" + strconv.Itoa(i), Dataset: "ns/bare/u2",
			Root: root("ns/bare/u2"), FileToken: fmt.Sprintf("%032x", 100+i)})
		_, err2 = n.store.Put(ctx, fmt.Sprintf("%032x-0", 100+i), bytes.NewReader(randomBytes(blockSize, uint64(i))), blockSize,
			tierstore.PutOptions{Origin: origin})
		if err2 != nil {
			break
		}
	}
	g.Expect(errors.Is(err2, tierstore.ErrTierFull)).To(BeTrue(), "a tier full of what exists nowhere else refuses writes: %v", err2)
	g.Expect(err2.Error()).To(ContainSubstring("has no checkpoint target this worker knows of (its spec.checkpoint)"))
}

// TestWriteThroughAboveTheThreshold: a file above the Dataset's syncWriteThreshold is in the
// under-store before its seal returns, and recorded once published; a smaller one is left to
// the background; an under-store that cannot be reached fails the seal and says where.
func TestWriteThroughAboveTheThreshold(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/big/u1", Strategy: datav1alpha1.CheckpointNone, SyncWriteThreshold: 2 * blockSize})

	big := n.seal("ns/big/u1", "big", 3*blockSize, 1)
	sealed := checkpoint.SealedFile{Dataset: big.dataset, Path: big.path(), Token: big.token, Size: int64(len(big.data)), Blocks: big.blocks}
	wrote, err := n.cp.WriteThrough(ctx, sealed)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(wrote).NotTo(BeEmpty(), "the version written")
	g.Expect(n.object(big)).To(Equal(big.data), "written before the seal returns")
	n.cp.Published(ctx, sealed, wrote)
	g.Expect(n.checkpointed(big)).To(BeTrue(), "recorded at the master and clean once published")

	small := n.seal("ns/big/u1", "small", blockSize, 2)
	wrote, err = n.cp.WriteThrough(ctx, checkpoint.SealedFile{Dataset: small.dataset, Path: small.path(), Token: small.token,
		Size: int64(len(small.data)), Blocks: small.blocks})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(wrote).To(BeEmpty())
	g.Expect(n.object(small)).To(BeNil())

	n.settings("http://"+miniotest.ClosedAddr(t), checkpoint.Dataset{Name: "ns/big/u1", Strategy: datav1alpha1.CheckpointNone, SyncWriteThreshold: 2 * blockSize})
	other := n.seal("ns/big/u1", "other", 3*blockSize, 3)
	_, err = n.cp.WriteThrough(ctx, checkpoint.SealedFile{Dataset: other.dataset, Path: other.path(), Token: other.token,
		Size: int64(len(other.data)), Blocks: other.blocks})
	g.Expect(err).To(MatchError(And(ContainSubstring("above the syncWriteThreshold"), ContainSubstring("s3://checkpoints/ns-big-u1"))))
	g.Expect(errors.Is(err, understore.ErrUnreachable)).To(BeTrue(), "%v", err)
}

// TestReadBackAfterTheBlocksAreGone: a checkpointed file whose blocks left the node is read
// from its checkpoint, and the block is kept, clean; a file with no checkpoint is not.
func TestReadBackAfterTheBlocksAreGone(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1", Strategy: datav1alpha1.CheckpointNone, SyncWriteThreshold: 1})
	f := n.seal("ns/out/u1", "x", 2*blockSize+10, 1)
	sealed := checkpoint.SealedFile{Dataset: f.dataset, Path: f.path(), Token: f.token, Size: int64(len(f.data)), Blocks: f.blocks}
	wrote, err := n.cp.WriteThrough(ctx, sealed)
	g.Expect(err).NotTo(HaveOccurred())
	n.cp.Published(ctx, sealed, wrote)
	for _, id := range f.blocks {
		g.Expect(n.store.Delete(ctx, id)).To(Succeed())
	}

	req := checkpoint.ReadBackRequest{Dataset: f.dataset, Root: root(f.dataset), Path: f.path(), Token: f.token,
		BlockID: f.blocks[2], Index: 2, Offset: 2 * blockSize, Length: 10}
	data, err := n.cp.ReadBack(ctx, req)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data).To(Equal(f.data[2*blockSize:]))
	info, err := n.store.Info(f.blocks[2])
	g.Expect(err).NotTo(HaveOccurred(), "the block read back is kept")
	g.Expect(info.Clean).To(BeTrue(), "clean: its checkpoint is a copy")

	req.Token = "another version"
	_, err = n.cp.ReadBack(ctx, req)
	g.Expect(errors.Is(err, checkpoint.ErrNotCheckpointed)).To(BeTrue(), "%v", err)
}

// TestAFailedCheckpointIsTriedAgain: a target that cannot be reached fails the checkpoint,
// counted, and the file stays unclean; once the target is fixed, the file is tried at once (the
// clock stands still: no backoff comes due), whether its failure was recorded before the new
// settings or after, and the retry writes it.
func TestAFailedCheckpointIsTriedAgain(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, 64<<20)
	n.settings("http://"+miniotest.ClosedAddr(t), checkpoint.Dataset{Name: "ns/out/u1"})
	f := n.seal("ns/out/u1", "x", blockSize, 1)
	n.run()
	g.Eventually(func() float64 { return n.count("strata_worker_checkpoint_failures_total", "edge") }).
		WithTimeout(30 * time.Second).Should(BeNumerically(">=", 1))
	g.Expect(n.checkpointed(f)).To(BeFalse())

	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1"})
	g.Eventually(func() bool { return n.checkpointed(f) }).WithTimeout(30 * time.Second).Should(BeTrue())
	g.Expect(n.object(f)).To(Equal(f.data))
}

// TestAFailedCheckpointWaitsOutItsBackoff: with the target unchanged, a failed file is not
// tried again before its backoff is due, and is once the clock passes it.
func TestAFailedCheckpointWaitsOutItsBackoff(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, 64<<20)
	n.settings("http://"+miniotest.ClosedAddr(t), checkpoint.Dataset{Name: "ns/out/u1"})
	n.seal("ns/out/u1", "x", blockSize, 1)
	n.run()
	failures := func() float64 { return n.count("strata_worker_checkpoint_failures_total", "edge") }
	g.Eventually(failures).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 1))
	first := failures()
	for range 5 {
		n.cp.Wake()
	}
	g.Consistently(failures).WithTimeout(300*time.Millisecond).Should(Equal(first), "woken, but not due")
	g.Eventually(func() float64 {
		n.clock.Advance(time.Second)
		n.cp.Wake()
		return failures()
	}).WithTimeout(30*time.Second).Should(BeNumerically(">", first), "due once the clock passes its backoff")
}

// TestSettingsRefuseWhatTheOperatorNeverWrites: a bad entry refuses the whole file (the last
// good settings stay in force), naming the Dataset.
func TestSettingsRefuseWhatTheOperatorNeverWrites(t *testing.T) {
	for name, tc := range map[string]struct {
		dataset checkpoint.Dataset
		says    string
	}{
		"a target that is not S3": {
			checkpoint.Dataset{Name: "ns/a/u", Root: "/datasets/ns/a/u", Strategy: "Edge", Target: checkpoint.Target{URI: "file:///tmp"}},
			"is not an s3:// URI",
		},
		"an Interval without a period": {
			checkpoint.Dataset{Name: "ns/a/u", Root: "/datasets/ns/a/u", Strategy: "Interval", Target: checkpoint.Target{URI: "s3://b"}},
			"needs a positive interval",
		},
		"an unknown strategy": {
			checkpoint.Dataset{Name: "ns/a/u", Root: "/datasets/ns/a/u", Strategy: "Sometimes", Target: checkpoint.Target{URI: "s3://b"}},
			"unknown strategy",
		},
		"a bad temporary pattern": {
			checkpoint.Dataset{Name: "ns/a/u", Root: "/datasets/ns/a/u", Strategy: "Edge", Target: checkpoint.Target{URI: "s3://b"},
				TemporaryPaths: []string{"a/[x"}},
			"temporaryPathPatterns",
		},
	} {
		t.Run(name, func(t *testing.T) {
			raw, err := json.Marshal(checkpoint.File{Datasets: []checkpoint.Dataset{tc.dataset}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = checkpoint.Parse(raw)
			NewWithT(t).Expect(err).To(MatchError(And(ContainSubstring("ns/a/u"), ContainSubstring(tc.says))))
		})
	}
	s, err := checkpoint.Parse(nil)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	NewWithT(t).Expect(s.Datasets()).To(BeZero(), "no file checkpoints nothing")
}

// TestAForgottenFileIsLeftToTheSweeper: a file the master forgot (its output is recomputed) is
// not written, nor tried again, and the files after it are checkpointed.
func TestAForgottenFileIsLeftToTheSweeper(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1"})
	forgotten := n.seal("ns/out/u1", "old", blockSize, 1)
	_, err := n.master.DeleteFile(context.Background(), forgotten.path())
	g.Expect(err).NotTo(HaveOccurred())
	n.run()
	n.clock.Advance(time.Second)
	next := n.seal("ns/out/u1", "new", blockSize, 2)
	n.cp.Wake()
	g.Eventually(func() bool { return n.checkpointed(next) }).WithTimeout(30 * time.Second).Should(BeTrue())
	g.Expect(n.object(forgotten)).To(BeNil())
}

// TestAFileIsCheckpointedOncePublished: an output mount stores a file's blocks before it
// publishes the file at the master; a checkpointer that sees the blocks first waits for it.
func TestAFileIsCheckpointedOncePublished(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1"})
	f, publish := n.storeFile("ns/out/u1", "x", randomBytes(blockSize, 1), 1)
	n.run()
	g.Consistently(func() []byte { return n.object(f) }).WithTimeout(500*time.Millisecond).Should(BeNil(), "not published: nothing to record")
	n.publish(publish)
	// What the output mount says once it published the file (the clock stands still: only this
	// brings the file's turn).
	n.cp.Published(context.Background(), checkpoint.SealedFile{Dataset: f.dataset, Path: f.path(), Token: f.token,
		Size: int64(len(f.data)), Blocks: f.blocks}, "")
	g.Eventually(func() bool { return n.checkpointed(f) }).WithTimeout(30 * time.Second).Should(BeTrue())
	g.Expect(n.object(f)).To(Equal(f.data))
}

// TestOneLookAtTheStoreServesManyFiles: a look at the store lists every block not yet clean, so
// a round checkpoints every file its plan picks from one look before it looks again, rather
// than looking once per file (a node holding n such blocks paid n for each file).
func TestOneLookAtTheStoreServesManyFiles(t *testing.T) {
	g := NewWithT(t)
	n := newNode(t, 64<<20)
	// No poll while the test runs: only the rounds look at the store.
	n.cp = checkpoint.New(checkpoint.Config{Master: n.calls, Now: n.clock.Now, Poll: time.Hour, Log: testr.NewWithInterface(t, testr.Options{})})
	looks := &lookCounter{tierBlocks: n.store}
	n.cp.Attach(looks)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1"})
	const count = 12
	var files []file
	for i := range count {
		f, publish := n.storeFile("ns/out/u1", fmt.Sprintf("part-%02d", i), randomBytes(4096, uint64(i)+1), uint64(i)+1)
		n.publish(publish)
		files = append(files, f)
	}
	n.run()
	g.Eventually(func() int {
		done := 0
		for _, f := range files {
			if n.checkpointed(f) {
				done++
			}
		}
		return done
	}).WithTimeout(60 * time.Second).Should(Equal(count))
	for _, f := range files {
		g.Expect(n.object(f)).To(Equal(f.data))
	}
	// The round that checkpointed them all, the one after it (nothing left), and the one the
	// settings asked for; a look per file would be count more.
	g.Expect(looks.n.Load()).To(BeNumerically("<=", 3), "looks at the store for %d files", count)
}

// lookCounter counts the looks at the store, each of which lists every block not clean.
type lookCounter struct {
	tierBlocks
	n atomic.Int64
}

// tierBlocks is the tier store as the checkpointer uses it, under a name of its own so that
// lookCounter can both embed it and have a method UncleanBlocks.
type tierBlocks interface{ checkpoint.Blocks }

func (l *lookCounter) UncleanBlocks() []tierstore.BlockInfo {
	l.n.Add(1)
	return l.tierBlocks.UncleanBlocks()
}

// TestAnAttemptsFileIsCheckpointedOncePublished: a file a pod sealed as its attempt is not the
// Dataset's yet (its pod may fail, and its files be discarded); it reaches the under-store only
// once the operator publishes the attempt.
func TestAnAttemptsFileIsCheckpointedOncePublished(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1"})
	_, err := n.operator.SetDatasetRecovery(ctx, &masterpb.SetDatasetRecoveryRequest{
		Name: "ns/out/u1", Root: root("ns/out/u1"), Recovery: &masterpb.DatasetRecovery{CommitPerAttempt: true}})
	g.Expect(err).NotTo(HaveOccurred())
	f, req := n.storeFile("ns/out/u1", "x", randomBytes(blockSize, 1), 1)
	req.Attempt = "pod-1"
	n.publish(req)
	n.run()
	n.cp.Wake()
	g.Consistently(func() []byte { return n.object(f) }).WithTimeout(500*time.Millisecond).Should(BeNil(), "an attempt's file stays out of the under-store")
	_, err = n.operator.SettleAttempt(ctx, &masterpb.SettleAttemptRequest{Dataset: "ns/out/u1", Attempt: "pod-1", Publish: true})
	g.Expect(err).NotTo(HaveOccurred())
	n.cp.Published(ctx, checkpoint.SealedFile{Dataset: f.dataset, Path: f.path(), Token: f.token, Size: int64(len(f.data)), Blocks: f.blocks}, "")
	g.Eventually(func() bool { return n.checkpointed(f) }).WithTimeout(30 * time.Second).Should(BeTrue())
	g.Expect(n.object(f)).To(Equal(f.data))
}

// TestAnOlderVersionsUploadNeverLandsOnANewerOne: a checkpoint of a file that the master said
// was current (its second answer, after the look at the bucket), whose upload starts only after
// the file was written again (its output recomputed: the old version forgotten, the new one
// written through and published), fails when it would land, and the bucket keeps the new
// version's bytes, which read back as the new version.
func TestAnOlderVersionsUploadNeverLandsOnANewerOne(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1", SyncWriteThreshold: 1})
	old := n.seal("ns/out/u1", "x", 2*blockSize, 1)
	held := n.calls.holdGetFile(old.path(), 1)
	n.run()
	t.Cleanup(held.release)
	n.cp.Wake()
	g.Eventually(held.reached).WithTimeout(30*time.Second).Should(BeClosed(), "the master said the old version is current")

	_, err := n.master.DeleteFile(ctx, old.path())
	g.Expect(err).NotTo(HaveOccurred())
	newer, publish := n.storeFile("ns/out/u1", "x", randomBytes(2*blockSize, 2), 2)
	sealed := checkpoint.SealedFile{Dataset: newer.dataset, Path: newer.path(), Token: newer.token, Size: int64(len(newer.data)), Blocks: newer.blocks}
	written, err := n.cp.WriteThrough(ctx, sealed)
	g.Expect(err).NotTo(HaveOccurred())
	n.publish(publish)
	n.cp.Published(ctx, sealed, written)
	g.Expect(n.checkpointed(newer)).To(BeTrue())
	g.Expect(n.object(newer)).To(Equal(newer.data))

	before := n.calls.about(old.path())
	held.release()
	// The master is asked about the path again only once the old upload has ended, landed or not.
	g.Eventually(func() int { return n.calls.about(old.path()) }).WithTimeout(30 * time.Second).Should(BeNumerically(">", before))
	g.Expect(n.object(newer)).To(Equal(newer.data), "the old version's upload did not land on the new one")

	for _, id := range newer.blocks {
		g.Expect(n.store.Delete(ctx, id)).To(Succeed())
	}
	data, err := n.cp.ReadBack(ctx, checkpoint.ReadBackRequest{Dataset: newer.dataset, Root: root(newer.dataset), Path: newer.path(),
		Token: newer.token, BlockID: newer.blocks[1], Index: 1, Offset: blockSize, Length: blockSize})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data).To(Equal(newer.data[blockSize:]))
}

// TestACheckpointReplacedInTheBucketIsNotReadBack: a checkpoint object replaced since it was
// written (by hand, or by another writer of the path) holds other bytes: a read back refuses it,
// and the master's record of the checkpoint is cleared, so the file counts as lost.
func TestACheckpointReplacedInTheBucketIsNotReadBack(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, 64<<20)
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/out/u1", Strategy: datav1alpha1.CheckpointNone, SyncWriteThreshold: 1})
	f := n.seal("ns/out/u1", "x", 2*blockSize, 1)
	sealed := checkpoint.SealedFile{Dataset: f.dataset, Path: f.path(), Token: f.token, Size: int64(len(f.data)), Blocks: f.blocks}
	written, err := n.cp.WriteThrough(ctx, sealed)
	g.Expect(err).NotTo(HaveOccurred())
	n.cp.Published(ctx, sealed, written)
	g.Expect(n.checkpointed(f)).To(BeTrue())
	mf, err := n.master.GetFile(ctx, &masterpb.GetFileRequest{Path: f.path()})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mf.GetCheckpointVersion()).To(Equal(written), "the master records the version written")

	other := randomBytes(len(f.data), 2)
	n.minio.Put(t, bucket, "ns-out-u1/x", other)
	for _, id := range f.blocks {
		g.Expect(n.store.Delete(ctx, id)).To(Succeed())
	}
	_, err = n.cp.ReadBack(ctx, checkpoint.ReadBackRequest{Dataset: f.dataset, Root: root(f.dataset), Path: f.path(), Token: f.token,
		BlockID: f.blocks[0], Index: 0, Offset: 0, Length: blockSize})
	g.Expect(errors.Is(err, checkpoint.ErrNotCheckpointed)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(ContainSubstring("replaced in the under-store")))
	mf, err = n.master.GetFile(ctx, &masterpb.GetFileRequest{Path: f.path()})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mf.GetCheckpointState()).To(Equal(masterpb.CheckpointState_CHECKPOINT_STATE_NONE), "no checkpoint: the file is lost, and recomputed")
}
