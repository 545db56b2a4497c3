package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/master/masterpb"
)

// Local is the replica being started.
type Local interface {
	HasState() bool
	Bootstrap(ctx context.Context) error
	// VoteAfter says that a peer has reached term: a replica on an empty disk grants no vote
	// in a term up to the highest so reported, since it may have voted there before its disk
	// was wiped (see store.voteFence).
	VoteAfter(term uint64)
	// WaitForApplied returns once the local state machine applied index, or ctx ends.
	WaitForApplied(ctx context.Context, index uint64) error
	ID() string
	RaftAddr() string
	APIAddr() string
}

// Peers reaches the other replicas.
type Peers interface {
	// Probe asks the replica at addr what it knows of the leader.
	Probe(ctx context.Context, addr string) (*masterpb.LeaderResponse, error)
	// Join asks the cluster's leader, wherever it is, to add a replica, and returns what the
	// leader had applied once it had (masterpb.JoinResponse.applied_index).
	Join(ctx context.Context, req *masterpb.JoinRequest) (uint64, error)
}

// Config says how to start.
type Config struct {
	// Peers are the gRPC addresses of the other replicas.
	Peers []string
	// MayBootstrap lets this replica create a new cluster when no peer belongs to one. Exactly
	// one replica of a cluster may have it: ordinal 0 of the StatefulSet.
	MayBootstrap bool
	// RetryInterval is the pause between rounds of probes (default 1s).
	RetryInterval time.Duration
	Logger        logr.Logger
}

// Outcomes of Start.
const (
	Resumed      = "resumed"
	Joined       = "joined"
	Bootstrapped = "bootstrapped"
)

// Start brings the local replica into a cluster and reports how:
//
//   - With Raft state on disk it resumes: Raft knows its peers, and the votes it gave.
//   - Without, it may have had state once (a volume replaced): it tells the local replica the
//     term of every peer that answers, and the replica grants no vote up to the highest of
//     them (it may have voted there before), nor any before the first answer.
//   - Otherwise it probes the peers. When one knows a leader, it asks to join: this is how new
//     replicas arrive, and how a replica whose volume was replaced comes back. It returns once
//     it has applied what the leader had applied when it was added (every write acknowledged
//     before): a replica is ready only then, so that a rolling update, which replaces the next
//     replica once this one is ready, never leaves the group's state on fewer replicas than a
//     quorum (with emptyDir volumes every replaced replica starts empty).
//   - When every peer answers, none knows a leader and none has state, the replica allowed to
//     bootstrap does so: the first start of a new cluster (the StatefulSet starts its pods in
//     parallel, so the peers answer, stateless, within moments).
//   - Otherwise it waits and probes again, until ctx ends: a cluster exists but is electing; or
//     this replica may not bootstrap; or a peer does not answer, and may hold the cluster's
//     state (ordinal 0 on an empty disk while the others are down must not start a second
//     cluster beside theirs: it joins when they are back).
//
// Joining is idempotent on the leader, so a replica that crashes half-way simply starts again.
func Start(ctx context.Context, local Local, peers Peers, cfg Config) (string, error) {
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = time.Second
	}
	log := cfg.Logger
	if local.HasState() {
		log.Info("resuming with existing raft state")
		return Resumed, nil
	}
	for round := 1; ; round++ {
		leaderKnown, clusterExists, reachable := false, false, 0
		for _, addr := range cfg.Peers {
			resp, err := peers.Probe(ctx, addr)
			if err != nil {
				log.V(1).Info("peer did not answer", "peer", addr, "error", err.Error())
				continue
			}
			reachable++
			leaderKnown = leaderKnown || resp.LeaderApiAddr != ""
			clusterExists = clusterExists || resp.HasState || resp.LeaderId != ""
			local.VoteAfter(resp.GetTerm())
		}
		switch {
		case leaderKnown:
			applied, err := peers.Join(ctx, &masterpb.JoinRequest{RaftId: local.ID(), RaftAddr: local.RaftAddr(), ApiAddr: local.APIAddr()})
			if err == nil {
				log.Info("joined the cluster; catching up before saying ready", "round", round, "index", applied)
				if err := catchUp(ctx, local, applied, log); err != nil {
					return "", err
				}
				return Joined, nil
			}
			log.Info("joining failed; retrying", "error", err.Error())
		case !clusterExists && cfg.MayBootstrap && reachable == len(cfg.Peers):
			if err := local.Bootstrap(ctx); err != nil {
				return "", fmt.Errorf("bootstrapping: %w", err)
			}
			log.Info("bootstrapped a new cluster", "peersReachable", reachable)
			return Bootstrapped, nil
		default:
			log.Info("waiting for a leader to join", "round", round, "peersReachable", reachable, "peers", len(cfg.Peers), "clusterExists", clusterExists)
		}
		t := time.NewTimer(cfg.RetryInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("joining the cluster: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// catchUpReport is how often a replica that joined says it is still catching up.
const catchUpReport = 10 * time.Second

// catchUp waits until local applied index, saying every catchUpReport how far it is.
func catchUp(ctx context.Context, local Local, index uint64, log logr.Logger) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, catchUpReport)
		err := local.WaitForApplied(wctx, index)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("catching up with the cluster after joining: %w", err)
		}
		log.Info("still catching up with the cluster; not ready until then", "error", err.Error())
	}
}

// ErrNoPeers is returned by Validate when a replica that may not bootstrap has nobody to join.
var ErrNoPeers = errors.New("a replica that may not bootstrap needs peers to join")

// Validate checks a configuration before Start.
func (c Config) Validate() error {
	if !c.MayBootstrap && len(c.Peers) == 0 {
		return ErrNoPeers
	}
	return nil
}
