package dataplane

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"

	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// listingWorker serves the listings of kept (none if nil) on a real gRPC server, and mounts
// the Datasets of mounted.
func listingWorker(t testing.TB, kept *listings.Store, mounted ...string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveListings(t, lis, kept, mounted...)
	return lis.Addr().String()
}

// serveListings serves a worker's listings on lis (a test that restarts a worker at its
// address needs the listener it gives); kept nil serves none.
func serveListings(t testing.TB, lis net.Listener, kept *listings.Store, mounted ...string) *grpc.Server {
	t.Helper()
	s := NewServer(nil, nil, testBlockSize, nil, logr.Discard())
	if kept != nil {
		s.ServeListings(kept, func(uid string) bool { return slices.Contains(mounted, uid) })
	}
	srv := grpc.NewServer()
	workerpb.RegisterWorkerServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return srv
}

func keptListing(t *testing.T, uid string, l listings.Listing) *listings.Store {
	t.Helper()
	s, err := listings.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(uid, l); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAPeerHandsOverTheListingItKeeps(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	var objects []understore.ObjectInfo
	for i := range 2*listingChunk + 17 { // several messages
		objects = append(objects, understore.ObjectInfo{Path: fmt.Sprintf("dir/part-%05d", i), Size: int64(i), ModTime: t0.Add(time.Duration(i)), ETag: fmt.Sprint("e", i)})
	}
	older := listingWorker(t, keptListing(t, "uid", listings.Listing{Taken: t0.Add(-time.Hour), Objects: objects[:1]}))
	newer := listingWorker(t, keptListing(t, "uid", listings.Listing{Taken: t0, Objects: objects}))
	empty := listingWorker(t, keptListing(t, "uid", listings.Listing{Taken: t0.Add(-time.Minute)}))
	none := listingWorker(t, nil)
	peers := newPeers(t)

	got, err := peers.GetListing(context.Background(), newer, "uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Taken.Equal(t0)).To(BeTrue())
	g.Expect(got.Objects).To(HaveLen(len(objects)))
	for i, o := range got.Objects {
		g.Expect(o.Path).To(Equal(objects[i].Path))
		g.Expect(o.ETag).To(Equal(objects[i].ETag))
		g.Expect(o.Size).To(Equal(objects[i].Size))
		g.Expect(o.ModTime.Equal(objects[i].ModTime)).To(BeTrue())
	}
	got, err = peers.GetListing(context.Background(), empty, "uid", false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Objects).To(BeEmpty(), "an empty source's listing is a listing")
	_, err = peers.GetListing(context.Background(), none, "uid", false)
	g.Expect(err).To(MatchError(listings.ErrNotFound))
	_, err = peers.GetListing(context.Background(), newer, "other-uid", false)
	g.Expect(err).To(MatchError(listings.ErrNotFound))

	pool := PoolListings{Peers: peers, Workers: func(context.Context) (map[string]string, error) {
		return map[string]string{"p/a": older, "p/b": newer, "p/c": none, "p/d": empty}, nil
	}}
	l, from, err := pool.Listing(context.Background(), "uid")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(from).To(Equal("p/b"), "the newest listing of the pool")
	g.Expect(l.Objects).To(HaveLen(len(objects)))
	_, _, err = pool.Listing(context.Background(), "other-uid")
	g.Expect(err).To(MatchError(listings.ErrNotFound))
	g.Expect(err).To(MatchError(ContainSubstring("none of the pool's 4 other live worker(s)")))
}

func TestANewMountFindsTheTreeAnotherWorkersMountShows(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	objects := []understore.ObjectInfo{{Path: "a.txt", Size: 1, ModTime: t0, ETag: "e1"}}
	// Newer, but only kept: its node unmounted the Dataset since.
	unmounted := listingWorker(t, keptListing(t, "uid", listings.Listing{Taken: t0.Add(time.Hour)}))
	mounting := listingWorker(t, keptListing(t, "uid", listings.Listing{Taken: t0, Objects: objects}), "uid")
	peers := newPeers(t)

	_, err := peers.GetListing(context.Background(), unmounted, "uid", true)
	g.Expect(err).To(MatchError(listings.ErrNotFound), "a listing of a Dataset not mounted is no mount's tree")
	got, err := peers.GetListing(context.Background(), mounting, "uid", true)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Objects).To(HaveLen(1))

	pool := PoolListings{Peers: peers, Workers: func(context.Context) (map[string]string, error) {
		return map[string]string{"p/a": unmounted, "p/b": mounting}, nil
	}}
	l, from, err := pool.Current(context.Background(), "uid")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(from).To(Equal("p/b"), "the worker that mounts it, though another keeps a newer listing")
	g.Expect(l.Taken.Equal(t0)).To(BeTrue())
	_, _, err = pool.Current(context.Background(), "other-uid")
	g.Expect(err).To(MatchError(listings.ErrNotFound))
	g.Expect(err).To(MatchError(ContainSubstring("none of the pool's 2 other live worker(s) mounts Dataset other-uid")))

	at, err := pool.ListingAt(context.Background(), unmounted, "uid")
	g.Expect(err).NotTo(HaveOccurred(), "a sync takes the listing another worker took, mounted or not")
	g.Expect(at.Taken.Equal(t0.Add(time.Hour))).To(BeTrue())
}
