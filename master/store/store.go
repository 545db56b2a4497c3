package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/logadapter"
	"github.com/strata-cache/strata/master/masterpb"
)

var (
	// ErrNotLeader is matched (errors.Is) by every *NotLeaderError.
	ErrNotLeader = errors.New("not the leader")
	// ErrLeadershipLost means the command was proposed but leadership was lost before it
	// committed. It may still commit under the next leader; the outcome is unknown.
	ErrLeadershipLost = errors.New("leadership lost before the command committed; it may or may not be applied")
	// ErrShutdown means the store is closed.
	ErrShutdown = errors.New("store is shut down")
)

// NotLeaderError says this server cannot serve the request and who can. LeaderAPIAddr is empty
// while no leader is known, or while the leader has not yet published its gRPC address.
type NotLeaderError struct {
	LeaderID       string
	LeaderRaftAddr string
	LeaderAPIAddr  string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "not the leader, and no leader is known"
	}
	return fmt.Sprintf("not the leader; the leader is %s (gRPC %q, raft %s)", e.LeaderID, e.LeaderAPIAddr, e.LeaderRaftAddr)
}

// Is makes errors.Is(err, ErrNotLeader) hold.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// Store is one master replica.
type Store struct {
	cfg        Config
	log        logr.Logger
	raft       *raft.Raft
	fsm        *fsm.FSM
	logs       raftLog
	walMetrics *walmetrics.AtomicCollector
	snaps      *raft.FileSnapshotStore
	trans      raft.Transport
	// fence holds back the votes of a replica that started on an empty disk (votefence.go).
	fence *voteFence

	observer *raft.Observer
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// caughtUpTerm is the term in which this server, as leader, applied a barrier: from then on
	// its state machine holds every entry committed before its term.
	caughtUpTerm  atomic.Uint64
	leaderChanges atomic.Uint64
	leaderSince   atomic.Int64
	// contactLosses counts the elections watchContact started as a follower.
	contactLosses atomic.Uint64
	// lease lets linearizable reads go without a round of heartbeats each (readlease.go);
	// leaseReads and verifiedReads count the reads served on it and by a round.
	lease         readLease
	leaseReads    atomic.Uint64
	verifiedReads atomic.Uint64
	// leaderSeen is closed, and replaced, each time this replica learns of a leader, for the
	// calls that wait for one (awaitLeader).
	leaderMu   sync.Mutex
	leaderSeen chan struct{}
	// beats are the heartbeats this replica took as leader (see Heartbeat).
	beats heartbeats

	// restoreMu makes restores one at a time, each checking that the state is empty.
	restoreMu sync.Mutex

	// readMu lets Close wait for reads in flight before it closes the state machine's database.
	readMu    sync.RWMutex
	closed    bool
	closeOnce sync.Once
	closeErr  error
}

// Open starts a replica. A new server with no state waits, as a follower, until Bootstrap makes
// it a one-server cluster or a leader adds it (Join).
func Open(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("store config: %w", err)
	}
	log := cfg.Logger.WithValues("raftID", cfg.ID)
	hlog := logadapter.NewHCLog(log.WithName("raft"), hclog.Info)

	// raft's file snapshot store adds its own snapshots/ below Dir.
	for _, d := range []string{"fsm"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o750); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	s := &Store{cfg: cfg, log: log, leaderSeen: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.closeParts()
		}
	}()

	var err error
	s.walMetrics = walmetrics.NewAtomicCollector(wal.MetricDefinitions)
	if s.logs, err = openRaftLog(cfg.Dir, log.WithName("log"), cfg.LogSegmentSize, s.walMetrics); err != nil {
		return nil, err
	}
	if s.fsm, err = fsm.Open(filepath.Join(cfg.Dir, "fsm"), log.WithName("fsm"), cfg.FSM); err != nil {
		return nil, err
	}
	if s.snaps, err = raft.NewFileSnapshotStoreWithLogger(cfg.Dir, cfg.SnapshotRetain, hlog.Named("snapshots")); err != nil {
		return nil, fmt.Errorf("opening snapshot store: %w", err)
	}
	trans := cfg.Transport
	if trans == nil {
		if trans, err = newTCPTransport(cfg.RaftBind, cfg.RaftAdvertise, cfg.RaftTLS, hlog.Named("transport")); err != nil {
			return nil, err
		}
	}
	s.fence = newVoteFence(trans, log.WithName("votes"))
	s.trans = s.fence
	if s.HasState() {
		// Its votes are on its disk, as raft keeps them.
		s.fence.Open()
	}

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.Logger = hlog
	// Take up to MaxAppendEntries queued commands per log write: with many concurrent clients
	// one fsync then covers a whole batch.
	rc.BatchApplyCh = true
	if rc.NoSnapshotRestoreOnStart, err = s.prepareFSM(); err != nil {
		return nil, err
	}
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("raft config: %w", err)
	}
	logCache, err := raft.NewLogCache(1024, s.logs)
	if err != nil {
		return nil, fmt.Errorf("raft log cache: %w", err)
	}
	if s.raft, err = raft.NewRaft(rc, s.fsm, logCache, s.logs, s.snaps, s.trans); err != nil {
		return nil, fmt.Errorf("starting raft: %w", err)
	}

	observations := make(chan raft.Observation, 64)
	s.observer = raft.NewObserver(observations, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	s.raft.RegisterObserver(s.observer)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.watchLeadership(ctx, observations)
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.collectGarbage(ctx)
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.watchContact(ctx)
	}()
	ok = true
	log.Info("raft started", "raftAddr", s.trans.LocalAddr(), "apiAddr", cfg.APIAddr,
		"appliedIndex", s.fsm.AppliedIndex(), "restoreSnapshotOnStart", !rc.NoSnapshotRestoreOnStart)
	return s, nil
}

// prepareFSM decides whether raft must restore the latest snapshot at start. The state machine
// is persistent and records its applied index, so when it already holds the snapshot's entries
// the restore (drop everything, reload) is skipped and raft replays only the log after the
// snapshot, which Apply ignores up to the applied index. A state machine behind the snapshot
// (its unsynced writes lost in a crash) is restored; one ahead of everything raft holds belongs
// to an earlier life of this directory and is wiped.
func (s *Store) prepareFSM() (noRestore bool, err error) {
	snaps, err := s.snaps.List()
	if err != nil {
		return false, fmt.Errorf("listing snapshots: %w", err)
	}
	var snapIndex uint64
	if len(snaps) > 0 {
		snapIndex = snaps[0].Index
	}
	last, err := s.logs.LastIndex()
	if err != nil {
		return false, err
	}
	applied := s.fsm.AppliedIndex()
	if applied > max(last, snapIndex) {
		s.log.Info("state machine is ahead of the raft log; discarding it", "appliedIndex", applied, "lastLogIndex", last, "snapshotIndex", snapIndex)
		if err := s.fsm.Reset(); err != nil {
			return false, err
		}
		applied = 0
	}
	return len(snaps) > 0 && applied >= snapIndex, nil
}

// watchLeadership counts leader changes and, when this server becomes leader, catches its state
// machine up (so linearizable reads need no barrier of their own) and publishes its gRPC
// address for redirects.
func (s *Store) watchLeadership(ctx context.Context, observations <-chan raft.Observation) {
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-observations:
			lo, ok := o.Data.(raft.LeaderObservation)
			if !ok {
				continue
			}
			s.leaderChanges.Add(1)
			if lo.LeaderID != "" {
				s.leaderMu.Lock()
				close(s.leaderSeen)
				s.leaderSeen = make(chan struct{})
				s.leaderMu.Unlock()
				// Following a leader: raft itself refuses the votes of its term and those
				// before (see voteFence).
				s.fence.Floor(s.raft.CurrentTerm())
			}
			if lo.LeaderID != raft.ServerID(s.cfg.ID) {
				s.leaderSince.Store(0)
				continue
			}
			s.leaderSince.Store(s.cfg.Now().UnixNano())
			s.lease.reset()
			s.log.Info("became leader", "term", s.raft.CurrentTerm())
			if err := s.onLeader(ctx); err != nil && ctx.Err() == nil {
				s.log.Error(err, "preparing as the new leader")
			}
		}
	}
}

func (s *Store) onLeader(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
	defer cancel()
	if err := s.catchUp(ctx); err != nil {
		return err
	}
	want := &masterpb.Peer{RaftId: s.cfg.ID, RaftAddr: string(s.trans.LocalAddr()), ApiAddr: s.cfg.APIAddr}
	if got, err := s.peer(s.cfg.ID); err == nil && proto.Equal(got, want) {
		return nil
	}
	_, err := s.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_SetPeer{SetPeer: &masterpb.SetPeer{Peer: want}}})
	return err
}

// catchUp applies a barrier once per leadership term.
func (s *Store) catchUp(ctx context.Context) error {
	term := s.raft.CurrentTerm()
	if s.caughtUpTerm.Load() == term {
		return nil
	}
	if err := s.wait(ctx, s.raft.Barrier(s.timeout(ctx))); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	s.caughtUpTerm.Store(term)
	return nil
}

// collectGarbage reclaims the state machine's value-log space, which Badger does not reclaim on
// its own.
func (s *Store) collectGarbage(ctx context.Context) {
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Each successful run rewrites one file; stop at the first that finds nothing.
			collected := true
			for collected && ctx.Err() == nil {
				collected = s.fsm.DB().RunValueLogGC(0.5) == nil
			}
		}
	}
}

// timeout turns the context's deadline into the timeout raft's calls take.
func (s *Store) timeout(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d > 0 {
			return d
		}
		return time.Millisecond
	}
	return s.cfg.ApplyTimeout
}

// wait waits for a raft future or the context. Raft futures cannot be cancelled; the goroutine
// that waits on one ends when raft resolves it (committed, failed or shut down).
func (s *Store) wait(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return s.mapRaftErr(ctx, err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) mapRaftErr(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrNotVoter):
		return s.notLeader(ctx)
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return ErrLeadershipLost
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrShutdown
	}
	return err
}

// notLeader is the error of a call this replica cannot serve, naming the leader. During an
// election it waits until the replica knows the new leader (awaitLeader), so that the client is
// sent there at once instead of polling the replicas until one knows.
func (s *Store) notLeader(ctx context.Context) error {
	id, raftAddr, apiAddr := s.awaitLeader(ctx)
	return &NotLeaderError{LeaderID: id, LeaderRaftAddr: raftAddr, LeaderAPIAddr: apiAddr}
}

// awaitLeader returns the leader once this replica knows one, and its gRPC address, other than
// the one the caller saw fail (masterpb.SuspectLeader); or what it knows after one election's
// worth of time (three heartbeat timeouts, the longest a follower takes to notice a dead leader,
// and an election timeout) or when ctx ends.
func (s *Store) awaitLeader(ctx context.Context) (id, raftAddr, apiAddr string) {
	suspect := masterpb.SuspectLeader(ctx)
	ctx, cancel := context.WithTimeout(ctx, 3*s.cfg.HeartbeatTimeout+s.cfg.ElectionTimeout)
	defer cancel()
	for {
		// Taken before asking raft: a leader learnt in between closes this one.
		s.leaderMu.Lock()
		seen := s.leaderSeen
		s.leaderMu.Unlock()
		id, raftAddr, apiAddr = s.Leader()
		switch {
		case id != "" && apiAddr != "" && !masterpb.SameReplica(apiAddr, suspect), s.raft.State() == raft.Shutdown:
			return id, raftAddr, apiAddr
		case id != "" && apiAddr == "":
			// A leader whose address no entry recorded yet: it records it as it takes office.
			_ = s.WaitForApplied(ctx, s.fsm.AppliedIndex()+1)
		default:
			select {
			case <-seen:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			return s.Leader()
		}
	}
}

// Apply proposes a command and returns its response once it is applied here. It stamps the
// command with the envelope version and this leader's clock. Outcome errors are the fsm
// package's; *NotLeaderError means nothing was proposed; ErrLeadershipLost and context errors
// leave the outcome unknown.
func (s *Store) Apply(ctx context.Context, cmd *masterpb.Command) (proto.Message, error) {
	if s.raft.State() != raft.Leader {
		return nil, s.notLeader(ctx)
	}
	cmd.Version = fsm.CommandVersion
	cmd.AtUnixNano = s.cfg.Now().UnixNano()
	data, err := proto.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encoding command: %w", err)
	}
	f := s.raft.Apply(data, s.timeout(ctx))
	if err := s.wait(ctx, f); err != nil {
		return nil, err
	}
	res, ok := f.Response().(*fsm.Result)
	if !ok {
		return nil, fmt.Errorf("state machine returned %T for a command", f.Response())
	}
	if forgotten := cmd.GetForgetWorker(); forgotten != nil && res.Err == nil {
		s.beats.forget(forgotten.GetWorker())
	}
	return res.Response, res.Err
}

// VerifyRead makes a following local read linearizable: this server is the leader, its state
// machine holds everything committed before its term, and a quorum still follows it, as a round
// of heartbeats shows, or showed less than ReadLease ago (readlease.go).
func (s *Store) VerifyRead(ctx context.Context) error {
	if s.raft.State() != raft.Leader {
		return s.notLeader(ctx)
	}
	if err := s.catchUp(ctx); err != nil {
		return err
	}
	term := s.raft.CurrentTerm()
	start := s.cfg.Now()
	if s.lease.valid(term, start) {
		s.leaseReads.Add(1)
		return nil
	}
	if err := s.wait(ctx, s.raft.VerifyLeader()); err != nil {
		return err
	}
	s.verifiedReads.Add(1)
	s.lease.extend(term, start, s.cfg.ReadLease)
	return nil
}

// Read runs fn on the state machine: after VerifyRead, so that it is linearizable, unless
// staleOK, when it reads whatever this replica has applied (on any replica). fn must not keep
// the state machine after it returns.
func (s *Store) Read(ctx context.Context, staleOK bool, fn func(*fsm.FSM) error) error {
	if !staleOK {
		if err := s.VerifyRead(ctx); err != nil {
			return err
		}
	}
	s.readMu.RLock()
	defer s.readMu.RUnlock()
	if s.closed {
		return ErrShutdown
	}
	return fn(s.fsm)
}

// peer reads a peer record unless the store is closed.
func (s *Store) peer(id string) (*masterpb.Peer, error) {
	s.readMu.RLock()
	defer s.readMu.RUnlock()
	if s.closed {
		return nil, ErrShutdown
	}
	return s.fsm.Peer(id)
}

// Workers returns every worker, read linearizably on the leader.
func (s *Store) Workers(ctx context.Context) ([]*masterpb.Worker, error) {
	var ws []*masterpb.Worker
	err := s.Read(ctx, false, func(m *fsm.FSM) (err error) {
		ws, err = m.Workers()
		return err
	})
	return ws, err
}

// LinearizableReads counts the linearizable reads this replica served as leader: those a round
// of heartbeats verified, and those served on the read lease (readlease.go).
func (s *Store) LinearizableReads() (byRound, byLease uint64) {
	return s.verifiedReads.Load(), s.leaseReads.Load()
}

// ID is this server's Raft id.
func (s *Store) ID() string { return s.cfg.ID }

// RaftAddr is this server's advertised Raft address.
func (s *Store) RaftAddr() string { return string(s.trans.LocalAddr()) }

// APIAddr is this server's gRPC address.
func (s *Store) APIAddr() string { return s.cfg.APIAddr }

// IsLeader reports whether this server is the leader now.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// LeaderSince is when this server last became leader, or the zero time when it is not leader.
func (s *Store) LeaderSince() time.Time {
	ns := s.leaderSince.Load()
	if ns == 0 || !s.IsLeader() {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Leader returns the leader's Raft id and addresses; empty when no leader is known. The gRPC
// address comes from the replicated peer records.
func (s *Store) Leader() (id, raftAddr, apiAddr string) {
	addr, sid := s.raft.LeaderWithID()
	if sid == "" {
		return "", "", ""
	}
	if p, err := s.peer(string(sid)); err == nil {
		apiAddr = p.ApiAddr
	}
	return string(sid), string(addr), apiAddr
}

// State is the Raft state (Follower, Candidate, Leader, Shutdown).
func (s *Store) State() raft.RaftState { return s.raft.State() }

// VoteAfter tells a replica that started on an empty disk that a peer has reached term: it
// grants no vote in a term up to the highest so reported (see voteFence), and none at all
// before the first report.
func (s *Store) VoteAfter(term uint64) { s.fence.Floor(term) }

// HasState reports whether this server has Raft state: it was bootstrapped or has joined.
func (s *Store) HasState() bool {
	ok, err := raft.HasExistingState(s.logs, s.logs, s.snaps)
	return err == nil && ok
}

// Term is the current Raft term.
func (s *Store) Term() uint64 { return s.raft.CurrentTerm() }

// AppliedIndex is the index of the last entry the state machine applied.
func (s *Store) AppliedIndex() uint64 { return s.fsm.AppliedIndex() }

// SnapshotRestores counts the snapshots this replica's state machine restored since Open:
// at start-up when it was behind its latest snapshot, or when the leader sent one.
func (s *Store) SnapshotRestores() uint64 { return s.fsm.Restores() }

// Servers returns the Raft configuration.
func (s *Store) Servers(ctx context.Context) ([]raft.Server, error) {
	f := s.raft.GetConfiguration()
	if err := s.wait(ctx, f); err != nil {
		return nil, fmt.Errorf("reading raft configuration: %w", err)
	}
	return f.Configuration().Servers, nil
}

// Bootstrap makes this server a one-server cluster, unless it already has state (then it does
// nothing: bootstrapping twice would fork the cluster).
func (s *Store) Bootstrap(ctx context.Context) error {
	if s.HasState() {
		return nil
	}
	cfg := raft.Configuration{Servers: []raft.Server{{
		Suffrage: raft.Voter, ID: raft.ServerID(s.cfg.ID), Address: s.trans.LocalAddr(),
	}}}
	// A new cluster: no vote was ever given in it.
	s.fence.Open()
	err := s.wait(ctx, s.raft.BootstrapCluster(cfg))
	if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return fmt.Errorf("bootstrapping: %w", err)
	}
	s.log.Info("bootstrapped a new cluster")
	return nil
}

// Join adds a voter, on the leader. It is idempotent: a server already present with the same
// id and address is left alone; one whose id or address is known with another partner (a pod
// rescheduled with a new address, or an address reused by a new id) is removed first.
func (s *Store) Join(ctx context.Context, id, raftAddr, apiAddr string) error {
	if s.raft.State() != raft.Leader {
		return s.notLeader(ctx)
	}
	if id == "" || raftAddr == "" {
		return errors.New("join needs a raft id and address")
	}
	servers, err := s.Servers(ctx)
	if err != nil {
		return err
	}
	member := false
	for _, srv := range servers {
		sameID, sameAddr := srv.ID == raft.ServerID(id), srv.Address == raft.ServerAddress(raftAddr)
		switch {
		case sameID && sameAddr:
			member = true
		case sameID || sameAddr:
			s.log.Info("removing a server before it joins again", "id", srv.ID, "addr", srv.Address, "newID", id, "newAddr", raftAddr)
			if err := s.wait(ctx, s.raft.RemoveServer(srv.ID, 0, s.timeout(ctx))); err != nil {
				return fmt.Errorf("removing server %s (%s): %w", srv.ID, srv.Address, err)
			}
		}
	}
	if !member {
		if err := s.wait(ctx, s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, s.timeout(ctx))); err != nil {
			return fmt.Errorf("adding voter %s (%s): %w", id, raftAddr, err)
		}
		s.log.Info("server joined", "joinerID", id, "raftAddr", raftAddr, "apiAddr", apiAddr)
	}
	want := &masterpb.Peer{RaftId: id, RaftAddr: raftAddr, ApiAddr: apiAddr}
	if got, err := s.peer(id); err == nil && proto.Equal(got, want) {
		return nil
	}
	if _, err := s.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_SetPeer{SetPeer: &masterpb.SetPeer{Peer: want}}}); err != nil {
		return fmt.Errorf("recording the address of %s: %w", id, err)
	}
	return nil
}

// Remove removes a server from the cluster, on the leader.
func (s *Store) Remove(ctx context.Context, id string) error {
	if s.raft.State() != raft.Leader {
		return s.notLeader(ctx)
	}
	if err := s.wait(ctx, s.raft.RemoveServer(raft.ServerID(id), 0, s.timeout(ctx))); err != nil {
		return fmt.Errorf("removing server %s: %w", id, err)
	}
	if _, err := s.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_RemovePeer{RemovePeer: &masterpb.RemovePeer{RaftId: id}}}); err != nil {
		return fmt.Errorf("forgetting the address of %s: %w", id, err)
	}
	return nil
}

// TransferLeadership hands leadership to another voter, when this server leads: a replica
// shutting down for a rolling update saves the cluster an election timeout.
func (s *Store) TransferLeadership(ctx context.Context) error {
	if !s.IsLeader() {
		return nil
	}
	s.lease.revoke() // the follower elected next does not wait for a timeout (readlease.go)
	if err := s.wait(ctx, s.raft.LeadershipTransfer()); err != nil {
		return fmt.Errorf("transferring leadership: %w", err)
	}
	return nil
}

// Snapshot takes a snapshot now (and compacts the log).
func (s *Store) Snapshot(ctx context.Context) error {
	if err := s.wait(ctx, s.raft.Snapshot()); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// WaitForApplied waits until the state machine applied index idx.
func (s *Store) WaitForApplied(ctx context.Context, idx uint64) error {
	if err := poll(ctx, func() bool { return s.fsm.AppliedIndex() >= idx }); err != nil {
		return fmt.Errorf("waiting for %s to apply index %d (at %d): %w", s.cfg.ID, idx, s.fsm.AppliedIndex(), err)
	}
	return nil
}

// poll checks cond every few milliseconds until it holds or ctx ends. Raft offers no
// notification for these conditions; polling with a deadline is how raft's own tests wait.
func poll(ctx context.Context, cond func() bool) error {
	if cond() {
		return nil
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if cond() {
				return nil
			}
		}
	}
}

// Close stops raft and closes the databases. The server stops answering its peers at once,
// as if its process had died.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
		}
		s.wg.Wait()
		s.readMu.Lock()
		s.closed = true
		s.readMu.Unlock()
		if s.raft != nil {
			s.raft.DeregisterObserver(s.observer)
			if err := s.raft.Shutdown().Error(); err != nil {
				s.closeErr = fmt.Errorf("shutting raft down: %w", err)
			}
		}
		s.closeParts()
	})
	return s.closeErr
}

// closeParts closes what Open opened, in reverse order.
func (s *Store) closeParts() {
	var errs []error
	if c, ok := s.trans.(interface{ Close() error }); ok && s.trans != nil {
		errs = append(errs, c.Close())
	}
	if s.fsm != nil {
		errs = append(errs, s.fsm.Close())
	}
	if s.logs != nil {
		errs = append(errs, s.logs.Close())
	}
	s.closeErr = errors.Join(append(errs, s.closeErr)...)
}
