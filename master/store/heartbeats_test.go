package store_test

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
	"github.com/strata-cache/strata/master/store"
)

// TestHeartbeatsCostNoRaftEntryWhileNothingChanges checks the leader's heartbeats: kept in its
// memory, not the log, unless the worker's tier usage moved; what ListWorkers answers still
// carries the newest.
func TestHeartbeatsCostNoRaftEntryWhileNothingChanges(t *testing.T) {
	g := NewWithT(t)
	ctx := deadline(t, 30*time.Second)
	c := mastertest.New(t, 3, mastertest.Options{})
	_, err := c.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_RegisterWorker{RegisterWorker: &masterpb.RegisterWorkerRequest{
		Id: "pool/node-a", Node: "node-a", Tiers: []*masterpb.TierUsage{{Tier: "mem", CapacityBytes: 1000, UsedBytes: 100}},
	}}})
	g.Expect(err).NotTo(HaveOccurred())
	leader, err := c.Leader(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	beat := func(used int64) *masterpb.HeartbeatResponse {
		t.Helper()
		resp, err := leader.Store.Heartbeat(ctx, &masterpb.HeartbeatRequest{
			Worker: "pool/node-a", Tiers: []*masterpb.TierUsage{{Tier: "mem", CapacityBytes: 1000, UsedBytes: used}},
		})
		g.Expect(err).NotTo(HaveOccurred())
		return resp
	}

	before := leader.Store.AppliedIndex()
	for range 100 {
		g.Expect(beat(105).GetCommand()).To(Equal(masterpb.WorkerCommand_WORKER_COMMAND_NONE))
	}
	g.Expect(leader.Store.AppliedIndex()).To(Equal(before), "100 heartbeats, tier usage moved under 1%% of capacity: no entry")
	heard := leader.Store.LastHeartbeat("pool/node-a")
	g.Expect(heard).To(BeTemporally("~", time.Now(), 5*time.Second))

	workers, err := leader.Store.Workers(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	listed := leader.Store.WithHeartbeats(workers)
	g.Expect(listed).To(HaveLen(1))
	g.Expect(listed[0].GetLastHeartbeatUnixNano()).To(Equal(heard.UnixNano()), "ListWorkers answers the newest heartbeat")
	g.Expect(listed[0].GetTiers()[0].GetUsedBytes()).To(BeEquivalentTo(105))
	g.Expect(workers[0].GetTiers()[0].GetUsedBytes()).To(BeEquivalentTo(100), "the log's copy is left as it was")

	beat(200)
	g.Expect(leader.Store.AppliedIndex()).To(Equal(before+1), "usage moved by a tenth of the tier: one entry")
	g.Expect(c.WaitConverged(ctx)).To(Succeed())
	for _, n := range c.Nodes {
		var ws []*masterpb.Worker
		g.Expect(n.Store.Read(ctx, true, func(m *fsm.FSM) (err error) {
			ws, err = m.Workers()
			return err
		})).To(Succeed())
		g.Expect(ws[0].GetTiers()[0].GetUsedBytes()).To(BeEquivalentTo(200), "replicated to %s", n.ID)
	}

	resp, err := leader.Store.Heartbeat(ctx, &masterpb.HeartbeatRequest{Worker: "pool/unknown"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetCommand()).To(Equal(masterpb.WorkerCommand_WORKER_COMMAND_REGISTER), "a worker the master does not know registers")

	for _, f := range c.Followers(leader) {
		_, err := f.Store.Heartbeat(ctx, &masterpb.HeartbeatRequest{Worker: "pool/node-a"})
		var notLeader *store.NotLeaderError
		g.Expect(errors.As(err, &notLeader)).To(BeTrue(), "a follower sends heartbeats to the leader: %v", err)
	}
}

// A worker the master forgets leaves the leader's memory of heartbeats too.
func TestAForgottenWorkerLeavesTheHeartbeatMemory(t *testing.T) {
	g := NewWithT(t)
	ctx := deadline(t, 30*time.Second)
	c := mastertest.New(t, 1, mastertest.Options{})
	leader, err := c.Leader(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = leader.Store.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_RegisterWorker{RegisterWorker: &masterpb.RegisterWorkerRequest{
		Id: "pool/node-a", Node: "node-a",
	}}})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = leader.Store.Heartbeat(ctx, &masterpb.HeartbeatRequest{Worker: "pool/node-a"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(leader.Store.LastHeartbeat("pool/node-a")).NotTo(BeZero())

	_, err = leader.Store.MarkWorkerLost(ctx, "pool/node-a", "test")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(leader.Store.LastHeartbeat("pool/node-a")).NotTo(BeZero(), "a lost worker may come back: what was heard of it stays")
	resp, err := leader.Store.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_ForgetWorker{ForgetWorker: &masterpb.ForgetWorkerRequest{Worker: "pool/node-a"}}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.(*masterpb.ForgetWorkerResponse).GetForgotten()).To(BeTrue())
	g.Expect(leader.Store.LastHeartbeat("pool/node-a")).To(BeZero(), "forgotten")
}
