package mounter

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// fuseReadBytes is what the worker's FUSE file systems have returned to readers so far.
func (f *fixture) fuseReadBytes(t *testing.T) float64 {
	t.Helper()
	families, err := f.cfg.Registerer.(*prometheus.Registry).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == "strata_worker_fuse_read_bytes_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no strata_worker_fuse_read_bytes_total")
	return 0
}

// The next pod of a node reads what the last one read from the kernel's page cache, which
// lives as long as the file system: an idle Dataset stays mounted a while.
func TestTheNextPodReadsAnIdleDatasetFromThePageCache(t *testing.T) {
	for _, tc := range []struct {
		name     string
		keepIdle time.Duration
		// throughWorker: whether the second read reaches the worker.
		throughWorker bool
	}{
		{name: "kept mounted while idle", keepIdle: time.Hour, throughWorker: false},
		{name: "unmounted at once", keepIdle: 0, throughWorker: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			f := newFixture(t, func(c *Config) { c.KeepIdle = tc.keepIdle })
			ctx := context.Background()
			want := f.files["dir/b.bin"]

			path := f.mount(t, f.request(uid))
			got, err := os.ReadFile(filepath.Join(path, "dir", "b.bin"))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(want))
			g.Expect(f.fuseReadBytes(t)).To(BeNumerically(">=", len(want)), "a multi-block file is read through the worker")

			_, err = f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: uid})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(mounted(t, path)).To(Equal(tc.keepIdle > 0))

			before := f.fuseReadBytes(t)
			g.Expect(f.mount(t, f.request(uid))).To(Equal(path))
			got, err = os.ReadFile(filepath.Join(path, "dir", "b.bin"))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(want))
			if tc.throughWorker {
				g.Expect(f.fuseReadBytes(t) - before).To(BeNumerically(">=", len(want)))
			} else {
				g.Expect(f.fuseReadBytes(t)).To(Equal(before), "the second pod's read came from the page cache")
			}
		})
	}
}

func TestAnIdleDatasetIsUnmountedOnceItsTimeIsUp(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, func(c *Config) { c.KeepIdle = 100 * time.Millisecond })
	path := f.mount(t, f.request(uid))

	// Mounted again before the time is up: a pod uses it, so it stays.
	_, err := f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	f.mount(t, f.request(uid))
	f.m.mu.Lock()
	mnt := f.m.mounts[uid]
	f.m.mu.Unlock()
	unlock, err := f.m.lock(context.Background(), uid)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mnt.idle).To(BeNil(), "a mount a pod uses again is not idle")
	unlock()

	_, err = f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() bool { return mounted(t, path) }).WithTimeout(10*time.Second).Should(BeFalse(), "unmounted once idle for KeepIdle")
	g.Eventually(func() bool {
		f.m.mu.Lock()
		defer f.m.mu.Unlock()
		return f.m.mounts[uid] == nil
	}).WithTimeout(10 * time.Second).Should(BeTrue())
}

func TestAnIdleMountOfAnotherSpecIsReplaced(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, func(c *Config) { c.KeepIdle = time.Hour })
	f.mount(t, f.request(uid))

	f.srv.Put(t, bucket, "sets/v2/only-in-v2.txt", []byte("v2"))
	req := f.request(uid)
	req.Source.Uri = "s3://" + bucket + "/sets/v2"
	_, err := f.client.MountDataset(context.Background(), req)
	g.Expect(err).To(HaveOccurred(), "a pod still uses the mount of the other source")

	_, err = f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	path := f.mount(t, req)
	got, err := os.ReadFile(filepath.Join(path, "only-in-v2.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(got)).To(Equal("v2"))
}

// A worker that stops unmounts its idle Datasets rather than leave them to the next worker
// in the file descriptor store: that worker could not tell that no pod mounts them, and would
// keep them for good.
func TestCloseUnmountsIdleDatasets(t *testing.T) {
	g := NewWithT(t)
	store, handovers := startHandovers(t)
	f := newFixture(t, func(c *Config) { c.KeepIdle = time.Hour; c.Handovers = handovers })
	idle := f.mount(t, f.request(uid))
	const used = "7d4b2c1a-0e9f-4a3b-8c2d-5e6f7a8b9c0d"
	inUse := f.mount(t, f.request(used))
	g.Expect(store.Len()).To(Equal(2))
	_, err := f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(f.m.Close()).To(Succeed())
	g.Expect(mounted(t, idle)).To(BeFalse(), "the idle Dataset is unmounted")
	g.Expect(mounted(t, inUse)).To(BeTrue(), "the Dataset a pod uses is left to the next worker")
	g.Eventually(store.Len).Should(Equal(1))
	next := f.nextWorker(t)
	_, err = next.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: used})
	g.Expect(err).NotTo(HaveOccurred())
}

// TestADeletedDatasetIsNotKeptIdle: once the operator says a Dataset is deleted, an idle mount
// of it goes at once (with the under-store client and its credentials), and a mount that a pod
// still uses goes when that pod does, instead of waiting KeepIdle for a pod that cannot come.
func TestADeletedDatasetIsNotKeptIdle(t *testing.T) {
	forget := func(t *testing.T, f *fixture) *workerpb.SyncDatasetResponse {
		t.Helper()
		resp, err := f.m.SyncServer().SyncDataset(context.Background(), &workerpb.SyncDatasetRequest{Uid: uid, Forget: true})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	t.Run("idle when deleted", func(t *testing.T) {
		g := NewWithT(t)
		f := newFixture(t, func(c *Config) { c.KeepIdle = time.Hour })
		path := f.mount(t, f.request(uid))
		_, err := f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(mounted(t, path)).To(BeTrue(), "kept for the next pod")

		g.Expect(forget(t, f).GetMounted()).To(BeFalse())
		g.Expect(mounted(t, path)).To(BeFalse(), "unmounted as soon as the Dataset is deleted")
		g.Expect(f.m.Mounted(uid)).To(BeFalse())
	})
	t.Run("in use when deleted", func(t *testing.T) {
		g := NewWithT(t)
		f := newFixture(t, func(c *Config) { c.KeepIdle = time.Hour })
		path := f.mount(t, f.request(uid))
		g.Expect(forget(t, f).GetMounted()).To(BeTrue(), "a pod still reads it")
		g.Expect(mounted(t, path)).To(BeTrue())

		_, err := f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(mounted(t, path)).To(BeFalse(), "unmounted with its last pod, not kept idle")
		g.Expect(f.m.Mounted(uid)).To(BeFalse())
	})
	t.Run("in use when deleted, its last pod gone after a worker restart", func(t *testing.T) {
		g := NewWithT(t)
		store, handovers := startHandovers(t)
		f := newFixture(t, func(c *Config) { c.KeepIdle = time.Hour; c.Handovers = handovers })
		path := f.mount(t, f.request(uid))
		g.Expect(forget(t, f).GetMounted()).To(BeTrue(), "a pod still reads it")
		g.Expect(f.m.Close()).To(Succeed())
		g.Expect(store.Len()).To(Equal(1), "left to the next worker")

		next := f.nextWorker(t)
		_, err := next.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(mounted(t, path)).To(BeFalse(), "the next worker knew it deleted: unmounted with its last pod, not kept idle")
		g.Expect(next.Mounted(uid)).To(BeFalse())
		g.Eventually(store.Len).Should(BeZero())
	})
}

// Only a worker marks a request it hands over as of a deleted Dataset: a caller that says so is
// refused, rather than the mark being taken or dropped unsaid.
func TestAMountOfADatasetMarkedDeletedIsRefused(t *testing.T) {
	f := newFixture(t, nil)
	req := f.request(uid)
	req.DatasetDeleted = true
	_, err := f.client.MountDataset(context.Background(), req)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("MountDataset of a request marked deleted: %v, want InvalidArgument", err)
	}
}
