package mounter

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/fdstore"
	"github.com/strata-cache/strata/internal/fdstore/fdstoretest"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/internal/miniotest"
)

// startHandovers starts a file descriptor store, as the CSI node plugin runs one, and returns
// it and a client of it for pool-a's workers (Config.Handovers).
func startHandovers(t *testing.T) (*fdstore.Server, *fdstore.Client) {
	t.Helper()
	store, sock := fdstoretest.Start(t)
	handovers, err := fdstore.NewClient(sock, "pool-a")
	if err != nil {
		t.Fatal(err)
	}
	return store, handovers
}

// TestPodsMountsOutliveTheWorker stands for a worker restart with a pod reading: the worker
// stops (Close) while a pod's bind mount of a Dataset has a file open, and a new worker takes
// the mount over (Recover) from the CSI plugin's file descriptor store. The pod's read goes on
// with the right bytes, the mount never ends, and once the new worker unmounts it the store
// lets it go.
func TestPodsMountsOutliveTheWorker(t *testing.T) {
	g := NewWithT(t)
	store, handovers := startHandovers(t)
	f := newFixture(t, func(c *Config) { c.Handovers = handovers })
	ctx := context.Background()

	path := f.mount(t, f.request(uid))
	g.Expect(store.Len()).To(Equal(1), "the store holds the mount")
	pod := filepath.Join(t.TempDir(), "pod-volume")
	g.Expect(os.Mkdir(pod, 0o755)).To(Succeed())
	g.Expect(unix.Mount(path, pod, "", unix.MS_BIND, "")).To(Succeed())
	t.Cleanup(func() { _ = unix.Unmount(pod, unix.MNT_DETACH) })

	want := f.files["dir/b.bin"]
	open, err := os.Open(filepath.Join(pod, "dir/b.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = open.Close() }()
	head := make([]byte, blockSize/2)
	_, err = io.ReadFull(open, head)
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(f.m.Close()).To(Succeed())
	g.Expect(mounted(t, path)).To(BeTrue(), "a held mount stays mounted when the worker stops")
	rest := fusetest.ReadRest(t, open, "the restart")

	next := f.nextWorker(t)
	var got []byte
	g.Eventually(rest).WithTimeout(10 * time.Second).Should(Receive(&got))
	g.Expect(append(head, got...)).To(Equal(want), "the pod's read completes with the right bytes")
	b, err := os.ReadFile(filepath.Join(pod, "données/été 2024.csv"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b).To(Equal(f.files["données/été 2024.csv"]))

	// The new worker knows the mount: a publish finds it, and an unmount ends it.
	resp, err := next.MountDataset(ctx, f.request(uid))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetPath()).To(Equal(path))
	g.Expect(open.Close()).To(Succeed())
	g.Expect(unix.Unmount(pod, 0)).To(Succeed())
	_, err = next.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mounted(t, path)).To(BeFalse())
	g.Eventually(store.Len).Should(BeZero(), "an ended mount is dropped from the store")
}

// TestAStoreThatRestartedIsRefilled checks that mounts a restarted store lost are put back.
func TestAStoreThatRestartedIsRefilled(t *testing.T) {
	g := NewWithT(t)
	store, handovers := startHandovers(t)
	f := newFixture(t, func(c *Config) { c.Handovers = handovers })
	f.mount(t, f.request(uid))
	g.Expect(store.Len()).To(Equal(1))
	store.Close() // as a restarted store: empty
	g.Expect(store.Len()).To(BeZero())
	f.m.refill(context.Background(), logr.Discard())
	g.Expect(store.Len()).To(Equal(1))
	_, err := f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(store.Len()).To(BeZero())
}

// TestTheStoreKeepsTheRequestOfTheLastRotation puts the mount back in the store over and over,
// as the store's refill does (without the UID's lock), while the kubelet's republishes rotate the
// credentials: the store ends with the request of the last rotation, which the next worker
// resumes with. (Under -race, as make test runs, a rotation that replaced the request while a
// refill read it failed here.)
func TestTheStoreKeepsTheRequestOfTheLastRotation(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	_, handovers := startHandovers(t)
	f := newFixture(t, func(c *Config) { c.Handovers = handovers })
	f.mount(t, f.request(uid))
	f.m.mu.Lock()
	mnt := f.m.mounts[uid]
	f.m.mu.Unlock()
	g.Expect(mnt).NotTo(BeNil())

	stop := make(chan struct{})
	refilled := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				refilled <- nil
				return
			default:
			}
			if err := f.m.put(ctx, mnt); err != nil {
				refilled <- err
				return
			}
		}
	}()
	var last map[string]string
	for i := range 20 {
		req := f.request(uid)
		last = map[string]string{"accessKeyID": miniotest.AccessKey, "secretAccessKey": fmt.Sprintf("rotated-%d", i)}
		req.Source.Credentials = last
		g.Expect(f.mount(t, req)).NotTo(BeEmpty())
	}
	close(stop)
	g.Expect(<-refilled).To(Succeed())

	data, files, err := handovers.Get(ctx, uid)
	g.Expect(err).NotTo(HaveOccurred())
	for _, file := range files {
		_ = file.Close()
	}
	held := &workerpb.MountDatasetRequest{}
	g.Expect(proto.Unmarshal(data, held)).To(Succeed())
	g.Expect(held.GetSource().GetCredentials()).To(Equal(last), "the store holds the request of the last rotation")
	_, err = f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
}

// nextWorker starts the mounter of a worker that follows f's, as a restarted worker does: it
// takes over what f's left in the store (Recover).
func (f *fixture) nextWorker(t *testing.T) *Mounter {
	t.Helper()
	cfg := f.cfg
	cfg.Registerer = prometheus.NewRegistry()
	next, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close() })
	if err := next.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	return next
}
