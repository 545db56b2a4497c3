// Package membership keeps a worker registered with the master: it registers at start, reports
// its tiers in every heartbeat, and registers again (and reports the blocks it still holds)
// whenever the master says it does not know the worker as alive, as after the worker was
// declared lost while it was unreachable.
package membership

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/master/masterpb"
)

// Master is the part of the master client membership uses.
type Master interface {
	RegisterWorker(ctx context.Context, req *masterpb.RegisterWorkerRequest) (*masterpb.Worker, error)
	Heartbeat(ctx context.Context, req *masterpb.HeartbeatRequest) (*masterpb.HeartbeatResponse, error)
}

// Store is what the worker reports about its tiers and blocks.
type Store interface {
	Stats() []tierstore.TierStats
	Blocks() []tierstore.BlockInfo
}

// ReportFunc reports the blocks a worker holds to the master.
type ReportFunc func(ctx context.Context, blocks []tierstore.BlockInfo) (int, error)

// Config describes the worker to the master.
type Config struct {
	// ID is the worker's id at the master, unique in the cluster (the operator uses <pool>/<node>).
	ID string
	// Address is where peers and clients reach the worker's data plane.
	Address string
	// Node is the Kubernetes Node the worker runs on; the operator declares the node's workers
	// lost when the Node goes away.
	Node string
	// Interval between heartbeats; the master declares a worker lost after several missed ones.
	Interval time.Duration
	// Report is called after every registration with every block the store holds.
	Report ReportFunc
	Log    logr.Logger
}

// Member keeps one worker registered.
type Member struct {
	cfg        Config
	master     Master
	store      Store
	registered atomic.Bool

	registrations prometheus.Counter
	heartbeatErrs prometheus.Counter
}

// New returns a member; Run does the work. reg receives its metrics.
func New(cfg Config, master Master, store Store, reg prometheus.Registerer) (*Member, error) {
	switch {
	case cfg.ID == "":
		return nil, errors.New("a worker needs an id to register with the master")
	case cfg.Address == "":
		return nil, errors.New("a worker needs a data-plane address to register with the master")
	case cfg.Interval <= 0:
		return nil, fmt.Errorf("heartbeat interval must be positive, got %s", cfg.Interval)
	}
	m := &Member{
		cfg: cfg, master: master, store: store,
		registrations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_worker_registrations_total",
			Help: "Times the worker registered with the master (at start, and again after the master lost track of it).",
		}),
		heartbeatErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_worker_heartbeat_errors_total",
			Help: "Heartbeats the master did not take.",
		}),
	}
	for _, c := range []prometheus.Collector{m.registrations, m.heartbeatErrs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Registered reports whether the master knows the worker as alive, as far as the worker knows:
// what its readiness probe says.
func (m *Member) Registered() bool { return m.registered.Load() }

// Run registers the worker and sends heartbeats until ctx ends. Failures are logged and retried
// at the heartbeat interval: an unreachable master never stops a worker from serving what it has.
func (m *Member) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		if m.registered.Load() {
			m.heartbeat(ctx)
		} else {
			m.register(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (m *Member) register(ctx context.Context) {
	actx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
	defer cancel()
	_, err := m.master.RegisterWorker(actx, &masterpb.RegisterWorkerRequest{
		Id: m.cfg.ID, Address: m.cfg.Address, Node: m.cfg.Node, Tiers: m.usage(),
	})
	if err != nil {
		if ctx.Err() == nil {
			m.cfg.Log.Error(err, "registering with the master; trying again", "worker", m.cfg.ID, "in", m.cfg.Interval)
		}
		return
	}
	m.registrations.Inc()
	m.registered.Store(true)
	m.cfg.Log.Info("registered with the master", "worker", m.cfg.ID, "address", m.cfg.Address, "node", m.cfg.Node)
	if m.cfg.Report == nil {
		return
	}
	// Reported on the caller's context, not the attempt's: a large tier takes a while.
	n, err := m.cfg.Report(ctx, m.store.Blocks())
	if err != nil && ctx.Err() == nil {
		// The blocks are still served locally; only peers miss them until the next registration.
		m.cfg.Log.Error(err, "reporting blocks to the master", "reported", n)
	}
	m.cfg.Log.Info("reported blocks to the master", "blocks", n)
}

func (m *Member) heartbeat(ctx context.Context) {
	actx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
	defer cancel()
	resp, err := m.master.Heartbeat(actx, &masterpb.HeartbeatRequest{Worker: m.cfg.ID, Tiers: m.usage()})
	if err != nil {
		if ctx.Err() == nil {
			m.heartbeatErrs.Inc()
			m.cfg.Log.Error(err, "heartbeat to the master failed", "worker", m.cfg.ID)
		}
		return
	}
	if resp.GetCommand() == masterpb.WorkerCommand_WORKER_COMMAND_REGISTER {
		m.cfg.Log.Info("the master does not know this worker as alive; registering again", "worker", m.cfg.ID)
		m.registered.Store(false)
		m.register(ctx)
	}
}

func (m *Member) usage() []*masterpb.TierUsage {
	stats := m.store.Stats()
	out := make([]*masterpb.TierUsage, 0, len(stats))
	for _, s := range stats {
		out = append(out, &masterpb.TierUsage{Tier: s.Name, CapacityBytes: s.Quota, UsedBytes: s.Used})
	}
	return out
}
