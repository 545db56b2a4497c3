package liveness_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/liveness"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

func register(id string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_RegisterWorker{RegisterWorker: &masterpb.RegisterWorkerRequest{Id: id, Node: "node-" + id}}}
}

func heartbeat(id string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_Heartbeat{Heartbeat: &masterpb.HeartbeatRequest{Worker: id}}}
}

func commit(block uint64, path string, offset int64, worker string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_CommitBlock{CommitBlock: &masterpb.CommitBlockRequest{
		BlockId: block, Path: path, Offset: offset, Size: 10, Worker: worker, Tier: "MEM",
	}}}
}

// workerState reads a worker's state on the current leader.
func workerState(ctx context.Context, c *mastertest.Cluster, id string) (*masterpb.Worker, error) {
	leader, err := c.Leader(ctx)
	if err != nil {
		return nil, err
	}
	var w *masterpb.Worker
	err = leader.Store.Read(ctx, false, func(m *fsm.FSM) (err error) {
		w, err = m.GetWorker(id)
		return err
	})
	return w, err
}

// waitLost waits until the cluster records the worker as lost.
func waitLost(ctx context.Context, t *testing.T, c *mastertest.Cluster, id string) *masterpb.Worker {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		w, err := workerState(ctx, c, id)
		if err == nil && w.State == masterpb.WorkerState_WORKER_STATE_LOST && !w.LossPending {
			return w
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for worker %s to be declared lost (last: %v, %v): %v", id, w, err, ctx.Err())
		case <-tick.C:
		}
	}
}

func TestSilentWorkersAreDeclaredLostAcrossFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := mastertest.New(t, 3, mastertest.Options{})

	// Every replica runs a detector, as every master process does; only the leader's acts.
	const timeout = 600 * time.Millisecond
	runCtx, stopDetectors := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopDetectors(); wg.Wait() }()
	startDetector := func(n *mastertest.Node) {
		d := liveness.New(n.Store, liveness.Config{Timeout: timeout, Interval: 50 * time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = d.Run(runCtx)
		}()
	}
	for _, n := range c.Nodes {
		startDetector(n)
	}

	for _, op := range []*masterpb.Command{
		register("silent"), register("steady"),
		{Op: &masterpb.Command_CreateFile{CreateFile: &masterpb.CreateFileRequest{Path: "/f", ClientToken: "f"}}},
		commit(1, "/f", 0, "silent"), commit(1, "/f", 0, "steady"), // replicated
		commit(2, "/f", 10, "silent"), // the only copy
	} {
		if _, err := c.ApplyIdempotent(ctx, op); err != nil {
			t.Fatal(err)
		}
	}

	// "steady" heartbeats until told to stop; "silent" never does.
	stopBeats := make(chan struct{})
	beatsDone := make(chan struct{})
	go func() {
		defer close(beatsDone)
		tick := time.NewTicker(timeout / 6)
		defer tick.Stop()
		for {
			select {
			case <-stopBeats:
				return
			case <-tick.C:
				hctx, hcancel := context.WithTimeout(ctx, timeout)
				_, _ = c.Apply(hctx, heartbeat("steady"))
				hcancel()
			}
		}
	}()

	silent := waitLost(ctx, t, c, "silent")
	if silent.LostReason == "" {
		t.Error("the lost worker has no reason recorded")
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []*masterpb.Block
	if err := leader.Store.Read(ctx, false, func(m *fsm.FSM) (err error) {
		blocks, err = m.BlockLocations("/f", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		wantReplica := b.Id == 1
		if b.Loss == nil || b.Loss.ReplicaExists != wantReplica || b.Loss.CheckpointExists {
			t.Errorf("block %d: loss %v, want replica_exists=%v", b.Id, b.Loss, wantReplica)
		}
	}

	// A failover must not make the new leader declare the steady worker lost.
	c.Kill(leader)
	newLeader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Let the new leader run past one full timeout of its own.
	for time.Since(newLeader.Store.LeaderSince()) < 2*timeout {
		if err := newLeader.Store.WaitForApplied(ctx, newLeader.Store.AppliedIndex()+1); err != nil {
			t.Fatal(err)
		}
	}
	if w, err := workerState(ctx, c, "steady"); err != nil || w.State != masterpb.WorkerState_WORKER_STATE_ALIVE {
		t.Fatalf("steady worker after failover: %v, %v; want ALIVE", w, err)
	}
	close(stopBeats)
	<-beatsDone
	waitLost(ctx, t, c, "steady")
}
