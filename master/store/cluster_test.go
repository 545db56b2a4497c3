package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/metadata"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
	"github.com/strata-cache/strata/master/store"
)

func createCmd(p, token string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_CreateFile{CreateFile: &masterpb.CreateFileRequest{Path: p, ClientToken: token}}}
}

func deleteCmd(p string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_DeleteFile{DeleteFile: &masterpb.DeleteFileRequest{Path: p}}}
}

func deadline(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// createFiles creates /files/<prefix>-<i> for i in [0, n) through the cluster.
func createFiles(ctx context.Context, t *testing.T, c *mastertest.Cluster, prefix string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("/files/%s-%d", prefix, i)
		// The path doubles as client token, which makes the create safe to retry.
		if _, err := c.ApplyIdempotent(ctx, createCmd(p, p)); err != nil {
			t.Fatalf("creating file %d: %v", i, err)
		}
	}
}

// checkFiles checks that node's own state has /files/<prefix>-<i> for every i in [0, n).
func checkFiles(ctx context.Context, t *testing.T, n *mastertest.Node, prefix string, count int) {
	t.Helper()
	err := n.Store.Read(ctx, true, func(m *fsm.FSM) error {
		for i := 0; i < count; i++ {
			p := fmt.Sprintf("/files/%s-%d", prefix, i)
			if ok, err := m.Exists(p); err != nil || !ok {
				return fmt.Errorf("%s: exists=%v, %w", p, ok, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s: %v", n.ID, err)
	}
}

func TestReplicatesToEveryNode(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{})
	createFiles(ctx, t, c, "a", 50)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		checkFiles(ctx, t, n, "a", 50)
	}
}

// redirectOnceKnown is the error of a write to follower once it knows the leader's gRPC address,
// which the leader publishes in a command of its own.
func redirectOnceKnown(ctx context.Context, t *testing.T, follower *mastertest.Node) *store.NotLeaderError {
	t.Helper()
	var nl *store.NotLeaderError
	for {
		_, err := follower.Store.Apply(ctx, createCmd("/x", ""))
		if !errors.As(err, &nl) || !errors.Is(err, store.ErrNotLeader) {
			t.Fatalf("follower Apply: got %v, want a *NotLeaderError", err)
		}
		if nl.LeaderAPIAddr != "" || ctx.Err() != nil {
			return nl
		}
		if err := follower.Store.WaitForApplied(ctx, follower.Store.AppliedIndex()+1); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFollowerRefusesWritesWithTheLeadersAddress(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{})
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	follower := c.Followers(leader)[0]
	nl := redirectOnceKnown(ctx, t, follower)
	if nl.LeaderAPIAddr != leader.APIAddr || nl.LeaderID != leader.ID {
		t.Errorf("redirect to %s (%s), want %s (%s)", nl.LeaderID, nl.LeaderAPIAddr, leader.ID, leader.APIAddr)
	}
	if err := follower.Store.Read(ctx, false, func(*fsm.FSM) error { return nil }); !errors.Is(err, store.ErrNotLeader) {
		t.Errorf("linearizable read on a follower: got %v, want ErrNotLeader", err)
	}
}

func TestAFollowerSendsACallerThatSawTheLeaderDieToTheNextLeader(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{})
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	follower := c.Followers(old)[0]
	nl := redirectOnceKnown(ctx, t, follower) // it knows the leader's address: the next answer is no guess

	c.Kill(old)
	// The follower names the dead leader until it notices it is gone; a caller that saw it fail
	// waits instead, and is sent to the next. The caller may know the leader by a shorter name
	// than the one it advertises (the operator's seeds leave out the cluster domain).
	host, port, err := net.SplitHostPort(old.APIAddr)
	if err != nil {
		t.Fatal(err)
	}
	shortName := net.JoinHostPort(strings.TrimSuffix(host, ".cluster.local"), port)
	if shortName == old.APIAddr {
		t.Fatalf("%s: want a fully qualified address", old.APIAddr)
	}
	sawItFail := metadata.NewIncomingContext(ctx, metadata.Pairs(masterpb.HeaderSuspectLeader, shortName))
	_, err = follower.Store.Apply(sawItFail, createCmd("/y", ""))
	if !errors.As(err, &nl) {
		t.Fatalf("follower Apply: got %v, want a *NotLeaderError", err)
	}
	next, err := c.LeaderExcept(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if nl.LeaderID != next.ID || nl.LeaderAPIAddr != next.APIAddr {
		t.Errorf("sent to %s (%s), want the new leader %s (%s); the dead one was %s", nl.LeaderID, nl.LeaderAPIAddr, next.ID, next.APIAddr, old.ID)
	}
}

// TestFollowersStartTheElectionOnceTheLeaderIsSilentForATimeout kills the leader three times and
// finds that the followers asked raft to check their leader's contact at once (watchContact)
// rather than waiting for raft's own next check: at least once, since raft's check may come
// first by chance.
func TestFollowersStartTheElectionOnceTheLeaderIsSilentForATimeout(t *testing.T) {
	ctx := deadline(t, 2*time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{})
	var losses float64
	for range 3 {
		old, err := c.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		followers := c.Followers(old)
		c.Kill(old)
		if _, err := c.LeaderExcept(ctx, old); err != nil {
			t.Fatal(err)
		}
		for _, f := range followers {
			losses += counterOf(t, store.NewCollector(f.Store), "strata_master_raft_leader_contact_losses_total")
		}
		c.Restart(old)
		if err := c.WaitConverged(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if losses == 0 {
		t.Error("no follower had raft check its leader's contact at once in three failovers")
	}
}

// counterOf is the value of the counter name that collector exports.
func counterOf(t *testing.T, collector prometheus.Collector, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s is not exported", name)
	return 0
}

func TestPartitionedFollowerCatchesUp(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{})
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	follower := c.Followers(leader)[0]
	c.Partition(follower)
	createFiles(ctx, t, c, "p", 30)
	if err := follower.Store.Read(ctx, true, func(m *fsm.FSM) error {
		if ok, _ := m.Exists("/files/p-29"); ok {
			return errors.New("a partitioned follower received entries")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.Heal(follower)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	checkFiles(ctx, t, follower, "p", 30)
}

func TestPartitionedLeaderIsReplaced(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{})
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Partition(old)
	if _, err := c.LeaderExcept(ctx, old); err != nil {
		t.Fatal(err)
	}
	// The cut-off leader steps down when it cannot reach a quorum within its lease.
	for old.Store.IsLeader() {
		if err := ctx.Err(); err != nil {
			t.Fatal("the partitioned leader never stepped down")
		}
		if _, err := old.Store.Apply(ctx, createCmd("/lost-write", "")); err == nil {
			t.Fatal("a partitioned leader acknowledged a write")
		}
	}
	createFiles(ctx, t, c, "q", 10)
	c.Heal(old)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		checkFiles(ctx, t, n, "q", 10)
	}
}

// snapshotConfig makes every snapshot compact the log down to a few entries, so that a
// replica that falls behind must install a snapshot rather than replay the log.
func snapshotConfig(cfg *store.Config) {
	cfg.TrailingLogs = 4
	cfg.SnapshotThreshold = 1 << 30 // Snapshots are taken by the test.
}

func TestRestartFromSnapshot(t *testing.T) {
	ctx := deadline(t, 2*time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{Tune: snapshotConfig})
	createFiles(ctx, t, c, "before", 40)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if err := n.Store.Snapshot(ctx); err != nil {
			t.Fatalf("%s: %v", n.ID, err)
		}
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	down := c.Followers(leader)[0]
	c.Kill(down)

	// While it is down the log moves on and is compacted past what it has, on every replica
	// (leadership may move on a loaded machine).
	createFiles(ctx, t, c, "during", 40)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Followers(down) {
		if err := n.Store.Snapshot(ctx); err != nil {
			t.Fatalf("%s: %v", n.ID, err)
		}
	}
	if leader, err = c.Leader(ctx); err != nil {
		t.Fatal(err)
	}

	c.Restart(down)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	checkFiles(ctx, t, down, "before", 40)
	checkFiles(ctx, t, down, "during", 40)
	if down.Store.SnapshotRestores() != 1 {
		t.Errorf("the restarted replica restored %d snapshots, want 1 (the leader's, its log being compacted)", down.Store.SnapshotRestores())
	}

	// A restarted replica keeps serving after it becomes leader.
	c.Kill(leader)
	createFiles(ctx, t, c, "after", 5)
	c.Restart(leader)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		checkFiles(ctx, t, n, "after", 5)
	}
}

func TestRestartWithLostStateMachineRestoresSnapshot(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{Tune: snapshotConfig})
	createFiles(ctx, t, c, "s", 30)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := c.Followers(leader)[0]
	if err := n.Store.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	c.Kill(n)
	// The state machine's database is gone but the Raft log and snapshots remain: start-up must
	// restore the snapshot instead of trusting an empty state machine.
	if err := os.RemoveAll(filepath.Join(n.Dir, "fsm")); err != nil {
		t.Fatal(err)
	}
	c.Restart(n)
	if n.Store.SnapshotRestores() != 1 {
		t.Errorf("restored %d snapshots at start-up, want 1", n.Store.SnapshotRestores())
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	checkFiles(ctx, t, n, "s", 30)
}

func TestRestartWithIntactStateMachineSkipsRestore(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{Tune: snapshotConfig})
	createFiles(ctx, t, c, "k", 20)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := c.Followers(leader)[0]
	if err := n.Store.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	createFiles(ctx, t, c, "k2", 10)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	c.Kill(n)
	c.Restart(n)
	// The state machine already holds the snapshot and more: no restore, and replaying the
	// log after the snapshot changes nothing.
	if n.Store.SnapshotRestores() != 0 {
		t.Errorf("restored %d snapshots, want 0", n.Store.SnapshotRestores())
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	checkFiles(ctx, t, n, "k", 20)
	checkFiles(ctx, t, n, "k2", 10)
}

func TestWipedReplicaRejoins(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{Tune: snapshotConfig})
	createFiles(ctx, t, c, "w", 30)
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Store.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	n := c.Followers(leader)[0]
	c.Wipe(n)
	c.Restart(n)
	// Joining again with the same id and address changes nothing in the configuration; the
	// leader's replication then fills the empty replica from the snapshot.
	if err := c.Join(ctx, n); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	checkFiles(ctx, t, n, "w", 30)
	servers, err := leader.Store.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 3 {
		t.Errorf("configuration has %d servers after the rejoin, want 3: %v", len(servers), servers)
	}
}

func TestJoinIsIdempotent(t *testing.T) {
	ctx := deadline(t, time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{})
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := c.Followers(leader)[0]
	before, err := leader.Store.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Join(ctx, n); err != nil {
		t.Fatal(err)
	}
	after, err := leader.Store.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("joining a member again changed the configuration:\n%v\n%v", before, after)
	}

	// The same id at a new address replaces the old entry.
	c.Kill(n)
	n.RaftAddr = n.RaftAddr + "-moved"
	c.Restart(n)
	if err := c.Join(ctx, n); err != nil {
		t.Fatal(err)
	}
	servers, err := leader.Store.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found []raft.Server
	for _, s := range servers {
		if string(s.ID) == n.ID {
			found = append(found, s)
		}
	}
	if len(servers) != 3 || len(found) != 1 || string(found[0].Address) != n.RaftAddr {
		t.Errorf("after moving %s: configuration %v, want 3 servers with %s at %s", n.ID, servers, n.ID, n.RaftAddr)
	}
	createFiles(ctx, t, c, "m", 5)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	checkFiles(ctx, t, n, "m", 5)
}
