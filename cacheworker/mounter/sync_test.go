package mounter

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/miniotest"
)

func TestSyncDatasetUpdatesTheMountAndDropsReplacedBlocks(t *testing.T) {
	g := NewWithT(t)
	reg := prometheus.NewRegistry()
	f := newFixture(t, func(c *Config) { c.Registerer = reg })
	ctx := context.Background()
	const uid = "sync-uid"
	dir := f.mount(t, f.request(uid))
	for p, want := range f.files {
		got, err := os.ReadFile(filepath.Join(dir, p))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal(want), "%s before the sync", p)
	}
	old, err := f.srv.Client.StatObject(ctx, bucket, "sets/v1/dir/b.bin", minio.StatObjectOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	oldBlock := cache.BlockID(uid, "dir/b.bin", old.ETag, 0)
	_, err = f.cfg.Store.(*tierstore.Store).Info(oldBlock)
	g.Expect(err).NotTo(HaveOccurred(), "the first version's blocks are cached")

	newB := randomBytes(blockSize+5, 2)
	f.srv.Put(t, bucket, "sets/v1/dir/b.bin", newB)
	f.srv.Put(t, bucket, "sets/v1/c.txt", []byte("new"))
	g.Expect(f.srv.Client.RemoveObject(ctx, bucket, "sets/v1/a.txt", minio.RemoveObjectOptions{})).To(Succeed())

	sync := f.m.SyncServer()
	resp, err := sync.SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetMounted()).To(BeTrue())
	g.Expect([]int64{resp.GetAdded(), resp.GetRemoved(), resp.GetChanged()}).To(Equal([]int64{1, 1, 1}))
	g.Expect(resp.GetFiles()).To(Equal(int64(3)))
	g.Expect(resp.GetBlocksDropped()).To(Equal(int64(4+1)), "the old b.bin's 4 blocks and a.txt's one leave the tier")
	_, err = f.cfg.Store.(*tierstore.Store).Info(oldBlock)
	g.Expect(err).To(MatchError(tierstore.ErrNotFound))

	got, err := os.ReadFile(filepath.Join(dir, "dir/b.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(newB), "the mount reads the new version")
	got, err = os.ReadFile(filepath.Join(dir, "c.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(got)).To(Equal("new"))
	_, err = os.Stat(filepath.Join(dir, "a.txt"))
	g.Expect(os.IsNotExist(err)).To(BeTrue(), "a removed object vanishes")

	g.Expect(testutil.ToFloat64(f.m.syncs.syncs.WithLabelValues(syncChanged))).To(Equal(1.0))
	g.Expect(testutil.ToFloat64(f.m.syncs.changes.WithLabelValues("added"))).To(Equal(1.0))
	g.Expect(testutil.ToFloat64(f.m.syncs.dropped)).To(Equal(5.0))

	t.Run("a Dataset this worker does not mount has nothing to sync", func(t *testing.T) {
		g := NewWithT(t)
		resp, err := sync.SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: "not-here"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.GetMounted()).To(BeFalse())
		g.Expect(testutil.ToFloat64(f.m.syncs.syncs.WithLabelValues(syncNotMounted))).To(Equal(1.0))
	})

	t.Run("a source that cannot be listed keeps the tree and says why", func(t *testing.T) {
		g := NewWithT(t)
		for _, key := range []string{"sets/v1/c.txt", "sets/v1/dir/b.bin", "sets/v1/données/été 2024.csv"} {
			g.Expect(f.srv.Client.RemoveObject(ctx, bucket, key, minio.RemoveObjectOptions{})).To(Succeed())
		}
		g.Expect(f.srv.Client.RemoveBucket(ctx, bucket)).To(Succeed())
		_, err := sync.SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid})
		g.Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))
		g.Expect(err).To(MatchError(ContainSubstring("syncing Dataset team-a/images")))
		g.Expect(err).To(MatchError(ContainSubstring("spec.source.uri")))
		got, err := os.ReadFile(filepath.Join(dir, "dir/b.bin"))
		g.Expect(err).NotTo(HaveOccurred(), "the cached file is still served")
		g.Expect(got).To(Equal(newB))
		g.Expect(testutil.ToFloat64(f.m.syncs.syncs.WithLabelValues(syncFailed))).To(Equal(1.0))
	})

	t.Run("a bad UID is refused", func(t *testing.T) {
		_, err := sync.SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: "../x"})
		NewWithT(t).Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
	})
}

func TestAMountWhileTheSourceIsUnreachableServesTheLastGoodListing(t *testing.T) {
	g := NewWithT(t)
	kept, err := listings.Open(filepath.Join(t.TempDir(), "listings"))
	g.Expect(err).NotTo(HaveOccurred())
	f := newFixture(t, func(c *Config) { c.Listings = kept })
	ctx := context.Background()
	const uid = "outage-uid"

	dir := f.mount(t, f.request(uid))
	got, err := os.ReadFile(filepath.Join(dir, "dir/b.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(f.files["dir/b.bin"]))
	// The cache stores what a read fetched in the background: the outage must come after.
	info, err := f.srv.Client.StatObject(ctx, bucket, "sets/v1/dir/b.bin", minio.StatObjectOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	for i := range int64(4) {
		block := cache.BlockID(uid, "dir/b.bin", info.ETag, i)
		g.Eventually(func() int { return f.storedTimes(block) }).WithTimeout(10*time.Second).Should(BeNumerically(">=", 1),
			"block %d of dir/b.bin is stored", i)
	}
	_, err = f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())

	down := f.request(uid)
	down.Source.Endpoint = "http://" + miniotest.ClosedAddr(t)
	dir = f.mount(t, down)
	got, err = os.ReadFile(filepath.Join(dir, "dir/b.bin"))
	g.Expect(err).NotTo(HaveOccurred(), "a file cached before the outage reads")
	g.Expect(got).To(Equal(f.files["dir/b.bin"]))
	_, err = os.ReadFile(filepath.Join(dir, "a.txt"))
	g.Expect(err).To(MatchError(syscall.EIO), "a file never cached cannot be read while the source is down")

	t.Run("a sync does not take the kept listing for the source's", func(t *testing.T) {
		_, err := f.m.SyncServer().SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid})
		NewWithT(t).Expect(status.Code(err)).To(Equal(codes.Unavailable))
	})

	t.Run("without a kept listing, the mount says the source is unreachable", func(t *testing.T) {
		other := f.request("never-listed")
		other.Source.Endpoint = down.Source.Endpoint
		_, err := f.client.MountDataset(ctx, other)
		g := NewWithT(t)
		g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
		g.Expect(err).To(MatchError(ContainSubstring("no node keeps an earlier listing")))
	})
}

// poolOfOne plays the pool's other worker: its mount of a Dataset shows shown, and the listing
// it took for a sync is synced.
type poolOfOne struct {
	shown, synced listings.Listing
}

func (p poolOfOne) Listing(context.Context, string) (listings.Listing, string, error) {
	return listings.Listing{}, "", listings.ErrNotFound
}

func (p poolOfOne) Current(context.Context, string) (listings.Listing, string, error) {
	if p.shown.Taken.IsZero() {
		return listings.Listing{}, "", listings.ErrNotFound // node-b does not mount it yet
	}
	return p.shown, "pool/node-b", nil
}

func (p poolOfOne) ListingAt(_ context.Context, addr, _ string) (listings.Listing, error) {
	if addr != "node-b:7100" {
		return listings.Listing{}, listings.ErrNotFound
	}
	return p.synced, nil
}

func TestEveryNodeShowsOneTree(t *testing.T) {
	g := NewWithT(t)
	kept, err := listings.Open(filepath.Join(t.TempDir(), "listings"))
	g.Expect(err).NotTo(HaveOccurred())
	peers := &poolOfOne{}
	f := newFixture(t, func(c *Config) { c.Listings, c.ListingPeers = kept, peers })
	ctx := context.Background()

	// another node's mount, made before c.txt was added to the bucket")
	first := f.mount(t, f.request("taken-by-the-other-node"))
	g.Expect(os.ReadFile(filepath.Join(first, "a.txt"))).To(Equal(f.files["a.txt"]))
	shown, err := kept.Load("taken-by-the-other-node")
	g.Expect(err).NotTo(HaveOccurred())
	peers.shown = shown
	f.srv.Put(t, bucket, "sets/v1/c.txt", []byte("added since"))

	const uid = "one-tree"
	dir := f.mount(t, f.request(uid))
	_, err = os.Stat(filepath.Join(dir, "c.txt"))
	g.Expect(os.IsNotExist(err)).To(BeTrue(), "a new mount shows the tree the other node shows, not the bucket as it is now")
	g.Expect(os.ReadFile(filepath.Join(dir, "dir/b.bin"))).To(Equal(f.files["dir/b.bin"]))
	desc, err := f.m.SyncServer().DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect([]int64{desc.GetFiles(), desc.GetBytes()}).To(Equal([]int64{3, int64(len(f.files["a.txt"]) + len(f.files["dir/b.bin"]) + len(f.files["données/été 2024.csv"]))}))
	g.Expect(f.m.Mounted(uid)).To(BeTrue())
	g.Expect(f.m.Mounted("not-mounted")).To(BeFalse())
	desc, err = f.m.SyncServer().DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: "not-mounted"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(desc.GetMounted()).To(BeFalse())

	// A sync that takes the listing the other node took, which has c.txt and not a.txt.
	synced := listings.Listing{Taken: shown.Taken.Add(time.Minute)}
	for _, o := range shown.Objects {
		if o.Path != "a.txt" {
			synced.Objects = append(synced.Objects, o)
		}
	}
	for c := range f.srv.Client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: "sets/v1/c.txt"}) { // as a listing gives it
		g.Expect(c.Err).NotTo(HaveOccurred())
		synced.Objects = append(synced.Objects, understore.ObjectInfo{Path: "c.txt", Size: c.Size, ModTime: c.LastModified, ETag: strings.Trim(c.ETag, `"`)})
	}
	peers.synced = synced
	resp, err := f.m.SyncServer().SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid, ListingFrom: "node-b:7100"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect([]int64{resp.GetAdded(), resp.GetRemoved(), resp.GetChanged()}).To(Equal([]int64{1, 1, 0}),
		"a.txt is still in the bucket: the other node's listing, not this node's, was taken")
	g.Expect(os.ReadFile(filepath.Join(dir, "c.txt"))).To(Equal([]byte("added since")))
	again, err := kept.Load(uid)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Objects).To(HaveLen(len(synced.Objects)), "the listing taken is kept, for the next node to take")

	// A worker that took no listing for the sync: the source is listed after all.
	resp, err = f.m.SyncServer().SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid, ListingFrom: "node-c:7100"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect([]int64{resp.GetAdded(), resp.GetRemoved(), resp.GetChanged()}).To(Equal([]int64{1, 0, 0}), "a.txt is back")

	// The Dataset is deleted: its listing goes, while the mount pods still hold serves on.
	resp, err = f.m.SyncServer().SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid, Forget: true})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetMounted()).To(BeTrue())
	_, err = kept.Load(uid)
	g.Expect(err).To(MatchError(listings.ErrNotFound))
	g.Expect(os.ReadFile(filepath.Join(dir, "c.txt"))).To(Equal([]byte("added since")))
	resp, err = f.m.SyncServer().SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: "never-here", Forget: true})
	g.Expect(err).NotTo(HaveOccurred(), "forgetting what was never kept succeeds")
	g.Expect(resp.GetMounted()).To(BeFalse())
}

func TestASyncRemovesReplacedBlocksFromANodeThatNoLongerMountsTheDataset(t *testing.T) {
	g := NewWithT(t)
	peers := &poolOfOne{}
	f := newFixture(t, func(c *Config) { c.ListingPeers = peers })
	ctx := context.Background()
	const uid = "mounted-here-before"
	store := f.cfg.Store.(*tierstore.Store)
	blockOf := func(p string, index int64) string {
		info, err := f.srv.Client.StatObject(ctx, bucket, "sets/v1/"+p, minio.StatObjectOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return cache.BlockID(uid, p, info.ETag, index)
	}

	dir := f.mount(t, f.request(uid))
	for p, want := range f.files {
		g.Expect(os.ReadFile(filepath.Join(dir, p))).To(Equal(want))
	}
	oldB, a := blockOf("dir/b.bin", 3), blockOf("a.txt", 0)
	g.Eventually(func() error {
		for _, id := range []string{oldB, a} {
			if _, err := store.Info(id); err != nil {
				return err
			}
		}
		return nil
	}).WithTimeout(10*time.Second).Should(Succeed(), "the blocks read are stored in the background")
	_, err := f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())

	// dir/b.bin is replaced in the bucket, and another node's mount syncs to it.
	f.srv.Put(t, bucket, "sets/v1/dir/b.bin", randomBytes(blockSize, 9))
	peers.synced = listings.Listing{Taken: time.Now()}
	for o := range f.srv.Client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: "sets/v1/", Recursive: true}) {
		g.Expect(o.Err).NotTo(HaveOccurred())
		peers.synced.Objects = append(peers.synced.Objects, understore.ObjectInfo{
			Path: strings.TrimPrefix(o.Key, "sets/v1/"), Size: o.Size, ModTime: o.LastModified, ETag: strings.Trim(o.ETag, `"`),
		})
	}

	sync := f.m.SyncServer()
	resp, err := sync.SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid, ListingFrom: "node-c:7100"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetBlocksDropped()).To(BeZero(), "without the synced listing, nothing is taken for replaced")

	resp, err = sync.SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid, ListingFrom: "node-b:7100"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetMounted()).To(BeFalse())
	g.Expect(resp.GetBlocksDropped()).To(BeEquivalentTo(4), "the four blocks of the old dir/b.bin")
	_, err = store.Info(oldB)
	g.Expect(err).To(MatchError(tierstore.ErrNotFound))
	_, err = store.Info(a)
	g.Expect(err).NotTo(HaveOccurred(), "a block of an unchanged object stays for the next mount here")
}
