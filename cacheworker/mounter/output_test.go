package mounter

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestOutputMountsAreWritable mounts an output Dataset: it is writable, what is closed is at
// the master, a second publish on the node (a reader) gets the same mount, and after an
// unmount the next mount shows what was written.
func TestOutputMountsAreWritable(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	_, err := master.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: "pool/node-a", Node: "node-a"})
	g.Expect(err).NotTo(HaveOccurred())
	peers := dataplane.NewPeers()
	t.Cleanup(func() { _ = peers.Close() })
	dir := locations.NewDirectory(master, peers, "pool/node-a", logr.Discard())
	staging := t.TempDir()
	f := newFixture(t, func(c *Config) {
		c.Outputs = &Outputs{Master: master, Locations: dir, StagingDir: staging}
	})
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
