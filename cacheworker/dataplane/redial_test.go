package dataplane

import (
	"context"
	"net"
	"testing"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// TestAWorkerRestartedAtItsAddressIsReachedAtOnce: once calls to a gone worker have failed,
// the first call after it is back at the same address (a restarted worker keeps its node's
// address) reaches it, instead of failing until gRPC's reconnection backoff runs out.
func TestAWorkerRestartedAtItsAddressIsReachedAtOnce(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	kept := keptListing(t, "uid", listings.Listing{Objects: []understore.ObjectInfo{{Path: "a"}}})
	serve := func(lis net.Listener) *grpc.Server {
		s := NewServer(nil, nil, testBlockSize, nil, logr.Discard())
		s.ServeListings(kept, func(string) bool { return true })
		srv := grpc.NewServer()
		workerpb.RegisterWorkerServer(srv, s)
		go func() { _ = srv.Serve(lis) }()
		return srv
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	addr := lis.Addr().String()
	srv := serve(lis)
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
	srv = serve(lis)
	defer srv.Stop()
	got, err := peers.GetListing(ctx, addr, "uid", true)
	g.Expect(err).NotTo(HaveOccurred(), "the first call reaches the worker back at %s", addr)
	g.Expect(got.Objects).To(HaveLen(1))
}
