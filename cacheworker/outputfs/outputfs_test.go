package outputfs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

const (
	blockSize = 64 << 10
	dataset   = "team-a/features/uid-1"
	root      = "/datasets/team-a/features/uid-1"
)

// worker is one node's part: a tier store, its data plane, and its directory of block
// locations; and, for the tests that checkpoint, its checkpointer.
type worker struct {
	id    string
	store *tierstore.Store
	dir   *locations.Directory
	cp    outputfs.Checkpoints
}

func startWorker(t *testing.T, master *client.Client, id string, quota int64) *worker {
	return startWorkerIn(t, master, id, quota, t.TempDir())
}

// openStore opens the tier store of a worker whose files are under base.
func openStore(base string, quota int64, dir *locations.Directory) (*tierstore.Store, error) {
	return tierstore.Open(context.Background(), tierstore.Config{
		Tiers: []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory,
			Dirs: []string{filepath.Join(base, "mem")}, Quota: quota}},
		IndexDir: filepath.Join(base, "index"),
		OnRemove: dir.Forget,
	})
}

// startWorkerIn starts a worker whose tiers are under base: a restarted worker finds there
// what the one before stored.
func startWorkerIn(t testing.TB, master *client.Client, id string, quota int64, base string) *worker {
	t.Helper()
	ctx := context.Background()
	peers := dataplane.NewPeers()
	dir := locations.NewDirectory(master, peers, id, logr.Discard())
	store, err := openStore(base, quota, dir)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	workerpb.RegisterWorkerServer(srv, dataplane.NewServer(store, nil, 0, nil, logr.Discard()))
	go func() { _ = srv.Serve(lis) }()
	if _, err := master.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: id, Address: lis.Addr().String(), Node: id}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = dir.Run(rctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Stop()
		_ = peers.Close()
		_ = store.Close()
	})
	return &worker{id: id, store: store, dir: dir}
}

func mountOutput(t *testing.T, master *client.Client, w *worker) *outputfs.Server {
	return mountOutputIn(t, master, w, blockSize, filepath.Join(t.TempDir(), "staging"), testr.New(t))
}

// mountOutputIn mounts the output on w, its files cut into blocks of size bs and staged in
// staging, with what the options change.
func mountOutputIn(t testing.TB, master *client.Client, w *worker, bs int64, staging string, log logr.Logger, options ...func(*outputfs.Config)) *outputfs.Server {
	t.Helper()
	dir := t.TempDir()
	cfg := outputfs.Config{
		Dataset: dataset, Root: root, Master: master, Store: w.store, Locations: w.dir, Checkpoints: w.cp,
		BlockSize: bs, StagingDir: staging, Name: "strata:test", Log: log,
	}
	for _, option := range options {
		option(&cfg)
	}
	s, err := outputfs.Mount(context.Background(), dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Unmount(ctx); err != nil {
			t.Errorf("unmounting %s: %v", s.Dir(), err)
		}
	})
	return s
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// masterFiles lists the Dataset's files at the master: path relative to the root → size.
func masterFiles(ctx context.Context, master *client.Client) (map[string]int64, error) {
	resp, err := master.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: root, Recursive: true})
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, e := range resp.GetEntries() {
		if !e.GetDir() {
			out[strings.TrimPrefix(e.GetPath(), root+"/")] = e.GetFile().GetSize()
		}
	}
	return out, nil
}

// TestWriteSealAndReadElsewhere writes an output on one node and reads it on another, through
// a real master and the real data plane: files are sealed when closed, immutable afterwards,
// published whole at the master, and read by the other node from the writer's tier.
func TestWriteSealAndReadElsewhere(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	a := startWorker(t, master, "pool/node-a", 64<<20)
	b := startWorker(t, master, "pool/node-b", 64<<20)
	mntA := mountOutput(t, master, a)

	big := randomBytes(3*blockSize+12345, 1)
	files := map[string][]byte{
		"part-00000/features.bin":    big,
		"part-00000/_SUCCESS":        {},
		"names/with spaces é ü.json": []byte(`{"ok": true}`),
	}
	for rel, data := range files {
		p := filepath.Join(mntA.Dir(), rel)
		g.Expect(os.MkdirAll(filepath.Dir(p), 0o755)).To(Succeed())
		g.Expect(os.WriteFile(p, data, 0o644)).To(Succeed(), "writing %s; close seals it", rel)
	}

	t.Log("closed files are at the master, whole, and nothing else is")
	got, err := masterFiles(ctx, master)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(map[string]int64{
		"part-00000/features.bin": int64(len(big)), "part-00000/_SUCCESS": 0, "names/with spaces é ü.json": 12,
	}))

	t.Log("a sealed file is immutable")
	p := filepath.Join(mntA.Dir(), "part-00000/features.bin")
	st, err := os.Stat(p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o444)), "sealing clears the write bits")
	_, err = os.OpenFile(p, os.O_WRONLY, 0)
	g.Expect(errors.Is(err, syscall.EPERM)).To(BeTrue(), "opening a sealed file for writing: %v", err)
	g.Expect(errors.Is(os.Truncate(p, 0), syscall.EPERM)).To(BeTrue(), "truncating a sealed file")
	g.Expect(os.ReadFile(p)).To(Equal(big), "the writer's node reads it back from its tier")

	t.Log("an open file renames freely and seals under its new name; a sealed one is EXDEV")
	f, err := os.Create(filepath.Join(mntA.Dir(), "part-00000/.tmp-1"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = f.Write([]byte("late"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.Rename(f.Name(), filepath.Join(mntA.Dir(), "part-00000/late.txt"))).To(Succeed())
	g.Expect(f.Close()).To(Succeed())
	err = os.Rename(filepath.Join(mntA.Dir(), "part-00000/late.txt"), filepath.Join(mntA.Dir(), "late.txt"))
	g.Expect(errors.Is(err, syscall.EXDEV)).To(BeTrue(), "renaming a sealed file: %v", err)
	got, err = masterFiles(ctx, master)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(HaveKeyWithValue("part-00000/late.txt", int64(4)))
	g.Expect(got).NotTo(HaveKey("part-00000/.tmp-1"))

	t.Log("another node mounts the output and reads every byte from the writer's tier")
	mntB := mountOutput(t, master, b)
	g.Expect(mntB.Files()).To(Equal(4))
	for rel, data := range files {
		g.Expect(os.ReadFile(filepath.Join(mntB.Dir(), rel))).To(Equal(data), "node b reads %s", rel)
	}
	g.Expect(os.ReadFile(filepath.Join(mntB.Dir(), "part-00000/late.txt"))).To(Equal([]byte("late")))
	names, err := os.ReadDir(filepath.Join(mntB.Dir(), "part-00000"))
	g.Expect(err).NotTo(HaveOccurred())
	var listed []string
	for _, e := range names {
		listed = append(listed, e.Name())
	}
	sort.Strings(listed)
	g.Expect(listed).To(Equal([]string{"_SUCCESS", "features.bin", "late.txt"}))
	_, err = os.Stat(filepath.Join(mntB.Dir(), outputfs.SealingDir))
	g.Expect(os.IsNotExist(err)).To(BeTrue(), "the sealing folder is never shown")

	t.Log("two nodes writing one path at once: the second close is EEXIST and its bytes stay readable on its node")
	fa, err := os.Create(filepath.Join(mntA.Dir(), "race.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	fb, err := os.Create(filepath.Join(mntB.Dir(), "race.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = fa.WriteString("from a")
	g.Expect(err).NotTo(HaveOccurred())
	_, err = fb.WriteString("from b")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fa.Close()).To(Succeed())
	err = fb.Close()
	g.Expect(errors.Is(err, syscall.EEXIST)).To(BeTrue(), "the second seal of a path: %v", err)
	g.Expect(os.ReadFile(filepath.Join(mntB.Dir(), "race.txt"))).To(Equal([]byte("from b")), "the loser's bytes are not lost")

	t.Log("a file sealed on a after b mounted shows on b")
	g.Expect(os.WriteFile(filepath.Join(mntA.Dir(), "part-00000/later.txt"), []byte("later"), 0o644)).To(Succeed())
	g.Expect(os.ReadFile(filepath.Join(mntB.Dir(), "part-00000/later.txt"))).To(Equal([]byte("later")))
	g.Expect(os.Mkdir(filepath.Join(mntA.Dir(), "part-00001"), 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(mntA.Dir(), "part-00001/rows"), []byte("rows"), 0o644)).To(Succeed())
	entries, err := os.ReadDir(mntB.Dir())
	g.Expect(err).NotTo(HaveOccurred())
	var top []string
	for _, e := range entries {
		top = append(top, e.Name())
	}
	g.Expect(top).To(ContainElement("part-00001"), "a listing shows the folders other nodes made")

	t.Log("a file the master forgot (lost, and to be recomputed) is gone on every node, and written again anew")
	_, err = master.DeleteFile(ctx, root+"/part-00000/later.txt")
	g.Expect(err).NotTo(HaveOccurred())
	_, err = os.ReadFile(filepath.Join(mntB.Dir(), "part-00000/later.txt"))
	g.Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue(), "reading a forgotten file: %v", err)
	g.Expect(os.WriteFile(filepath.Join(mntB.Dir(), "part-00000/later.txt"), []byte("recomputed"), 0o644)).To(Succeed())
	g.Expect(os.ReadFile(filepath.Join(mntA.Dir(), "part-00000/later.txt"))).To(Equal([]byte("recomputed")),
		"the node that wrote the first version reads the new one")

	t.Log("deleting a sealed file removes it at the master and from the writer's tier")
	id := blockindex.OutputBlockID(tokenOf(ctx, t, master, "part-00000/features.bin"), 0)
	_, _, err = a.store.OpenBlock(ctx, id)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.Remove(p)).To(Succeed())
	got, err = masterFiles(ctx, master)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).NotTo(HaveKey("part-00000/features.bin"))
	_, _, err = a.store.OpenBlock(ctx, id)
	g.Expect(errors.Is(err, tierstore.ErrNotFound)).To(BeTrue(), "the block is gone from the tier: %v", err)
}

// countingMaster counts the reads of files and folders an output mount makes at the master.
type countingMaster struct {
	outputfs.Master
	reads atomic.Int64
}

func (m *countingMaster) GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error) {
	m.reads.Add(1)
	return m.Master.GetFile(ctx, req)
}

func (m *countingMaster) ListFiles(ctx context.Context, req *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error) {
	m.reads.Add(1)
	return m.Master.ListFiles(ctx, req)
}

func (m *countingMaster) Lookup(ctx context.Context, req *masterpb.LookupRequest) (*masterpb.ListEntry, error) {
	m.reads.Add(1)
	return m.Master.Lookup(ctx, req)
}

// TestAnOpenOfACompleteDatasetAsksTheMasterNothing: opening a sealed file for reading asks the
// master whether it is still the Dataset's version, unless the Dataset is complete (a later
// step reads what an earlier one wrote): its files change only once the operator opens it
// again, and then each open asks again.
func TestAnOpenOfACompleteDatasetAsksTheMasterNothing(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	a := startWorker(t, master, "pool/node-a", 64<<20)
	b := startWorker(t, master, "pool/node-b", 64<<20)
	counted := &countingMaster{Master: master}
	mntA := mountOutputIn(t, master, a, blockSize, filepath.Join(t.TempDir(), "staging"), testr.New(t),
		func(c *outputfs.Config) { c.Master = counted })
	mntB := mountOutput(t, master, b)
	want := map[string][]byte{}
	for i := range 3 {
		name := fmt.Sprintf("part-%d", i)
		want[name] = []byte("rows of " + name)
		g.Expect(os.WriteFile(filepath.Join(mntB.Dir(), name), want[name], 0o644)).To(Succeed())
	}
	// readAll reads every file through node a's mount, and returns how many reads of files it
	// made at the master.
	readAll := func() int64 {
		before := counted.reads.Load()
		for name, data := range want {
			g.Expect(os.ReadFile(filepath.Join(mntA.Dir(), name))).To(Equal(data))
		}
		return counted.reads.Load() - before
	}
	g.Expect(readAll()).To(BeNumerically(">=", len(want)), "while the Dataset is written, each open asks the master")
	g.Expect(readAll()).To(Equal(int64(len(want))))

	_, err := master.CompleteDataset(ctx, dataset)
	g.Expect(err).NotTo(HaveOccurred())
	// The mount asks whether the Dataset is complete at most once a second.
	g.Eventually(readAll).WithTimeout(10*time.Second).Should(BeZero(), "once the Dataset is complete, opens ask the master nothing")

	_, err = master.ReopenDataset(ctx, dataset)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(readAll).WithTimeout(10*time.Second).Should(Equal(int64(len(want))), "once it is opened again (to recompute part of it), each open asks again")
}

// TestANameIsLookedUpAtTheMasterOnce: every file a writer creates is looked up first, and a
// name this node does not know may be a file or a folder another node sealed, so the lookup
// asks the master; it must ask once (a second read doubled the cost of a new small file), and
// still find either.
func TestANameIsLookedUpAtTheMasterOnce(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	a := startWorker(t, master, "pool/node-a", 64<<20)
	b := startWorker(t, master, "pool/node-b", 64<<20)
	counted := &countingMaster{Master: master}
	mntA := mountOutputIn(t, master, a, blockSize, filepath.Join(t.TempDir(), "staging"), testr.New(t),
		func(c *outputfs.Config) { c.Master = counted })
	mntB := mountOutput(t, master, b)
	g.Expect(os.MkdirAll(filepath.Join(mntB.Dir(), "made/on-b"), 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(mntB.Dir(), "made/on-b/rows"), []byte("rows"), 0o644)).To(Succeed())

	for _, tc := range []struct {
		rel  string
		want string // "missing", "dir" or the file's bytes
	}{
		{"missing", "missing"},
		{"made", "dir"},
		{"made/on-b", "dir"},
		{"made/on-b/rows", "rows"},
	} {
		before := counted.reads.Load()
		st, err := os.Stat(filepath.Join(mntA.Dir(), tc.rel))
		g.Expect(counted.reads.Load()-before).To(Equal(int64(1)), "reads at the master to look up %s", tc.rel)
		switch tc.want {
		case "missing":
			g.Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue(), "%s: %v", tc.rel, err)
		case "dir":
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st.IsDir()).To(BeTrue(), "%s is the folder node b made", tc.rel)
		default:
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(os.ReadFile(filepath.Join(mntA.Dir(), tc.rel))).To(Equal([]byte(tc.want)))
		}
	}

	t.Log("a new file costs one read at the master before it is written")
	before := counted.reads.Load()
	f, err := os.Create(filepath.Join(mntA.Dir(), "new"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(counted.reads.Load() - before).To(Equal(int64(1)))
	g.Expect(f.Close()).To(Succeed())
}

func tokenOf(ctx context.Context, t *testing.T, master *client.Client, rel string) string {
	t.Helper()
	f, err := master.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/" + rel})
	if err != nil {
		t.Fatal(err)
	}
	return f.GetClientToken()
}

// TestFullTierKeepsTheBytes fills a tier with a file larger than it: the close says ENOSPC,
// nothing is published, and the file stays whole on the node.
func TestFullTierKeepsTheBytes(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorker(t, master, "pool/node-a", 4*blockSize)
	mnt := mountOutput(t, master, w)

	data := randomBytes(6*blockSize, 2)
	p := filepath.Join(mnt.Dir(), "too-big.bin")
	err := os.WriteFile(p, data, 0o644)
	g.Expect(errors.Is(err, syscall.ENOSPC)).To(BeTrue(), "closing a file the tier cannot hold: %v", err)
	got, err := masterFiles(ctx, master)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(BeEmpty(), "nothing is published, not even the sealing file")
	g.Expect(os.ReadFile(p)).To(Equal(data), "the staged bytes are all there, holes punched for stored blocks put back")
	g.Expect(w.store.Blocks()).To(BeEmpty(), "the blocks of the failed seal are gone")

	t.Log("made smaller, it seals")
	g.Expect(os.WriteFile(p, data[:2*blockSize], 0o644)).To(Succeed())
	got, err = masterFiles(ctx, master)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(map[string]int64{"too-big.bin": 2 * blockSize}))
}

// TestRemountShowsSealedFiles mounts an output again: what was sealed is there, what was only
// staged by the earlier mount is not.
func TestRemountShowsSealedFiles(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorker(t, master, "pool/node-a", 64<<20)
	first := mountOutput(t, master, w)
	g.Expect(os.Mkdir(filepath.Join(first.Dir(), "out"), 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(first.Dir(), "out/a.txt"), []byte("sealed"), 0o644)).To(Succeed())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g.Expect(first.Unmount(ctx)).To(Succeed())

	second := mountOutput(t, master, w)
	g.Expect(second.Files()).To(Equal(1))
	g.Expect(os.ReadFile(filepath.Join(second.Dir(), "out/a.txt"))).To(Equal([]byte("sealed")))
}

// TestSignalsDoNotFailASeal closes a file while its thread is showered with signals, as Go's
// runtime preempts with SIGURG: every signal that reaches a thread waiting in close(2) makes the
// kernel interrupt the FLUSH, and the seal must go on regardless.
func TestSignalsDoNotFailASeal(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorker(t, master, "pool/node-a", 64<<20)
	mnt := mountOutput(t, master, w)

	for i := range 5 {
		data := randomBytes(16*blockSize, uint64(10+i))
		p := filepath.Join(mnt.Dir(), fmt.Sprintf("f%d.bin", i))
		f, err := os.Create(p)
		g.Expect(err).NotTo(HaveOccurred())
		_, err = f.Write(data)
		g.Expect(err).NotTo(HaveOccurred())

		closed := make(chan error, 1)
		tids := make(chan int, 1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tids <- unix.Gettid()
			closed <- f.Close()
		}()
		tid := <-tids
	storm:
		for {
			select {
			case err := <-closed:
				g.Expect(err).NotTo(HaveOccurred(), "closing f%d.bin under signals", i)
				break storm
			default:
				_ = unix.Tgkill(unix.Getpid(), tid, unix.SIGURG)
			}
		}
		g.Expect(os.ReadFile(p)).To(Equal(data))
	}
}

// TestCompleteDatasetIsReadOnly completes the Dataset at the master while the mount is in use,
// as the operator does when the Lineage's Job succeeds: nothing is added, renamed or removed any
// more, a file still open is not published, what was sealed reads on. Forgetting the Dataset,
// as a recomputation does, makes the same mount writable again.
func TestCompleteDatasetIsReadOnly(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorker(t, master, "pool/node-a", 64<<20)
	mnt := mountOutput(t, master, w)
	in := func(name string) string { return filepath.Join(mnt.Dir(), name) }

	g.Expect(os.WriteFile(in("a.txt"), []byte("written"), 0o644)).To(Succeed())
	late, err := os.Create(in("late.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = master.CompleteDataset(ctx, dataset)
	g.Expect(err).NotTo(HaveOccurred())

	_, err = late.WriteString("after the writer finished")
	g.Expect(err).NotTo(HaveOccurred(), "the bytes are only staged")
	g.Expect(late.Close()).To(MatchError(syscall.EROFS), "a file closed after completion is not published")
	g.Expect(os.WriteFile(in("new.txt"), nil, 0o644)).To(MatchError(syscall.EROFS))
	g.Expect(os.Mkdir(in("dir"), 0o755)).To(MatchError(syscall.EROFS))
	g.Expect(os.Remove(in("a.txt"))).To(MatchError(syscall.EROFS))
	g.Expect(os.Rename(in("a.txt"), in("b.txt"))).To(MatchError(syscall.EROFS))
	g.Expect(os.ReadFile(in("a.txt"))).To(Equal([]byte("written")))
	g.Expect(masterFiles(ctx, master)).To(Equal(map[string]int64{"a.txt": 7}))

	t.Log("forgotten for a recomputation, the Dataset takes files again through the same mount")
	_, err = master.DeleteDataset(ctx, dataset)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() error { return os.WriteFile(in("again.txt"), []byte("recomputed"), 0o644) }).
		WithTimeout(10 * time.Second).Should(Succeed())
	g.Expect(masterFiles(ctx, master)).To(HaveKeyWithValue("again.txt", int64(10)))
}

// TestASealHandsTheStagedBytesToTheTierWithoutCopyingThem writes a file of several blocks and
// closes it: each block the tier store holds afterwards is the very file its bytes were staged
// in (one inode; the seal linked it, copying nothing), and the staging folder is empty.
func TestASealHandsTheStagedBytesToTheTierWithoutCopyingThem(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorker(t, master, "pool/node-a", 64<<20)
	staging := filepath.Join(t.TempDir(), "staging")
	mnt := mountOutputIn(t, master, w, blockSize, staging, testr.New(t))

	data := randomBytes(2*blockSize+100, 3)
	f, err := os.Create(filepath.Join(mnt.Dir(), "three-blocks.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = f.Write(data)
	g.Expect(err).NotTo(HaveOccurred())
	staged := map[string]os.FileInfo{}
	entries, err := os.ReadDir(staging)
	g.Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		fi, err := os.Stat(filepath.Join(staging, e.Name()))
		g.Expect(err).NotTo(HaveOccurred())
		staged[e.Name()] = fi
	}
	g.Expect(staged).To(HaveLen(3), "a staging file per block")
	g.Expect(f.Close()).To(Succeed())

	token := tokenOf(ctx, t, master, "three-blocks.bin")
	for index := range int64(3) {
		id := blockindex.OutputBlockID(token, index)
		b, _, err := w.store.OpenBlock(ctx, id)
		g.Expect(err).NotTo(HaveOccurred())
		fi, err := b.Stat()
		g.Expect(b.Close()).To(Succeed())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(os.SameFile(fi, staged[id])).To(BeTrue(), "block %d is the file it was staged in", index)
	}
	g.Expect(os.ReadDir(staging)).To(BeEmpty(), "the staging files are gone with the seal")
	g.Expect(os.ReadFile(filepath.Join(mnt.Dir(), "three-blocks.bin"))).To(Equal(data))
}

// TestReadsOfLocalSealedBlocksAreSpliced reads a sealed file of several blocks, with its pages
// dropped first so that every byte is a READ, sequentially and at odd offsets across blocks:
// the blocks are in this node's tier, so the reads are spliced from their files, and every
// byte is right.
func TestReadsOfLocalSealedBlocksAreSpliced(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorker(t, master, "pool/node-a", 64<<20)
	reg := prometheus.NewRegistry()
	metrics, err := outputfs.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	mnt := mountOutputIn(t, master, w, blockSize, filepath.Join(t.TempDir(), "staging"), testr.New(t),
		func(c *outputfs.Config) { c.Metrics = metrics })
	p := filepath.Join(mnt.Dir(), "sealed.bin")
	data := randomBytes(3*blockSize+777, 4)
	g.Expect(os.WriteFile(p, data, 0o644)).To(Succeed())

	f, err := os.Open(p)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	g.Expect(unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)).To(Succeed())
	g.Expect(io.ReadAll(f)).To(Equal(data))
	for _, off := range []int64{blockSize - 5, 2*blockSize + 100, 17, 3 * blockSize} {
		g.Expect(unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)).To(Succeed())
		buf := make([]byte, 4096)
		n, err := f.ReadAt(buf, off)
		if err != nil {
			g.Expect(err).To(MatchError(io.EOF))
		}
		g.Expect(buf[:n]).To(Equal(data[off:min(off+4096, int64(len(data)))]), "at %d", off)
	}
	g.Expect(gauge(t, reg, "strata_worker_output_spliced_reads_total", "")).To(BeNumerically(">", 0))
}
