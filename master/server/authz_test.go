package server_test

import (
	"context"
	"net"
	"testing"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
	"github.com/strata-cache/strata/master/server"
)

func TestPolicyNamesEveryMethodOfTheMaster(t *testing.T) {
	if err := server.Policy.Check(masterpb.Master_ServiceDesc); err != nil {
		t.Fatal(err)
	}
}

// securedMaster serves a one-replica master over mutual TLS with the policy, as cmd/master
// does, and returns a function that dials it as a component.
func securedMaster(t *testing.T, reg prometheus.Registerer) func(id pki.Identity) masterpb.MasterClient {
	t.Helper()
	ca := pkitest.New(t)
	c := mastertest.New(t, 1, mastertest.Options{})
	a, err := authz.New("master", server.Policy, reg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append([]grpc.ServerOption{ca.Credentials(t, pki.Master("m-0")).ServerOption()}, a.ServerOptions()...)...)
	masterpb.RegisterMasterServer(gs, server.New(c.Nodes[0].Store, logr.Discard()))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return func(id pki.Identity) masterpb.MasterClient {
		conn, err := grpc.NewClient(lis.Addr().String(), ca.Credentials(t, id).DialOption(pki.RoleMaster))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return masterpb.NewMasterClient(conn)
	}
}

func TestTheMasterAuthorizesEachCallForTheCallersIdentity(t *testing.T) {
	reg := prometheus.NewRegistry()
	dial := securedMaster(t, reg)
	ctx := context.Background()
	worker, sibling, otherPool := dial(pki.Worker("p", "n")), dial(pki.Worker("p", "n2")), dial(pki.Worker("q", "n"))
	operator, master, csi := dial(pki.Operator()), dial(pki.Master("m-1")), dial(pki.CSINode("n"))

	register := func(id string) *masterpb.RegisterWorkerRequest {
		return &masterpb.RegisterWorkerRequest{Id: id, Address: "127.0.0.1:7100", Node: "n"}
	}
	cases := map[string]struct {
		call   func() error
		denied bool
	}{
		"a worker registers as itself": {call: func() error { _, err := worker.RegisterWorker(ctx, register("p/n")); return err }},
		"a worker may not register as another worker of its pool": {denied: true,
			call: func() error { _, err := sibling.RegisterWorker(ctx, register("p/n")); return err }},
		"a worker of another pool may not heartbeat for it": {denied: true, call: func() error {
			_, err := otherPool.Heartbeat(ctx, &masterpb.HeartbeatRequest{Worker: "p/n"})
			return err
		}},
		"a worker may not commit a block as another worker": {denied: true, call: func() error {
			_, err := sibling.CommitBlock(ctx, &masterpb.CommitBlockRequest{BlockId: 1, Path: "/x", Worker: "p/n"})
			return err
		}},
		"a worker may not delete a Dataset": {denied: true, call: func() error {
			_, err := worker.DeleteDataset(ctx, &masterpb.DeleteDatasetRequest{Name: "ns/d"})
			return err
		}},
		"a worker may not declare a worker lost": {denied: true, call: func() error {
			_, err := worker.MarkWorkerLost(ctx, &masterpb.MarkWorkerLostRequest{Worker: "p/n2"})
			return err
		}},
		"a worker may not join the Raft group": {denied: true, call: func() error {
			_, err := worker.Join(ctx, &masterpb.JoinRequest{RaftId: "p/n", RaftAddr: "127.0.0.1:1", ApiAddr: "127.0.0.1:2"})
			return err
		}},
		"a master may not join as another master": {denied: true, call: func() error {
			_, err := master.Join(ctx, &masterpb.JoinRequest{RaftId: "m-2", RaftAddr: "127.0.0.1:1", ApiAddr: "127.0.0.1:2"})
			return err
		}},
		"the CSI node plugin may not list files": {denied: true, call: func() error {
			_, err := csi.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: "/", Recursive: true})
			return err
		}},
		"the operator declares a worker lost": {call: func() error {
			_, err := operator.MarkWorkerLost(ctx, &masterpb.MarkWorkerLostRequest{Worker: "p/n", Reason: "test"})
			return err
		}},
		"the operator lists files": {call: func() error {
			_, err := operator.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: "/"})
			return err
		}},
	}
	denied := 0
	for _, name := range []string{"a worker registers as itself"} { // first: the others need the worker
		NewWithT(t).Expect(cases[name].call()).To(Succeed())
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.call()
			if tc.denied {
				denied++
				g.Expect(status.Code(err)).To(Equal(codes.PermissionDenied), "error: %v", err)
				g.Expect(status.Convert(err).Message()).NotTo(BeEmpty())
				return
			}
			g.Expect(status.Code(err)).NotTo(Equal(codes.PermissionDenied), "error: %v", err)
			g.Expect(status.Code(err)).NotTo(Equal(codes.Unauthenticated), "error: %v", err)
		})
	}
	NewWithT(t).Expect(testutil.CollectAndCount(reg, "strata_master_rpc_denied_total")).To(BeNumerically(">", 0))
	total := 0.0
	mfs, err := reg.Gather()
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue()
		}
	}
	NewWithT(t).Expect(total).To(BeEquivalentTo(denied), "every refusal is counted")
}
