package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/strata-cache/strata/master/masterpb"
)

type fakeLocal struct {
	state        bool
	bootstrapped bool
	// voteAfter is the highest term reported by VoteAfter.
	voteAfter uint64
	// caughtUpTo is the index WaitForApplied was asked to wait for.
	caughtUpTo uint64
}

func (l *fakeLocal) WaitForApplied(_ context.Context, index uint64) error {
	l.caughtUpTo = index
	return nil
}

func (l *fakeLocal) VoteAfter(term uint64) { l.voteAfter = max(l.voteAfter, term) }
func (l *fakeLocal) HasState() bool        { return l.state }
func (l *fakeLocal) Bootstrap(context.Context) error {
	l.bootstrapped, l.state = true, true
	return nil
}
func (l *fakeLocal) ID() string       { return "master-0" }
func (l *fakeLocal) RaftAddr() string { return "master-0.master:7000" }
func (l *fakeLocal) APIAddr() string  { return "master-0.master:7001" }

// fakePeers answers probes from a script: rounds[i] holds the answers of round i (the last
// round repeats); a missing address does not answer.
type fakePeers struct {
	rounds  []map[string]*masterpb.LeaderResponse
	probes  int
	peers   int
	joins   []*masterpb.JoinRequest
	joinErr error
}

func (p *fakePeers) Probe(_ context.Context, addr string) (*masterpb.LeaderResponse, error) {
	round := min(p.probes/p.peers, len(p.rounds)-1)
	p.probes++
	if r, ok := p.rounds[round][addr]; ok {
		return r, nil
	}
	return nil, errors.New("connection refused")
}

// joinedAt is the applied index the fake leader answers a join with.
const joinedAt = 42

func (p *fakePeers) Join(_ context.Context, req *masterpb.JoinRequest) (uint64, error) {
	p.joins = append(p.joins, req)
	if p.joinErr != nil {
		return 0, p.joinErr
	}
	return joinedAt, nil
}

func TestStart(t *testing.T) {
	peers := []string{"master-1.master:7001", "master-2.master:7001"}
	leader := &masterpb.LeaderResponse{LeaderId: "master-1", LeaderApiAddr: "master-1.master:7001", HasState: true, Term: 7}
	electing := &masterpb.LeaderResponse{HasState: true, Term: 8}
	fresh := &masterpb.LeaderResponse{}
	tests := map[string]struct {
		state        bool
		mayBootstrap bool
		rounds       []map[string]*masterpb.LeaderResponse
		want         string
		wantJoins    int
		wantErr      bool
		// wantVoteAfter is the highest term the local replica is told a peer reached.
		wantVoteAfter uint64
		// wantCaughtUpTo is the index a joining replica applies before Start returns.
		wantCaughtUpTo uint64
	}{
		"a replica with raft state resumes": {
			state: true, mayBootstrap: true, rounds: []map[string]*masterpb.LeaderResponse{{}}, want: Resumed,
		},
		"ordinal 0 bootstraps once every peer answers, fresh too": {
			mayBootstrap: true, rounds: []map[string]*masterpb.LeaderResponse{{}, {peers[0]: fresh}, {peers[0]: fresh, peers[1]: fresh}},
			want: Bootstrapped,
		},
		"ordinal 0 never bootstraps while no peer answers: they may hold the cluster": {
			mayBootstrap: true, rounds: []map[string]*masterpb.LeaderResponse{{}}, wantErr: true,
		},
		"ordinal 0 never bootstraps while a peer does not answer, though the others are fresh": {
			mayBootstrap: true, rounds: []map[string]*masterpb.LeaderResponse{{peers[0]: fresh}}, wantErr: true,
		},
		"ordinal 0 with an empty disk joins the running cluster, voting in no term it reached, and catches up": {
			mayBootstrap: true, rounds: []map[string]*masterpb.LeaderResponse{{peers[0]: leader, peers[1]: leader}},
			want: Joined, wantJoins: 1, wantVoteAfter: 7, wantCaughtUpTo: joinedAt,
		},
		"ordinal 0 waits while a cluster elects, then joins": {
			mayBootstrap: true,
			rounds: []map[string]*masterpb.LeaderResponse{
				{peers[0]: electing}, {peers[0]: electing, peers[1]: electing}, {peers[0]: leader},
			},
			want: Joined, wantJoins: 1, wantVoteAfter: 8, wantCaughtUpTo: joinedAt,
		},
		"another ordinal joins once a leader is known": {
			rounds: []map[string]*masterpb.LeaderResponse{{}, {peers[0]: fresh}, {peers[0]: leader}},
			want:   Joined, wantJoins: 1, wantVoteAfter: 7, wantCaughtUpTo: joinedAt,
		},
		"another ordinal never bootstraps": {
			rounds: []map[string]*masterpb.LeaderResponse{{peers[0]: fresh, peers[1]: fresh}}, wantErr: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			local := &fakeLocal{state: tc.state}
			fp := &fakePeers{rounds: tc.rounds, peers: len(peers)}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			got, err := Start(ctx, local, fp, Config{Peers: peers, MayBootstrap: tc.mayBootstrap, RetryInterval: time.Millisecond})
			if (err != nil) != tc.wantErr {
				t.Fatalf("Start: %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want || len(fp.joins) != tc.wantJoins {
				t.Errorf("got %q with %d joins, want %q with %d", got, len(fp.joins), tc.want, tc.wantJoins)
			}
			if local.voteAfter != tc.wantVoteAfter {
				t.Errorf("told peers reached term %d, want %d", local.voteAfter, tc.wantVoteAfter)
			}
			if local.caughtUpTo != tc.wantCaughtUpTo {
				t.Errorf("caught up to index %d before returning, want %d", local.caughtUpTo, tc.wantCaughtUpTo)
			}
			if local.bootstrapped != (tc.want == Bootstrapped) {
				t.Errorf("bootstrapped=%v, want %v", local.bootstrapped, tc.want == Bootstrapped)
			}
			for _, j := range fp.joins {
				if j.RaftId != "master-0" || j.RaftAddr != local.RaftAddr() || j.ApiAddr != local.APIAddr() {
					t.Errorf("join request %v does not describe the local replica", j)
				}
			}
		})
	}
}

func TestASingleReplicaBootstraps(t *testing.T) {
	local := &fakeLocal{}
	got, err := Start(context.Background(), local, &fakePeers{}, Config{MayBootstrap: true})
	if err != nil || got != Bootstrapped || !local.bootstrapped {
		t.Fatalf("Start without peers: %q, %v; want %q", got, err, Bootstrapped)
	}
}

func TestStartRetriesAFailedJoin(t *testing.T) {
	peers := []string{"a"}
	fp := &fakePeers{rounds: []map[string]*masterpb.LeaderResponse{{"a": {LeaderId: "x", LeaderApiAddr: "a"}}}, peers: 1, joinErr: errors.New("leader stepped down")}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Start(ctx, &fakeLocal{}, fp, Config{Peers: peers, RetryInterval: time.Millisecond}); err == nil {
		t.Fatal("Start succeeded although every join failed")
	}
	if len(fp.joins) < 2 {
		t.Errorf("tried to join %d times, want retries", len(fp.joins))
	}
}

func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); !errors.Is(err, ErrNoPeers) {
		t.Errorf("a replica that may not bootstrap and has no peers: got %v, want ErrNoPeers", err)
	}
	if err := (Config{MayBootstrap: true}).Validate(); err != nil {
		t.Errorf("a lone bootstrapping replica: %v", err)
	}
}
