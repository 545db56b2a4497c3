package dataplane

import (
	"context"
	"net"
	"testing"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/connectivity"

	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/understore"
)

// TestAWorkerRestartedAtItsAddressIsReachedAtOnce: once calls to a gone worker have failed,
// the first call after it is back at the same address (a restarted worker keeps its node's
// address) reaches it, instead of failing until gRPC's reconnection backoff runs out.
func TestAWorkerRestartedAtItsAddressIsReachedAtOnce(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	kept := keptListing(t, "uid", listings.Listing{Objects: []understore.ObjectInfo{{Path: "a"}}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	addr := lis.Addr().String()
	srv := serveListings(t, lis, kept, "uid")
	peers := newPeers(t)
	_, err = peers.GetListing(ctx, addr, "uid", true)
	g.Expect(err).NotTo(HaveOccurred())

	srv.Stop()
	state := func() connectivity.State {
		peers.mu.Lock()
		defer peers.mu.Unlock()
		return peers.conns[addr].GetState()
	}
	g.Eventually(func() connectivity.State {
		_, err := peers.GetListing(ctx, addr, "uid", true)
		g.Expect(err).To(HaveOccurred(), "the worker is gone")
		return state()
	}).Should(Equal(connectivity.TransientFailure), "the connection's dials fail")

	lis, err = net.Listen("tcp", addr)
	g.Expect(err).NotTo(HaveOccurred())
	serveListings(t, lis, kept, "uid")
	got, err := peers.GetListing(ctx, addr, "uid", true)
	g.Expect(err).NotTo(HaveOccurred(), "the first call reaches the worker back at %s", addr)
	g.Expect(got.Objects).To(HaveLen(1))
}
