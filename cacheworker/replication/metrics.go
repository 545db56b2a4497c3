package replication

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics count what a worker's replicator copies and what it has yet to copy.
type Metrics struct {
	copies      prometheus.Counter
	copiedBytes *prometheus.CounterVec
	failures    prometheus.Counter
	lagBytes    prometheus.Gauge
	lagSeconds  prometheus.Gauge
}

// NewMetrics registers the replication metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	for _, c := range []prometheus.Collector{m.copies, m.copiedBytes, m.failures, m.lagBytes, m.lagSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering replication metrics: %w", err)
		}
	}
	return m, nil
}

func newMetrics() *Metrics {
	const ns, sub = "strata", "worker"
	return &Metrics{
		copies: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replica_copies_total",
			Help: "Replicas of output blocks this worker made on other workers."}),
		copiedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replica_copied_bytes_total",
			Help: "Bytes this worker sent to make replicas, by the node label that bounded them (node: any node)."}, []string{"scope"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replica_copy_failures_total",
			Help: "Replicas this worker could not make (the other worker refused or was unreachable); tried again on the next pass."}),
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "replication_lag_bytes",
			Help: "Bytes of the output blocks this worker holds that have fewer copies than their CachePolicy asks for."}),
		lagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "replication_lag_seconds",
			Help: "Age of the oldest output block this worker holds that has fewer copies than its CachePolicy asks for (0: none)."}),
	}
}
