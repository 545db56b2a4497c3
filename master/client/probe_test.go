package client

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/strata-cache/strata/master/masterpb"
)

// namingReplica is a replica that answers Leader only, naming leader.
type namingReplica struct {
	masterpb.UnimplementedMasterServer
	leader string
}

func (r *namingReplica) Leader(context.Context, *masterpb.LeaderRequest) (*masterpb.LeaderResponse, error) {
	return &masterpb.LeaderResponse{LeaderApiAddr: r.leader}, nil
}

func serveNaming(t *testing.T, leader string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	masterpb.RegisterMasterServer(s, &namingReplica{leader: leader})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func TestAProbeFollowsOnlyALeaderThisCallHasNotSeenFail(t *testing.T) {
	// Seeds as the operator writes them; replicas advertise the same names fully qualified.
	const (
		attemptAt = "master-0.master.strata-system.svc:7001" // the replica the attempt waits for
		failed    = "master-1.master.strata-system.svc:7001" // the replica this call saw fail
	)
	tests := map[string]struct {
		named string
		want  string
	}{
		// A follower that has not noticed the failed leader yet still names it.
		"a follower naming the replica that failed":                             {named: failed, want: ""},
		"a follower naming the replica that failed by its fully qualified name": {named: "master-1.master.strata-system.svc.cluster.local:7001", want: ""},
		"a follower naming the replica the attempt waits for":                   {named: attemptAt, want: ""},
		"a follower naming the replica the attempt waits for, fully qualified":  {named: "master-0.master.strata-system.svc.cluster.local:7001", want: ""},
		"a follower knowing no leader":                                          {named: "", want: ""},
		"a follower naming a new leader":                                        {named: "127.0.0.1:3", want: "127.0.0.1:3"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			follower := serveNaming(t, tc.named)
			c, err := New([]string{attemptAt, failed, follower}, Options{ProbeEvery: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			// Bounds the probes of the cases that find nothing: several rounds of them.
			attempt, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if got := c.probeLeader(attempt, make(chan struct{}), attemptAt, failed); got != tc.want {
				t.Errorf("the probe followed %q, want %q", got, tc.want)
			}
		})
	}
}

// TestAClientKnowsAReplicaByOneName: a leader named by a redirect or a probe in its fully
// qualified form is the seed of the same replica, so the client keeps one name and one
// connection for it, and its probe and the suspect it names recognise it.
func TestAClientKnowsAReplicaByOneName(t *testing.T) {
	seeds := []string{"master-0.master.strata-system.svc:7001", "master-1.master.strata-system.svc:7001"}
	c, err := New(seeds, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for advertised, want := range map[string]string{
		"master-1.master.strata-system.svc.cluster.local:7001": seeds[1],
		"master-0.master.strata-system.svc:7001":               seeds[0],
		"master-2.master.strata-system.svc.cluster.local:7001": "master-2.master.strata-system.svc.cluster.local:7001",
	} {
		if got := c.canonical(advertised); got != want {
			t.Errorf("canonical(%q) = %q, want %q", advertised, got, want)
		}
	}
}
