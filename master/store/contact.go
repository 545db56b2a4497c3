package store

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/raft"
)

// Why a follower watches its leader's contact itself.
//
// Raft (hashicorp/raft) checks a follower's last contact with its leader at random intervals of
// one to two heartbeat timeouts, and a check that falls just short of a timeout since the last
// contact waits for the next: a follower may go on naming a dead leader for up to three
// timeouts. Meanwhile it refuses the (pre-)votes of the other follower, which noticed first,
// because it "has a leader"; that candidate then waits out an election timeout before asking
// again. With three replicas the election needs both followers, so the slower one decides the
// failover, and its wait, not the timeout, made the worst failovers (docs/benchmarks.md).
//
// watchContact checks every contactCheckDivisor-th of a heartbeat timeout and, once the leader
// has been silent for a whole timeout and a random part of another half (so that the two
// followers seldom ask for votes at the same moment and split them), lowers raft's heartbeat
// timeout by a nanosecond and sets it back: raft documents that lowering it makes a follower
// check at once (ReloadConfig), and that check, finding the same silence, starts the election.
// No election starts that raft's own check would not start; only the slack between its checks
// goes.
const contactCheckDivisor = 8

func (s *Store) watchContact(ctx context.Context) {
	t := time.NewTicker(s.cfg.HeartbeatTimeout / contactCheckDivisor)
	defer t.Stop()
	silence := s.silenceAllowed()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.raft.State() != raft.Follower {
				continue
			}
			if addr, _ := s.raft.LeaderWithID(); addr == "" || time.Since(s.raft.LastContact()) < silence {
				continue
			}
			silence = s.silenceAllowed()
			if err := s.checkContactNow(); err != nil {
				s.log.Error(err, "asking raft to check the leader's contact now; it checks at its next interval")
				continue
			}
			s.contactLosses.Add(1)
		}
	}
}

// silenceAllowed is how long watchContact lets a leader be silent: a heartbeat timeout and a
// random part of half of one.
func (s *Store) silenceAllowed() time.Duration {
	return s.cfg.HeartbeatTimeout + rand.N(s.cfg.HeartbeatTimeout/2)
}

// checkContactNow makes raft check the follower's last contact at once (see watchContact).
func (s *Store) checkContactNow() error {
	rc := s.raft.ReloadableConfig()
	lower := rc
	lower.HeartbeatTimeout -= time.Nanosecond
	if err := s.raft.ReloadConfig(lower); err != nil {
		return err
	}
	return s.raft.ReloadConfig(rc)
}
