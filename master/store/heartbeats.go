package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/masterpb"
)

// heartbeats is the leader's memory of its workers' heartbeats. A heartbeat is not written to
// the Raft log: it changes nothing another replica needs, since a new leader gives every worker
// a full timeout anyway (liveness.Detector counts silence from the later of a worker's last
// heartbeat and the leader's start). Writing each one cost an entry per worker every few
// seconds, however idle the cluster. What is replicated is what changes state: a worker's
// registration and loss, and its tier usage once it moved by a hundredth of a tier's capacity
// (the operator's TierPool status reads it from any replica).
type heartbeats struct {
	mu   sync.Mutex
	last map[string]heartbeat

	// inMemory and replicated count the heartbeats taken each way, for the metrics.
	inMemory, replicated atomic.Uint64
}

type heartbeat struct {
	at    time.Time
	tiers []*masterpb.TierUsage
}

func (h *heartbeats) record(worker string, at time.Time, tiers []*masterpb.TierUsage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last = map[string]heartbeat{}
	}
	if len(tiers) == 0 {
		// A heartbeat without usage keeps the usage last heard.
		tiers = h.last[worker].tiers
	}
	h.last[worker] = heartbeat{at: at, tiers: tiers}
}

// forget drops what was heard of a worker the state machine forgot, so that the memory holds
// only workers it knows (a worker forgotten and registered again starts afresh).
func (h *heartbeats) forget(worker string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.last, worker)
}

func (h *heartbeats) get(worker string) (heartbeat, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.last[worker]
	return b, ok
}

// tierMoveFraction is how far a tier's used bytes move, as a share of its capacity, before the
// usage is worth a Raft entry.
const tierMoveFraction = 0.01

// tiersMoved says whether usage differs from what the log holds enough to replicate it: another
// set of tiers, another capacity, or used bytes a hundredth of the capacity away.
func tiersMoved(replicated, now []*masterpb.TierUsage) bool {
	if len(now) == 0 {
		return false
	}
	if len(now) != len(replicated) {
		return true
	}
	for i, t := range now {
		r := replicated[i]
		if t.GetTier() != r.GetTier() || t.GetCapacityBytes() != r.GetCapacityBytes() {
			return true
		}
		moved := t.GetUsedBytes() - r.GetUsedBytes()
		if moved < 0 {
			moved = -moved
		}
		if float64(moved) >= tierMoveFraction*float64(max(t.GetCapacityBytes(), 1)) {
			return true
		}
	}
	return false
}

// Heartbeat records that a worker is alive, on the leader and in its memory only, and replicates
// the worker's tier usage when it moved (see heartbeats). A worker the state machine does not
// know as alive is told to register again. Only the leader takes heartbeats: the detector that
// reads them runs there.
func (s *Store) Heartbeat(ctx context.Context, req *masterpb.HeartbeatRequest) (*masterpb.HeartbeatResponse, error) {
	if !s.IsLeader() {
		return nil, s.notLeader(ctx)
	}
	var w *masterpb.Worker
	err := s.Read(ctx, true, func(m *fsm.FSM) (err error) {
		w, err = m.GetWorker(req.GetWorker())
		return err
	})
	switch {
	case errors.Is(err, fsm.ErrNotFound):
		return &masterpb.HeartbeatResponse{Command: masterpb.WorkerCommand_WORKER_COMMAND_REGISTER}, nil
	case err != nil:
		return nil, err
	case w.GetState() != masterpb.WorkerState_WORKER_STATE_ALIVE:
		return &masterpb.HeartbeatResponse{Command: masterpb.WorkerCommand_WORKER_COMMAND_REGISTER}, nil
	}
	s.beats.record(w.GetId(), s.cfg.Now(), req.GetTiers())
	if !tiersMoved(w.GetTiers(), req.GetTiers()) {
		s.beats.inMemory.Add(1)
		return &masterpb.HeartbeatResponse{}, nil
	}
	s.beats.replicated.Add(1)
	resp, err := s.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_Heartbeat{Heartbeat: req}})
	if err != nil {
		return nil, err
	}
	out, ok := resp.(*masterpb.HeartbeatResponse)
	if !ok {
		return nil, errors.New("the state machine answered a heartbeat with something else")
	}
	return out, nil
}

// LastHeartbeat is when this replica, as leader, last heard from worker (zero if it has not).
func (s *Store) LastHeartbeat(worker string) time.Time {
	b, _ := s.beats.get(worker)
	return b.at
}

// WithHeartbeats gives each worker of ws the heartbeat time and tier usage this replica heard
// last, where they are newer than the state machine's: what ListWorkers answers.
func (s *Store) WithHeartbeats(ws []*masterpb.Worker) []*masterpb.Worker {
	out := make([]*masterpb.Worker, len(ws))
	for i, w := range ws {
		b, ok := s.beats.get(w.GetId())
		if !ok || b.at.UnixNano() <= w.GetLastHeartbeatUnixNano() || w.GetState() != masterpb.WorkerState_WORKER_STATE_ALIVE {
			out[i] = w
			continue
		}
		fresh := proto.Clone(w).(*masterpb.Worker)
		fresh.LastHeartbeatUnixNano = b.at.UnixNano()
		if len(b.tiers) > 0 {
			fresh.Tiers = b.tiers
		}
		out[i] = fresh
	}
	return out
}
