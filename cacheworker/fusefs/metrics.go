package fusefs

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	namespace = "strata"
	subsystem = "worker"
)

// Metrics count what the FUSE file systems of a worker serve. One Metrics serves every mount
// of the worker; they are not labelled by Dataset, so the series do not grow with the number
// of Datasets mounted over a worker's life.
type Metrics struct {
	reads            prometheus.Counter
	readBytes        prometheus.Counter
	readErrors       prometheus.Counter
	splicedReads     prometheus.Counter
	passthroughOpens prometheus.Counter
	mounts           prometheus.Gauge
	takeovers        prometheus.Counter
}

// NewMetrics registers the FUSE metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	for _, c := range []prometheus.Collector{m.reads, m.readBytes, m.readErrors, m.splicedReads, m.passthroughOpens, m.mounts, m.takeovers} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering FUSE metrics: %w", err)
		}
	}
	return m, nil
}

// newMetrics returns metrics registered nowhere, for mounts given none.
func newMetrics() *Metrics {
	return &Metrics{
		reads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "fuse_reads_total",
			Help: "Read requests the FUSE file systems answered; passthrough reads never reach the worker and are not counted."}),
		readBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "fuse_read_bytes_total",
			Help: "Bytes the FUSE file systems returned to readers."}),
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "fuse_read_errors_total",
			Help: "Read requests of the FUSE file systems that failed (EIO, ENOENT or EINTR)."}),
		splicedReads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "fuse_spliced_reads_total",
			Help: "Read requests answered by splicing a block's file of a local tier into the FUSE device, without copying through the worker."}),
		passthroughOpens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "fuse_passthrough_opens_total",
			Help: "Opens of files the kernel reads straight from their block in a local tier (FUSE passthrough)."}),
		mounts: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem, Name: "fuse_mounts",
			Help: "Dataset file systems this worker serves, including those only pods still hold."}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "fuse_takeovers_total",
			Help: "Dataset file systems this worker took over from an earlier worker process, their pods' mounts intact."}),
	}
}
