package fsm

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/master/masterpb"
)

func TestDatasetUsageCountsTheBytesThatHaveALiveCopy(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t)
	for _, cmd := range []*masterpb.Command{
		dataset("ns/d/uid", "/datasets/ns/d/uid"),
		dataset("ns/other/uid", "/datasets/ns/other/uid"),
		worker("a"), worker("b"),
		createReq(&masterpb.CreateFileRequest{Path: "/datasets/ns/d/uid/x", Dataset: "ns/d/uid"}),
		createReq(&masterpb.CreateFileRequest{Path: "/datasets/ns/d/uid/dir/y", Dataset: "ns/d/uid"}),
		createReq(&masterpb.CreateFileRequest{Path: "/datasets/ns/other/uid/z", Dataset: "ns/other/uid"}),
		commit(1, "/datasets/ns/d/uid/x", 0, "a", "mem"),
		commit(1, "/datasets/ns/d/uid/x", 0, "b", "nvme"), // a second copy of the same block
		commit(2, "/datasets/ns/d/uid/x", 100, "b", "mem"),
		commit(3, "/datasets/ns/d/uid/dir/y", 0, "a", "mem"),
		commit(4, "/datasets/ns/other/uid/z", 0, "a", "mem"), // another dataset's,
		commit(4, "/datasets/ns/other/uid/z", 0, "b", "mem"), // replicated
	} {
		h.must(cmd)
	}
	usage, err := h.fsm.DatasetUsage("ns/d/uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.Files).To(BeEquivalentTo(2))
	g.Expect(usage.TotalBytes).To(BeEquivalentTo(300))
	g.Expect(usage.UncachedFiles).To(BeZero())
	g.Expect(usage.CachedBytes).To(BeEquivalentTo(300), "three blocks of 100 bytes, the copied one counted once")
	g.Expect(usage.Tiers).To(HaveExactElements(
		And(HaveField("Tier", "mem"), HaveField("UsedBytes", BeEquivalentTo(300))),
		And(HaveField("Tier", "nvme"), HaveField("UsedBytes", BeEquivalentTo(100))),
	))
	g.Expect(usage.Nodes).To(HaveExactElements(
		And(HaveField("Node", "node-a"), HaveField("CachedBytes", BeEquivalentTo(200))),
		And(HaveField("Node", "node-b"), HaveField("CachedBytes", BeEquivalentTo(200))),
	), "each node counts the blocks it holds, most first, then by name")
	g.Expect(usage.MinCopies).To(BeEquivalentTo(1), "blocks 2 and 3 have one copy each; block 1 two")
	other, err := h.fsm.DatasetUsage("ns/other/uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(other.MinCopies).To(BeEquivalentTo(2), "its one block is on two nodes")

	// Worker a is lost: block 1 still has b's copy; block 3 has none left.
	h.must(lost("a", 100))
	usage, err = h.fsm.DatasetUsage("ns/d/uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.CachedBytes).To(BeEquivalentTo(200))
	g.Expect(usage.UncachedFiles).To(BeEquivalentTo(1), "dir/y lost its only block")
	g.Expect(usage.LostFiles).To(BeEquivalentTo(1), "dir/y has no checkpoint either")
	g.Expect(usage.MinCopies).To(BeZero(), "block 3 has no live copy")
	g.Expect(usage.LostPaths).To(BeEmpty(), "listed only when asked for")
	usage, err = h.fsm.DatasetUsage("ns/d/uid", true)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.LostPaths).To(Equal([]string{"/datasets/ns/d/uid/dir/y"}))
	g.Expect(usage.TotalBytes).To(BeEquivalentTo(300), "a lost block still counts in its file's size")
	g.Expect(usage.Nodes).To(HaveExactElements(And(HaveField("Node", "node-b"), HaveField("CachedBytes", BeEquivalentTo(200)))),
		"a lost worker's node holds nothing")
	g.Expect(usage.Tiers).To(HaveExactElements(
		And(HaveField("Tier", "mem"), HaveField("UsedBytes", BeEquivalentTo(100))),
		And(HaveField("Tier", "nvme"), HaveField("UsedBytes", BeEquivalentTo(100))),
	))

	h.must(&masterpb.Command{Op: &masterpb.Command_CheckpointFile{CheckpointFile: &masterpb.CheckpointFileRequest{
		Path: "/datasets/ns/d/uid/x", State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: "s3://b/x",
	}}})
	usage, err = h.fsm.DatasetUsage("ns/d/uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.CheckpointedBytes).To(BeEquivalentTo(200), "x, of two blocks, is checkpointed")
	g.Expect(usage.Complete).To(BeFalse())

	h.must(checkpoint("/datasets/ns/d/uid/dir/y"))
	usage, err = h.fsm.DatasetUsage("ns/d/uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.UncachedFiles).To(BeEquivalentTo(1), "dir/y has no live copy still")
	g.Expect(usage.LostFiles).To(BeZero(), "but its checkpoint brings it back: it is not lost")
	g.Expect(usage.CheckpointedBytes).To(BeEquivalentTo(300))

	h.must(complete("ns/d/uid"))
	usage, err = h.fsm.DatasetUsage("ns/d/uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.Complete).To(BeTrue(), "the usage carries the complete flag, for the Lineage reconciler's one read per output")

	_, err = h.fsm.DatasetUsage("ns/nothing/uid", false)
	g.Expect(errors.Is(err, ErrNotFound)).To(BeTrue(), "an unknown dataset: %v", err)
}

func TestRemovingACopyForgetsItOnly(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t)
	remove := func(id uint64, w string) *masterpb.Command {
		return &masterpb.Command{Op: &masterpb.Command_RemoveBlockCopy{RemoveBlockCopy: &masterpb.RemoveBlockCopyRequest{BlockId: id, Worker: w}}}
	}
	for _, cmd := range []*masterpb.Command{
		dataset("ns/d/uid", "/datasets/ns/d/uid"), worker("a"), worker("b"),
		createReq(&masterpb.CreateFileRequest{Path: "/datasets/ns/d/uid/x", Dataset: "ns/d/uid"}),
		commit(1, "/datasets/ns/d/uid/x", 0, "a", "mem"),
		commit(1, "/datasets/ns/d/uid/x", 0, "b", "nvme"),
	} {
		h.must(cmd)
	}

	b := h.must(remove(1, "a")).(*masterpb.Block)
	g.Expect(b.Locations).To(HaveExactElements(HaveField("Worker", "b")), "a's copy is forgotten, b's stays")
	b = h.must(remove(1, "a")).(*masterpb.Block)
	g.Expect(b.Locations).To(HaveLen(1), "forgetting it again changes nothing")
	usage, err := h.fsm.DatasetUsage("ns/d/uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.Tiers).To(HaveExactElements(HaveField("Tier", "nvme")))

	// Worker a's index no longer lists the block: declaring a lost marks nothing of it.
	resp := h.must(lost("a", 100)).(*masterpb.MarkWorkerLostStepResult)
	g.Expect(resp.GetCounts().GetBlocksLost()).To(BeZero())

	h.must(remove(1, "b"))
	usage, err = h.fsm.DatasetUsage("ns/d/uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.CachedBytes).To(BeZero(), "a block no worker holds is not cached")

	_, err = h.apply(0, remove(99, "a"))
	g.Expect(errors.Is(err, ErrNotFound)).To(BeTrue(), "an unknown block: %v", err)
}
