package store

import (
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the replica's Raft state to Prometheus. The values are read at scrape time,
// so nothing is updated on the write path.
type Collector struct {
	s *Store

	state         *prometheus.Desc
	term          *prometheus.Desc
	appliedIndex  *prometheus.Desc
	commitIndex   *prometheus.Desc
	lastLogIndex  *prometheus.Desc
	leaderChanges *prometheus.Desc
	contactLosses *prometheus.Desc
	restores      *prometheus.Desc
	heartbeats    *prometheus.Desc
	reads         *prometheus.Desc
	// wal are raft-wal's own counters and gauges (appends, bytes, segment rotations, truncations,
	// stable-store writes), by their names in wal.MetricDefinitions.
	wal map[string]walMetric
}

// walMetric is one of raft-wal's metrics as Prometheus exports it.
type walMetric struct {
	desc      *prometheus.Desc
	valueType prometheus.ValueType
}

// NewCollector returns a collector for s; register it with a prometheus.Registerer.
func NewCollector(s *Store) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("strata_master_"+name, help, labels, prometheus.Labels{"raft_id": s.cfg.ID})
	}
	c := &Collector{
		s:             s,
		state:         d("raft_state", "1 for the Raft state this replica is in, 0 for the others.", "state"),
		term:          d("raft_term", "Current Raft term."),
		appliedIndex:  d("raft_applied_index", "Index of the last log entry the state machine applied."),
		commitIndex:   d("raft_commit_index", "Index of the last log entry known to be committed."),
		lastLogIndex:  d("raft_last_log_index", "Index of the last entry in the Raft log."),
		leaderChanges: d("raft_leader_changes_total", "Leader changes this replica observed."),
		contactLosses: d("raft_leader_contact_losses_total", "Times this replica, as a follower, found its leader silent for a heartbeat timeout and had raft check at once (an election follows)."),
		restores:      d("fsm_snapshot_restores_total", "Snapshots the state machine restored since the process started."),
		heartbeats: d("heartbeats_total", "Workers' heartbeats this replica took as leader, by how: memory (kept in the leader's memory only) or replicated (a Raft entry, because the worker's tier usage moved).",
			"recorded"),
		reads: d("linearizable_reads_total", "Linearizable reads this replica served as leader, by how it knew it still led: round (a round of heartbeats a quorum answered) or lease (a round less than the read lease before, readlease.go).",
			"verified_by"),
		wal: map[string]walMetric{},
	}
	for _, m := range wal.MetricDefinitions.Counters {
		c.wal[m.Name] = walMetric{d("raft_wal_"+m.Name+"_total", "The Raft log's (raft-wal) "+m.Desc), prometheus.CounterValue}
	}
	for _, m := range wal.MetricDefinitions.Gauges {
		c.wal[m.Name] = walMetric{d("raft_wal_"+m.Name, "The Raft log's (raft-wal) "+m.Desc), prometheus.GaugeValue}
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.state, c.term, c.appliedIndex, c.commitIndex, c.lastLogIndex, c.leaderChanges, c.contactLosses, c.restores, c.heartbeats, c.reads} {
		ch <- d
	}
	for _, m := range c.wal {
		ch <- m.desc
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	r := c.s.raft
	current := r.State()
	for _, st := range []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown} {
		v := 0.0
		if st == current {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, v, st.String())
	}
	ch <- prometheus.MustNewConstMetric(c.term, prometheus.GaugeValue, float64(r.CurrentTerm()))
	ch <- prometheus.MustNewConstMetric(c.appliedIndex, prometheus.GaugeValue, float64(c.s.fsm.AppliedIndex()))
	ch <- prometheus.MustNewConstMetric(c.commitIndex, prometheus.GaugeValue, float64(r.CommitIndex()))
	ch <- prometheus.MustNewConstMetric(c.lastLogIndex, prometheus.GaugeValue, float64(r.LastIndex()))
	ch <- prometheus.MustNewConstMetric(c.leaderChanges, prometheus.CounterValue, float64(c.s.leaderChanges.Load()))
	ch <- prometheus.MustNewConstMetric(c.contactLosses, prometheus.CounterValue, float64(c.s.contactLosses.Load()))
	ch <- prometheus.MustNewConstMetric(c.restores, prometheus.CounterValue, float64(c.s.fsm.Restores()))
	ch <- prometheus.MustNewConstMetric(c.heartbeats, prometheus.CounterValue, float64(c.s.beats.inMemory.Load()), "memory")
	ch <- prometheus.MustNewConstMetric(c.heartbeats, prometheus.CounterValue, float64(c.s.beats.replicated.Load()), "replicated")
	byRound, byLease := c.s.LinearizableReads()
	ch <- prometheus.MustNewConstMetric(c.reads, prometheus.CounterValue, float64(byRound), "round")
	ch <- prometheus.MustNewConstMetric(c.reads, prometheus.CounterValue, float64(byLease), "lease")
	summary := c.s.walMetrics.Summary()
	for _, values := range []map[string]uint64{summary.Counters, summary.Gauges} {
		for name, v := range values {
			if m, ok := c.wal[name]; ok {
				ch <- prometheus.MustNewConstMetric(m.desc, m.valueType, float64(v))
			}
		}
	}
}
