package mounter

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestOutputMountsAreWritable mounts an output Dataset: it is writable, what is closed is at
// the master, a second publish on the node (a reader) gets the same mount, and after an
// unmount the next mount shows what was written.
func TestOutputMountsAreWritable(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master, outputs := outputsOfAMaster(t)
	f := newFixture(t, func(c *Config) { c.Outputs = outputs })
	staging := outputs.StagingDir
	req := &workerpb.MountDatasetRequest{Namespace: "team-a", Name: "features", Uid: "out-1", Output: true}

	p := f.mount(t, req)
	g.Expect(p).To(Equal(filepath.Join(f.mountsDir, "out-1")))
	g.Expect(os.MkdirAll(filepath.Join(p, "part-0"), 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(p, "part-0/rows.csv"), []byte("a,b\n1,2\n"), 0o644)).To(Succeed())
	g.Expect(filepath.Join(staging, "out-1")).To(BeADirectory(), "files are staged in the output's own folder")

	file, err := master.GetFile(ctx, &masterpb.GetFileRequest{Path: "/datasets/team-a/features/out-1/part-0/rows.csv"})
	g.Expect(err).NotTo(HaveOccurred(), "closing the file published it")
	g.Expect(file.GetSize()).To(Equal(int64(8)))

	reader := &workerpb.MountDatasetRequest{Namespace: "team-a", Name: "features", Uid: "out-1", Output: true, ReadOnly: true}
	g.Expect(f.mount(t, reader)).To(Equal(p), "a reader on the node shares the writer's mount")

	_, err = f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: "out-1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mounted(t, p)).To(BeFalse())
	p = f.mount(t, reader)
	g.Expect(os.ReadFile(filepath.Join(p, "part-0/rows.csv"))).To(Equal([]byte("a,b\n1,2\n")))
	_, err = f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: "out-1"})
	g.Expect(err).NotTo(HaveOccurred())
}

// TestOutputMountsOutliveTheWorker stands for a worker restart while a pipeline step writes:
// the worker stops (Close) with a file half written and another half read through a pod's bind
// mount, and a new worker takes the mount over (Recover) from the CSI plugin's file descriptor
// store. The writer goes on writing through the same descriptor and its close publishes the
// whole file; the reader gets the rest of its bytes; what was made before the restart is there.
func TestOutputMountsOutliveTheWorker(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master, outputs := outputsOfAMaster(t)
	store, handovers := startHandovers(t)
	f := newFixture(t, func(c *Config) {
		c.Outputs = outputs
		c.Handovers = handovers
	})
	req := &workerpb.MountDatasetRequest{Namespace: "team-a", Name: "features", Uid: "out-1", Output: true}
	path := f.mount(t, req)
	g.Expect(store.Len()).To(Equal(1), "the store holds the output mount")
	pod := filepath.Join(t.TempDir(), "pod-volume")
	g.Expect(os.Mkdir(pod, 0o755)).To(Succeed())
	g.Expect(unix.Mount(path, pod, "", unix.MS_BIND, "")).To(Succeed())
	t.Cleanup(func() { _ = unix.Unmount(pod, unix.MNT_DETACH) })

	sealed := bytes.Repeat([]byte("sealed before the restart;"), 10000)
	g.Expect(os.MkdirAll(filepath.Join(pod, "part-0"), 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(pod, "part-0/done.bin"), sealed, 0o644)).To(Succeed())
	reader, err := os.Open(filepath.Join(pod, "part-0/done.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = reader.Close() }()
	head := make([]byte, 1000)
	_, err = io.ReadFull(reader, head)
	g.Expect(err).NotTo(HaveOccurred())
	writer, err := os.Create(filepath.Join(pod, "part-0/open.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = writer.Close() }()
	_, err = writer.Write([]byte("written before the restart, "))
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(f.m.Close()).To(Succeed())
	g.Expect(mounted(t, path)).To(BeTrue(), "a held output mount stays mounted when the worker stops")
	rest := fusetest.ReadRest(t, reader, "the restart")

	next := f.nextWorker(t)
	var got []byte
	g.Eventually(rest).WithTimeout(10 * time.Second).Should(Receive(&got))
	g.Expect(append(head, got...)).To(Equal(sealed), "the reader gets the rest of the file")

	_, err = writer.Write([]byte("and after it"))
	g.Expect(err).NotTo(HaveOccurred(), "the writer goes on through the same descriptor")
	g.Expect(writer.Close()).To(Succeed(), "its close seals the file in the new worker")
	file, err := master.GetFile(ctx, &masterpb.GetFileRequest{Path: "/datasets/team-a/features/out-1/part-0/open.bin"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(file.GetSize()).To(Equal(int64(len("written before the restart, and after it"))))
	g.Expect(os.ReadFile(filepath.Join(pod, "part-0/open.bin"))).To(Equal([]byte("written before the restart, and after it")))
	entries, err := os.ReadDir(filepath.Join(pod, "part-0"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(entries).To(HaveLen(2))

	g.Expect(reader.Close()).To(Succeed())
	g.Expect(unix.Unmount(pod, 0)).To(Succeed())
	_, err = next.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: "out-1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mounted(t, path)).To(BeFalse())
	g.Eventually(store.Len).Should(BeZero(), "an ended mount is dropped from the store")
}

// outputsOfAMaster starts a master with this node's worker registered, and the Outputs of a
// mounter that writes there.
func outputsOfAMaster(t *testing.T) (*client.Client, *Outputs) {
	t.Helper()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	if _, err := master.RegisterWorker(context.Background(), &masterpb.RegisterWorkerRequest{Id: "pool/node-a", Node: "node-a"}); err != nil {
		t.Fatal(err)
	}
	peers := dataplane.NewPeers()
	t.Cleanup(func() { _ = peers.Close() })
	dir := locations.NewDirectory(master, peers, "pool/node-a", logr.Discard())
	return master, &Outputs{Master: master, Locations: dir, StagingDir: t.TempDir()}
}
