package store

import (
	"sync"
	"time"
)

// Why a leader may answer reads without asking its followers each time.
//
// A linearizable read must not be served by a leader that a newer one has replaced: the newer
// one may have committed writes the reader would miss. VerifyLeader rules that out by a round of
// heartbeats that a quorum answers after the read began, which costs the leader and both
// followers work per round (raft merges the rounds of concurrent reads, and still they were a
// sixth of the exists benchmark's time, docs/benchmarks.md).
//
// A round that a quorum answered also says something about the time after it: every follower
// that answered heard from this leader after the round began, and such a follower neither starts
// an election nor votes for another candidate (raft refuses the votes of a follower that has a
// leader; pre-vote too) until a whole heartbeat timeout passed without hearing from the leader.
// So no other leader can be elected, let alone commit, before the round's start plus a
// heartbeat timeout, and the reads that come before the start plus ReadLease are served on the
// round, without one of their own. ReadLease is a third of the timeout by default and at most
// half: the rest is the margin for clocks, scheduling, and the heartbeat that raft may count for
// a round though it was sent just before the round began (replication.go's notifyAll takes the
// next answer for every round waiting). Every replica must have the same heartbeat timeout (a
// StatefulSet's replicas share their flags).
//
// What breaks that reasoning ends the lease: a new term (this replica lost leadership, and
// perhaps won it back), and a leadership transfer, in which the leader itself asks a follower to
// start an election at once (raft's TimeoutNow), and the others vote for it though they have a
// leader. A transfer revokes the lease until this replica is elected again.
type readLease struct {
	mu      sync.Mutex
	term    uint64
	until   time.Time
	revoked bool
}

// valid says whether a read at now in term may be served without a round.
func (l *readLease) valid(term uint64, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.revoked && l.term == term && now.Before(l.until)
}

// extend records that a round that began at start, in term, was answered by a quorum: reads
// until start+lease need none.
func (l *readLease) extend(term uint64, start time.Time, lease time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.revoked || lease <= 0 {
		return
	}
	if until := start.Add(lease); l.term != term || until.After(l.until) {
		l.term, l.until = term, until
	}
}

// revoke ends the lease until reset: the leader hands its leadership over.
func (l *readLease) revoke() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.revoked, l.until = true, time.Time{}
}

// reset lets a lease be taken again: this replica was elected.
func (l *readLease) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.revoked, l.until = false, time.Time{}
}
