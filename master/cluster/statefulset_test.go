package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/cluster"
	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// startAll runs cluster.Start for every replica concurrently, as the pods of a StatefulSet
// with Parallel pod management would; replica 0 may bootstrap.
func startAll(ctx context.Context, t *testing.T, c *mastertest.Cluster, nodes []*mastertest.Node) map[string]string {
	t.Helper()
	outcomes := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func(n *mastertest.Node) {
			defer wg.Done()
			outcome, err := startOne(ctx, c, n)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("%s: %v", n.ID, err)
			}
			outcomes[n.ID] = outcome
		}(n)
	}
	wg.Wait()
	return outcomes
}

func startOne(ctx context.Context, c *mastertest.Cluster, n *mastertest.Node) (string, error) {
	var peers []string
	for _, other := range c.Nodes {
		if other != n {
			peers = append(peers, other.APIAddr)
		}
	}
	cl, err := client.New(peers, client.Options{AttemptTimeout: 500 * time.Millisecond})
	if err != nil {
		return "", err
	}
	defer func() { _ = cl.Close() }()
	return cluster.Start(ctx, n.Store, cluster.ClientPeers{Client: cl}, cluster.Config{
		Peers: peers, MayBootstrap: n == c.Nodes[0], RetryInterval: 20 * time.Millisecond,
	})
}

func TestStatefulSetBootstrapAndRejoinWithEmptyDisk(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true, NoBootstrap: true})

	outcomes := startAll(ctx, t, c, c.Nodes)
	want := map[string]string{"master-0": cluster.Bootstrapped, "master-1": cluster.Joined, "master-2": cluster.Joined}
	if fmt.Sprint(outcomes) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v", outcomes, want)
	}
	cl := c.Client()
	for i := 0; i < 10; i++ {
		if _, err := cl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: fmt.Sprintf("/sts/f%d", i)}); err != nil {
			t.Fatal(err)
		}
	}

	// Pod 0 is rescheduled onto an empty volume: it must join the running cluster, not
	// bootstrap a second one.
	zero := c.Nodes[0]
	c.Wipe(zero)
	c.Restart(zero)
	if got, err := startOne(ctx, c, zero); err != nil || got != cluster.Joined {
		t.Fatalf("restarted pod 0: %q, %v; want %q", got, err, cluster.Joined)
	}
	// Joined means caught up: it holds every acknowledged write already.
	err := zero.Store.Read(ctx, true, func(m *fsm.FSM) error {
		if ok, err := m.Exists("/sts/f9"); err != nil || !ok {
			return fmt.Errorf("/sts/f9 exists=%v, %w", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pod 0, joined on an empty disk: %v (it applied %d, its peers %d and %d)", err,
			zero.Store.AppliedIndex(), c.Nodes[1].Store.AppliedIndex(), c.Nodes[2].Store.AppliedIndex())
	}
	// Pod 0 on an empty volume again, while the other two, which hold the cluster, are down: it
	// must wait for them, not bootstrap a second cluster; it joins once they are back.
	c.Kill(c.Nodes[1])
	c.Kill(c.Nodes[2])
	c.Kill(zero)
	c.Wipe(zero)
	c.Restart(zero)
	alone, stop := context.WithTimeout(ctx, 2*time.Second)
	got, err := startOne(alone, c, zero)
	stop()
	if err == nil || zero.Store.HasState() {
		t.Fatalf("pod 0 alone on an empty disk: %q, %v, state %v; want it waiting, with no state", got, err, zero.Store.HasState())
	}
	c.Restart(c.Nodes[1])
	c.Restart(c.Nodes[2])
	for _, n := range c.Nodes[1:] {
		if got, err := startOne(ctx, c, n); err != nil || got != cluster.Resumed {
			t.Fatalf("restarted %s: %q, %v; want %q", n.ID, got, err, cluster.Resumed)
		}
	}
	if got, err := startOne(ctx, c, zero); err != nil || got != cluster.Joined {
		t.Fatalf("pod 0, its peers back: %q, %v; want %q", got, err, cluster.Joined)
	}

	// A restart with its disk intact resumes.
	c.Kill(c.Nodes[1])
	c.Restart(c.Nodes[1])
	if got, err := startOne(ctx, c, c.Nodes[1]); err != nil || got != cluster.Resumed {
		t.Fatalf("restarted pod 1: %q, %v; want %q", got, err, cluster.Resumed)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	servers, err := leader.Store.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 3 {
		t.Errorf("configuration %v, want the 3 replicas", servers)
	}
	for _, n := range c.Nodes {
		err := n.Store.Read(ctx, true, func(m *fsm.FSM) error {
			if ok, err := m.Exists("/sts/f9"); err != nil || !ok {
				return fmt.Errorf("/sts/f9 exists=%v, %w", ok, err)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: %v", n.ID, err)
		}
	}
}

// TestAReplicaOnAWipedDiskGivesNoVoteItMayHaveGiven: a replica whose volume was replaced comes
// back under its id and address, remembering no vote, while the leader is gone too. Until a
// peer tells it how far the terms went, it grants the remaining replica's candidate nothing
// (raft alone would: it has no configuration yet, so it takes the candidate for a new
// cluster's); once it has probed its peers, it votes in the terms after theirs, the remaining
// replica is elected with its vote, and it joins with every write kept.
func TestAReplicaOnAWipedDiskGivesNoVoteItMayHaveGiven(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := mastertest.New(t, 3, mastertest.Options{GRPC: true, NoBootstrap: true})
	startAll(ctx, t, c, c.Nodes)
	if _, err := c.Client().CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/wiped/before"}); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wiped, other *mastertest.Node
	for _, n := range c.Nodes {
		switch {
		case n == leader:
		case wiped == nil:
			wiped = n
		default:
			other = n
		}
	}

	c.Wipe(wiped)
	c.Kill(leader)
	c.Restart(wiped)
	if granted, err := c.AskVote(other, wiped, other.Store.Term()+1); err != nil || granted {
		t.Fatalf("a vote asked of the wiped replica before it heard from a peer: granted %v, %v; want refused", granted, err)
	}
	if got, err := startOne(ctx, c, wiped); err != nil || got != cluster.Joined {
		t.Fatalf("the wiped replica: %q, %v; want %q", got, err, cluster.Joined)
	}
	if next, err := c.Leader(ctx); err != nil || next != other {
		t.Fatalf("leader %v, %v; want the replica that stayed, elected with the wiped one's vote", next, err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	err = wiped.Store.Read(ctx, true, func(m *fsm.FSM) error {
		if ok, err := m.Exists("/wiped/before"); err != nil || !ok {
			return fmt.Errorf("/wiped/before exists=%v, %w", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Errorf("the wiped replica: %v", err)
	}
}
