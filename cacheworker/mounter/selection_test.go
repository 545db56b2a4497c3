package mounter

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// A DataLoad's progress on a node: what a selection of a mounted Dataset's files is, and how
// much of it the node's tiers hold, counted block by block.
func TestDescribeDatasetCountsWhatTheNodeHoldsOfASelection(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, nil)
	ctx := context.Background()
	path := f.mount(t, f.request(uid))
	big := f.files["dir/b.bin"] // three blocks and 17 bytes
	describe := func(paths ...string) *workerpb.SelectionHeld {
		t.Helper()
		resp, err := f.m.SyncServer().DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: uid, Selection: &workerpb.Selection{Paths: paths}})
		g.Expect(err).NotTo(HaveOccurred())
		return resp.GetSelected()
	}

	resp, err := f.m.SyncServer().DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetSelected()).To(BeNil(), "no selection asked, none counted")

	sel := describe("dir/**")
	g.Expect(sel.GetFiles()).To(Equal(int64(1)))
	g.Expect(sel.GetBytes()).To(Equal(int64(len(big))))
	g.Expect(sel.GetHeldFiles()).To(BeZero())
	g.Expect(sel.GetHeldBytes()).To(BeZero())

	got, err := os.ReadFile(filepath.Join(path, "dir", "b.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(big))
	// The cache stores a block it fetched in the background, once the reader has it.
	g.Eventually(func() *workerpb.SelectionHeld { return describe("dir/**") }).Should(And(
		HaveField("HeldBytes", int64(len(big))), HaveField("HeldFiles", int64(1))))

	// Half of each file: blocks 0 and 2 of its four (kariz.Share), held.
	resp, err = f.m.SyncServer().DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: uid,
		Selection: &workerpb.Selection{Paths: []string{"dir/**"}, Percent: 50}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetSelected()).To(And(HaveField("Files", int64(1)), HaveField("Bytes", int64(2*blockSize)),
		HaveField("HeldFiles", int64(1)), HaveField("HeldBytes", int64(2*blockSize))))

	// A block evicted: the file is no longer held, its other blocks still are.
	input, ok := f.m.input(uid)
	g.Expect(ok).To(BeTrue())
	var etag string
	for _, v := range input.FileVersions() {
		if v.Path == "dir/b.bin" {
			etag = v.ETag
		}
	}
	g.Expect(f.cfg.Store.Delete(ctx, cache.BlockID(uid, "dir/b.bin", etag, 1))).To(Succeed())
	sel = describe("dir/**")
	g.Expect(sel.GetHeldBytes()).To(Equal(int64(len(big) - blockSize)))
	g.Expect(sel.GetHeldFiles()).To(BeZero(), "a file is held once every block is")
	resp, err = f.m.SyncServer().DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: uid,
		Selection: &workerpb.Selection{Paths: []string{"dir/**"}, Percent: 50}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetSelected()).To(HaveField("HeldFiles", int64(1)), "block 1 is not of the half")
	// Read again past the page cache, as a load does: the block is fetched and held again.
	again, err := os.Open(filepath.Join(path, "dir", "b.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = again.Close() }()
	g.Expect(unix.Fadvise(int(again.Fd()), 0, 0, unix.FADV_DONTNEED)).To(Succeed())
	g.Expect(io.ReadAll(again)).To(Equal(big))
	g.Eventually(func() *workerpb.SelectionHeld { return describe("dir/**") }).Should(HaveField("HeldFiles", int64(1)))

	// No pattern: the whole tree, of which a.txt and the CSV are not read yet.
	all := describe()
	g.Expect(all.GetFiles()).To(Equal(int64(len(f.files))))
	g.Expect(all.GetHeldFiles()).To(Equal(int64(1)))
	g.Expect(all.GetHeldBytes()).To(Equal(int64(len(big))))
	g.Expect(describe("*.txt", "données/*").GetFiles()).To(Equal(int64(2)), "patterns select together")

	_, err = f.m.SyncServer().DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: uid, Selection: &workerpb.Selection{Paths: []string{"a/../b"}}})
	g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
	g.Expect(err).To(MatchError(ContainSubstring(".. segment")))
}
