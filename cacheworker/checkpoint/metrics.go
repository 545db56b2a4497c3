package checkpoint

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Why a file was checkpointed: the label of the checkpoint metrics.
const (
	reasonEdge         = "edge"
	reasonHot          = "hot"
	reasonInterval     = "interval"
	reasonPersist      = "persist"
	reasonWriteThrough = "write_through"
)

// Metrics count a worker's checkpoints. The series are labelled by reason, not by Dataset, so
// that they do not grow with the Datasets written over a worker's life.
type Metrics struct {
	files    *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	failures *prometheus.CounterVec
	duration *prometheus.HistogramVec
	pending  prometheus.Gauge
	readBack prometheus.Counter
}

// NewMetrics registers the checkpoint metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	for _, c := range []prometheus.Collector{m.files, m.bytes, m.failures, m.duration, m.pending, m.readBack} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering checkpoint metrics: %w", err)
		}
	}
	return m, nil
}

func newMetrics() *Metrics {
	const ns, sub = "strata", "worker"
	reasons := "edge (a leaf of the lineage graph), hot (read more than the hot threshold), interval, " +
		"persist (synchronously, before memory full of it would drop it) or write_through (above the sync write threshold, before its seal returned)"
	return &Metrics{
		files: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "checkpoint_files_total",
			Help: "Output files this worker wrote to their under-store, by reason: " + reasons + "."}, []string{"reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "checkpoint_bytes_total",
			Help: "Bytes of the output files this worker checkpointed, by reason."}, []string{"reason"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "checkpoint_failures_total",
			Help: "Checkpoints of output files that failed (an unreachable or refusing under-store, the master away), by reason; they are tried again."},
			[]string{"reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "checkpoint_duration_seconds",
			Help:    "Time to write one output file to its under-store and record it, by reason.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}, []string{"reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "checkpoint_pending_bytes",
			Help: "Bytes of output files held on this node with no copy in an under-store: what a loss of the node would leave to recomputation."}),
		readBack: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "checkpoint_read_back_bytes_total",
			Help: "Bytes of output files read back from their checkpoints, their blocks in memory lost or dropped."}),
	}
}
