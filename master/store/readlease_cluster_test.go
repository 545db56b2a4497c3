package store_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/mastertest"
	"github.com/strata-cache/strata/master/store"
)

// testClock is a clock that moves only when the test moves it.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Add(d time.Duration) { c.ns.Add(int64(d)) }
func newTestClock() *testClock           { c := &testClock{}; c.ns.Store(time.Now().UnixNano()); return c }

// TestReadsWithinTheLeaseAskNoQuorum reads on the leader with the replicas' clock held still:
// the first read asks a quorum, the next ones are served on its lease until the clock passes
// it, and a leadership transfer ends it.
func TestReadsWithinTheLeaseAskNoQuorum(t *testing.T) {
	ctx := deadline(t, time.Minute)
	clock := newTestClock()
	var lease time.Duration
	c := mastertest.New(t, 3, mastertest.Options{Tune: func(cfg *store.Config) {
		cfg.Now = clock.Now
		lease = cfg.HeartbeatTimeout / 3
	}})
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reads := func(n *mastertest.Node, want0, want1 uint64) {
		t.Helper()
		byRound, byLease := n.Store.LinearizableReads()
		if byRound != want0 || byLease != want1 {
			t.Fatalf("%s: reads by a round %d, on the lease %d; want %d and %d", n.ID, byRound, byLease, want0, want1)
		}
	}
	read := func(n *mastertest.Node) error {
		return n.Store.Read(ctx, false, func(m *fsm.FSM) error { _, err := m.Exists("/nothing"); return err })
	}
	round, onLease := leader.Store.LinearizableReads()
	if err := read(leader); err != nil {
		t.Fatal(err)
	}
	reads(leader, round+1, onLease)
	for range 3 {
		if err := read(leader); err != nil {
			t.Fatal(err)
		}
	}
	reads(leader, round+1, onLease+3)

	clock.Add(lease)
	if err := read(leader); err != nil {
		t.Fatal(err)
	}
	reads(leader, round+2, onLease+3)

	if err := leader.Store.TransferLeadership(ctx); err != nil {
		t.Fatal(err)
	}
	if err := read(leader); err == nil {
		t.Fatal("the replica that handed its leadership over answered a linearizable read")
	}
	reads(leader, round+2, onLease+3)
	next, err := c.LeaderExcept(ctx, leader)
	if err != nil {
		t.Fatal(err)
	}
	round, onLease = next.Store.LinearizableReads()
	if err := read(next); err != nil {
		t.Fatal(err)
	}
	reads(next, round+1, onLease)
}
