package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"

	"github.com/strata-cache/strata/master/fsm"
)

// Config configures a Store. Zero fields take the defaults of setDefaults.
type Config struct {
	// ID is the server's Raft id, stable across restarts (the pod name in a StatefulSet).
	ID string
	// Dir holds the Raft log (raft-wal/), the state machine (fsm/) and snapshots (snapshots/).
	Dir string
	// RaftBind is the address the Raft transport listens on, e.g. ":7000".
	RaftBind string
	// RaftAdvertise is the address peers dial, e.g. "master-0.master.ns.svc:7000"; a DNS name
	// is kept as a name. Defaults to the bound address.
	RaftAdvertise string
	// APIAddr is this server's gRPC address as clients reach it; followers redirect clients to
	// the leader's.
	APIAddr string
	// RaftTLS, when set, secures the TCP transport: mutual TLS with masters' certificates.
	RaftTLS *RaftTLS
	// Transport replaces the TCP transport (tests use raft.InmemTransport). RaftBind and
	// RaftAdvertise are then ignored.
	Transport raft.Transport

	// HeartbeatTimeout and ElectionTimeout bound failure detection; together with the election
	// they decide failover time. LeaderLeaseTimeout must not exceed HeartbeatTimeout.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// ReadLease is how long after a quorum answered the leader's round of heartbeats it serves
	// linearizable reads without another (readlease.go). At most half of HeartbeatTimeout, which
	// every replica must share; defaults to a third of it; negative turns it off, every read
	// asking a quorum.
	ReadLease time.Duration

	// SnapshotInterval and SnapshotThreshold decide when a snapshot is taken: raft checks every
	// interval whether threshold entries were appended since the last one.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	// TrailingLogs entries stay in the log after a snapshot, so that a follower slightly behind
	// catches up from the log instead of a full snapshot.
	TrailingLogs uint64
	// SnapshotRetain is how many snapshots are kept on disk.
	SnapshotRetain int
	// ApplyTimeout bounds how long a command waits to be enqueued when the caller's context has
	// no deadline.
	ApplyTimeout time.Duration

	// LogSegmentSize is the size of each of the Raft log's segment files; 0 means raft-wal's
	// default, 64 MiB. Tests, which start replicas by the dozen, make them small.
	LogSegmentSize int
	FSM            fsm.Options

	Logger logr.Logger
	// Now is the clock commands are stamped with; defaults to time.Now.
	Now func() time.Time
}

// Defaults for a master inside one Kubernetes cluster, where round trips are well under a
// millisecond. A follower notices a dead leader after one to three heartbeat timeouts (raft
// checks at random intervals of one to two, and a check that comes just before the timeout
// waits for the next), so 150 ms keeps the worst failover a client sees under half a second
// (docs/benchmarks.md); the leader still sends a heartbeat every 15 ms, a wide margin over
// network hiccups, and pre-vote keeps a replica that missed a few from disrupting the cluster.
// The lease, under which a leader that hears from no quorum steps down, is shorter still.
const (
	DefaultHeartbeatTimeout   = 150 * time.Millisecond
	DefaultElectionTimeout    = 150 * time.Millisecond
	DefaultLeaderLeaseTimeout = 100 * time.Millisecond
	DefaultCommitTimeout      = 20 * time.Millisecond
	DefaultSnapshotInterval   = 60 * time.Second
	DefaultSnapshotThreshold  = 16384
	DefaultTrailingLogs       = 10240
	DefaultSnapshotRetain     = 2
	DefaultApplyTimeout       = 10 * time.Second
)

func (c *Config) setDefaults() {
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = DefaultElectionTimeout
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = min(DefaultLeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = DefaultCommitTimeout
	}
	if c.ReadLease == 0 {
		c.ReadLease = c.HeartbeatTimeout / 3
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = DefaultSnapshotInterval
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = DefaultSnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = DefaultTrailingLogs
	}
	if c.SnapshotRetain == 0 {
		c.SnapshotRetain = DefaultSnapshotRetain
	}
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = DefaultApplyTimeout
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("raft id (ID) is required"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("store directory (Dir) is required"))
	}
	if c.Transport == nil && c.RaftBind == "" {
		errs = append(errs, errors.New("raft bind address (RaftBind) is required without a Transport"))
	}
	if c.APIAddr == "" {
		errs = append(errs, errors.New("gRPC address (APIAddr) is required: followers redirect clients to it"))
	}
	if c.ReadLease > c.HeartbeatTimeout/2 {
		errs = append(errs, fmt.Errorf("read lease %v exceeds half the heartbeat timeout %v: a leader could answer reads after another was elected", c.ReadLease, c.HeartbeatTimeout))
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		errs = append(errs, fmt.Errorf("leader lease timeout %v exceeds heartbeat timeout %v", c.LeaderLeaseTimeout, c.HeartbeatTimeout))
	}
	return errors.Join(errs...)
}
