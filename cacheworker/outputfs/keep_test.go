package outputfs_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestAReaderKeepsWhatItReadOfASelectivelyReplicatedOutput: a node that reads a block of an
// output from another node keeps it as a replica, recorded at the master, when the output's
// policy replicates selectively, and keeps nothing otherwise.
func TestAReaderKeepsWhatItReadOfASelectivelyReplicatedOutput(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	writer := startWorker(t, master, "pool/node-a", 64<<20)
	reader := startWorker(t, master, "pool/node-b", 64<<20)
	written := mountOutput(t, master, writer)
	var keeps atomic.Bool
	read := mountOutputIn(t, master, reader, blockSize, filepath.Join(t.TempDir(), "staging"), testr.New(t), func(c *outputfs.Config) {
		c.KeepsReadCopies = func(ds string) bool { return ds == dataset && keeps.Load() }
	})
	holders := func(name string, index int64) []string {
		id := blockindex.OutputBlockID(tokenOf(ctx, t, master, name), index)
		resp, err := master.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{BlockIds: []uint64{locations.MasterBlockID(id)}})
		g.Expect(err).NotTo(HaveOccurred())
		var out []string
		for _, l := range resp.GetBlocks()[0].GetLocations() {
			out = append(out, l.GetWorker())
		}
		slices.Sort(out)
		return out
	}
	plain, replicated := randomBytes(blockSize+10, 1), randomBytes(2*blockSize, 2)
	g.Expect(os.WriteFile(filepath.Join(written.Dir(), "plain.bin"), plain, 0o644)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(written.Dir(), "replicated.bin"), replicated, 0o644)).To(Succeed())

	g.Expect(os.ReadFile(filepath.Join(read.Dir(), "plain.bin"))).To(Equal(plain))
	g.Expect(holders("plain.bin", 0)).To(Equal([]string{writer.id}), "nothing kept for a policy that does not say so")

	keeps.Store(true)
	g.Expect(os.ReadFile(filepath.Join(read.Dir(), "replicated.bin"))).To(Equal(replicated))
	for index := range int64(2) {
		g.Eventually(func() []string { return holders("replicated.bin", index) }).Should(Equal([]string{writer.id, reader.id}),
			"block %d is kept by the node that read it", index)
		_, _, err := reader.store.OpenBlock(ctx, blockindex.OutputBlockID(tokenOf(ctx, t, master, "replicated.bin"), index))
		g.Expect(err).NotTo(HaveOccurred())
	}
}
