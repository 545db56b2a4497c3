package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

func deadline(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestWritesContinueWhenTheLeaderDies(t *testing.T) {
	ctx := deadline(t, time.Minute)
	// Raft over loopback TCP here, as in production; the other tests use the in-memory transport.
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true, Transport: mastertest.TCP})
	cl := c.Client()

	var (
		mu    sync.Mutex
		acked []string
		fails []error
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := fmt.Sprintf("/w/f%d", i)
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := cl.CreateFile(wctx, &masterpb.CreateFileRequest{Path: p})
			cancel()
			mu.Lock()
			if err == nil {
				acked = append(acked, p)
			} else {
				fails = append(fails, err)
			}
			mu.Unlock()
		}
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitFor := func(n int) {
		t.Helper()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for count() < n {
			select {
			case <-ctx.Done():
				t.Fatalf("waiting for %d acknowledged writes (have %d): %v", n, count(), ctx.Err())
			case <-tick.C:
			}
		}
	}

	waitFor(20)
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(leader) // gRPC server and Raft both stop mid-stream
	before := count()
	waitFor(before + 20)
	close(stop)
	<-done

	if len(fails) > 0 {
		t.Errorf("%d writes failed instead of being retried; first: %v", len(fails), fails[0])
	}
	if cl.LeaderAddr() == leader.APIAddr {
		t.Errorf("client still points at the dead leader %s", leader.APIAddr)
	}
	for _, p := range acked {
		ok, err := cl.Exists(ctx, p)
		if err != nil || !ok {
			t.Errorf("acknowledged %s: exists=%v, %v", p, ok, err)
		}
	}
}

func TestClientStartsFromAFollower(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true})
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	follower := c.Followers(leader)[0]
	cl, err := client.New([]string{follower.APIAddr}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Close() }()
	if _, err := cl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/via-follower"}); err != nil {
		t.Fatal(err)
	}
	if cl.LeaderAddr() != leader.APIAddr {
		t.Errorf("client settled on %s, want the leader %s", cl.LeaderAddr(), leader.APIAddr)
	}
}

func TestCreateWithTheSameTokenIsIdempotent(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true})
	cl := c.Client()
	req := func() *masterpb.CreateFileRequest { return &masterpb.CreateFileRequest{Path: "/t", ClientToken: "tok"} }
	first, err := cl.CreateFile(ctx, req())
	if err != nil {
		t.Fatal(err)
	}
	again, err := cl.CreateFile(ctx, req())
	if err != nil || again.Id != first.Id {
		t.Fatalf("retried create: %v, %v; want the same file", again, err)
	}
	_, err = cl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/t"})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("create by another client: %v, want AlreadyExists", err)
	}
}

func TestErrorsThatRetryingCannotFixReturnAtOnce(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true})
	cl := c.Client()
	tests := map[string]struct {
		call func() error
		want codes.Code
	}{
		"a missing file": {
			call: func() error { _, err := cl.GetFile(ctx, &masterpb.GetFileRequest{Path: "/missing"}); return err },
			want: codes.NotFound,
		},
		"a relative path": {
			call: func() error { _, err := cl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "rel"}); return err },
			want: codes.InvalidArgument,
		},
		"a block for an unknown worker": {
			call: func() error {
				if _, err := cl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/b"}); err != nil {
					return err
				}
				_, err := cl.CommitBlock(ctx, &masterpb.CommitBlockRequest{BlockId: 1, Path: "/b", Size: 1, Worker: "ghost", Tier: "MEM"})
				return err
			},
			want: codes.FailedPrecondition,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			err := tc.call()
			if status.Code(err) != tc.want {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v: the client retried an error it cannot fix", d)
			}
		})
	}
}

func TestContextDeadlineStopsRetries(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true})
	cl := c.Client()
	for _, n := range c.Nodes {
		c.Kill(n)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err := cl.CreateFile(short, &masterpb.CreateFileRequest{Path: "/nobody"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("with every replica down: %v, want the context's deadline", err)
	}
}

func TestFollowerAnswersNotLeaderWithTheLeadersAddress(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true})
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	follower := c.Followers(leader)[0]
	cc, err := grpc.NewClient(follower.APIAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	raw := masterpb.NewMasterClient(cc)

	_, err = raw.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/direct"})
	reason, addr, ok := masterpb.RedirectInfo(err)
	if status.Code(err) != codes.FailedPrecondition || !ok || reason != masterpb.ReasonNotLeader || addr != leader.APIAddr {
		t.Errorf("write on a follower: %v (reason %q, leader %q), want FAILED_PRECONDITION NOT_LEADER %s", err, reason, addr, leader.APIAddr)
	}
	_, err = raw.Exists(ctx, &masterpb.ExistsRequest{Path: "/direct"})
	if reason, _, _ := masterpb.RedirectInfo(err); reason != masterpb.ReasonNotLeader {
		t.Errorf("linearizable read on a follower: %v, want NOT_LEADER", err)
	}
	// A stale read is served by the follower itself.
	if _, err := raw.Exists(ctx, &masterpb.ExistsRequest{Path: "/direct", StaleOk: true}); err != nil {
		t.Errorf("stale read on a follower: %v", err)
	}
	info, err := raw.Leader(ctx, &masterpb.LeaderRequest{})
	if err != nil || info.LeaderApiAddr != leader.APIAddr || !info.HasState || info.SelfId != follower.ID {
		t.Errorf("Leader on a follower: %v, %v", info, err)
	}
}

func TestWorkerLifecycleThroughTheAPI(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true})
	cl := c.Client()
	tiers := []*masterpb.TierUsage{{Tier: "MEM", CapacityBytes: 1 << 30, UsedBytes: 1 << 20}}
	for _, w := range []string{"w1", "w2"} {
		if _, err := cl.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: w, Node: "node-" + w, Tiers: tiers}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: "ns/ds", Root: "/ds"}); err != nil {
		t.Fatal(err)
	}
	for i, w := range []string{"w1", "w2"} {
		p := fmt.Sprintf("/ds/part-%d", i)
		if _, err := cl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: p, Dataset: "ns/ds"}); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.CommitBlock(ctx, &masterpb.CommitBlockRequest{BlockId: uint64(i + 1), Path: p, Size: 64, Worker: w, Tier: "MEM"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.CheckpointFile(ctx, &masterpb.CheckpointFileRequest{Path: "/ds/part-0", State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: "s3://b/part-0"}); err != nil {
		t.Fatal(err)
	}
	hb, err := cl.Heartbeat(ctx, &masterpb.HeartbeatRequest{Worker: "w1", Tiers: tiers})
	if err != nil || hb.Command != masterpb.WorkerCommand_WORKER_COMMAND_NONE {
		t.Fatalf("heartbeat: %v, %v", hb, err)
	}

	// The operator saw w1's Node go NotReady.
	lost, err := cl.MarkWorkerLost(ctx, "w1", "node NotReady")
	if err != nil {
		t.Fatal(err)
	}
	if lost.BlocksLost != 1 || lost.BlocksWithCheckpoint != 1 {
		t.Errorf("MarkWorkerLost: %v, want one block lost with a checkpoint", lost)
	}
	hb, err = cl.Heartbeat(ctx, &masterpb.HeartbeatRequest{Worker: "w1"})
	if err != nil || hb.Command != masterpb.WorkerCommand_WORKER_COMMAND_REGISTER {
		t.Errorf("heartbeat from a lost worker: %v, %v; want REGISTER", hb, err)
	}
	locs, err := cl.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{Path: "/ds/part-0"})
	if err != nil || len(locs.Blocks) != 1 || !locs.Blocks[0].Locations[0].Lost || locs.Blocks[0].Path != "/ds/part-0" {
		t.Errorf("locations after the loss: %v, %v", locs, err)
	}
	workers, err := cl.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
	if err != nil || len(workers.Workers) != 2 {
		t.Fatalf("ListWorkers: %v, %v", workers, err)
	}
	list, err := cl.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: "/ds"})
	if err != nil || len(list.Entries) != 2 {
		t.Errorf("ListFiles: %v, %v", list, err)
	}
	del, err := cl.DeleteDataset(ctx, "ns/ds")
	if err != nil || del.FilesDeleted != 2 {
		t.Errorf("DeleteDataset: %v, %v", del, err)
	}
	if _, err := cl.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: "ns/ds"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetDataset after delete: %v, want NotFound", err)
	}
}

func TestAClientLeavesALeaderThatStopsAnsweringForTheNext(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true})
	// An attempt at a replica that stops answering would wait this long without the probes.
	cl, err := client.New(c.APIAddrs(), client.Options{AttemptTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	if _, err := cl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/s/before"}); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cl.LeaderAddr() != leader.APIAddr {
		t.Fatalf("the client talks to %s, not to the leader %s", cl.LeaderAddr(), leader.APIAddr)
	}

	// Its connections stay open: nothing tells the client it is gone.
	c.Stop(leader)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cl.CreateFile(wctx, &masterpb.CreateFileRequest{Path: "/s/after"}); err != nil {
		t.Fatalf("creating a file once the leader stopped answering: %v", err)
	}
	if cl.LeaderAddr() == leader.APIAddr {
		t.Errorf("the client still talks to the stopped leader %s", leader.APIAddr)
	}
	for _, p := range []string{"/s/before", "/s/after"} {
		if ok, err := cl.Exists(ctx, p); err != nil || !ok {
			t.Errorf("%s: exists=%v, %v", p, ok, err)
		}
	}
}
