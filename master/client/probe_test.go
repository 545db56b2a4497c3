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
	const (
		attemptAt = "127.0.0.1:1" // the replica the attempt waits for
		failed    = "127.0.0.1:2" // the replica this call saw fail
	)
	tests := map[string]struct {
		named string
		want  string
	}{
		// A follower that has not noticed the failed leader yet still names it.
		"a follower naming the replica that failed":           {named: failed, want: ""},
		"a follower naming the replica the attempt waits for": {named: attemptAt, want: ""},
		"a follower knowing no leader":                        {named: "", want: ""},
		"a follower naming a new leader":                      {named: "127.0.0.1:3", want: "127.0.0.1:3"},
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
