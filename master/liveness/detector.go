package liveness

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/internal/periodic"
	"github.com/strata-cache/strata/master/masterpb"
)

// Store is what the detector needs from the replicated store.
type Store interface {
	IsLeader() bool
	// LeaderSince is when this replica became leader (zero when it is not).
	LeaderSince() time.Time
	// Workers reads the workers linearizably.
	Workers(ctx context.Context) ([]*masterpb.Worker, error)
	// LastHeartbeat is when this replica, as leader, last heard from a worker: heartbeats are
	// kept in the leader's memory, not in the log (zero if it has not).
	LastHeartbeat(worker string) time.Time
	MarkWorkerLost(ctx context.Context, worker, reason string) (*masterpb.MarkWorkerLostResponse, error)
}

// Config configures a Detector.
type Config struct {
	// Timeout is how long a worker may go without a heartbeat (default 30s).
	Timeout time.Duration
	// Interval is how often workers are checked (default Timeout/4).
	Interval time.Duration
	// Now is the clock (default time.Now). It must be the clock the store stamps commands with.
	Now    func() time.Time
	Logger logr.Logger
}

// DefaultTimeout tolerates a few missed heartbeats at the workers' usual few-second interval.
const DefaultTimeout = 30 * time.Second

// Detector finds workers whose heartbeats stopped.
type Detector struct {
	store Store
	cfg   Config
}

// New returns a detector over s.
func New(s Store, cfg Config) *Detector {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Interval == 0 {
		cfg.Interval = cfg.Timeout / 4
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Detector{store: s, cfg: cfg}
}

// Run checks every Interval until ctx ends.
func (d *Detector) Run(ctx context.Context) error {
	periodic.Every(ctx, d.cfg.Interval, func(ctx context.Context, _ time.Time) {
		if _, err := d.Check(ctx); err != nil && ctx.Err() == nil {
			d.cfg.Logger.Error(err, "checking worker heartbeats")
		}
	})
	return nil
}

// Check runs one pass on the leader and returns the workers it declared lost. A worker's
// silence is counted from its last heartbeat (the leader's memory of it, or the log's) or from
// when this replica became leader,
// whichever is later: a new leader gives every worker a full timeout, because heartbeats sent
// while there was no leader could not be recorded. Losses left half-recorded by a previous
// leader are finished.
func (d *Detector) Check(ctx context.Context) ([]string, error) {
	if !d.store.IsLeader() {
		return nil, nil
	}
	since := d.store.LeaderSince()
	if since.IsZero() {
		return nil, nil
	}
	workers, err := d.store.Workers(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	now := d.cfg.Now()
	var lost []string
	for _, w := range workers {
		switch w.State {
		case masterpb.WorkerState_WORKER_STATE_LOST:
			if w.LossPending {
				if _, err := d.store.MarkWorkerLost(ctx, w.Id, w.LostReason); err != nil {
					return lost, fmt.Errorf("finishing the loss of worker %s: %w", w.Id, err)
				}
			}
		case masterpb.WorkerState_WORKER_STATE_ALIVE:
			base := time.Unix(0, w.LastHeartbeatUnixNano)
			if heard := d.store.LastHeartbeat(w.Id); heard.After(base) {
				base = heard
			}
			if since.After(base) {
				base = since
			}
			silence := now.Sub(base)
			if silence <= d.cfg.Timeout {
				continue
			}
			reason := fmt.Sprintf("no heartbeat for %s (timeout %s)", silence.Round(time.Millisecond), d.cfg.Timeout)
			resp, err := d.store.MarkWorkerLost(ctx, w.Id, reason)
			if err != nil {
				return lost, fmt.Errorf("declaring worker %s lost: %w", w.Id, err)
			}
			d.cfg.Logger.Info("worker lost", "worker", w.Id, "node", w.Node, "reason", reason,
				"blocksLost", resp.BlocksLost, "withReplica", resp.BlocksWithReplica,
				"withCheckpoint", resp.BlocksWithCheckpoint, "unrecoverable", resp.BlocksUnrecoverable)
			lost = append(lost, w.Id)
		}
	}
	return lost, nil
}
