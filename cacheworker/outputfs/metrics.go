package outputfs

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics count what the output mounts of a worker write. One Metrics serves every output
// mount of the worker; the series are not labelled by Dataset, so they do not grow with the
// number of Datasets written over a worker's life.
type Metrics struct {
	mounts       prometheus.Gauge
	writtenBytes prometheus.Counter
	sealedFiles  prometheus.Counter
	sealedBytes  prometheus.Counter
	sealFailures *prometheus.CounterVec
	// sealSeconds is how long each seal took: what a writer's close(2) waits for.
	sealSeconds prometheus.Histogram
	takeovers   prometheus.Counter
	compactions prometheus.Counter
	// splicedReads counts the reads of sealed files answered by splicing local blocks' files.
	splicedReads prometheus.Counter
	// recoveryWaits and recoveryWaiting count the reads of lost files that waited for them to be
	// written again (see awaitRecovery).
	recoveryWaits   *prometheus.CounterVec
	recoveryWaiting prometheus.Gauge
}

// NewMetrics registers the output mount metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	for _, c := range []prometheus.Collector{m.mounts, m.writtenBytes, m.sealedFiles, m.sealedBytes, m.sealFailures, m.sealSeconds, m.takeovers, m.compactions,
		m.splicedReads, m.recoveryWaits, m.recoveryWaiting} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering output mount metrics: %w", err)
		}
	}
	return m, nil
}

func newMetrics() *Metrics {
	const ns, sub = "strata", "worker"
	return &Metrics{
		mounts: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "output_mounts",
			Help: "Writable output Dataset file systems this worker serves."}),
		writtenBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "output_written_bytes_total",
			Help: "Bytes pods wrote into output Datasets on this node (staged in the top tier until sealed)."}),
		sealedFiles: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "output_sealed_files_total",
			Help: "Output files sealed: closed by their writer, stored as blocks in the top tier and published at the master."}),
		sealedBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "output_sealed_bytes_total",
			Help: "Bytes of the output files sealed."}),
		sealFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "output_seal_failures_total",
			Help: "Output files that could not be sealed, by errno returned to the writer: ENOSPC (tier full of data not checkpointed), EEXIST (sealed elsewhere first), EIO (master or store failure)."},
			[]string{"errno"}),
		sealSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "output_seal_seconds",
			Help: "How long sealing an output file took, failed seals included: what its writer's close waited for " +
				"(storing its blocks in the top tier, and publishing it at the master).",
			Buckets: prometheus.ExponentialBuckets(100e-6, 4, 9)}), // 100 µs to 6.6 s
		splicedReads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "output_spliced_reads_total",
			Help: "Reads of sealed output files answered by splicing the files of blocks a local tier holds into the FUSE device, without copying them through the worker."}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "output_takeovers_total",
			Help: "Output mounts this worker took over from an earlier worker process, its writers and readers going on."}),
		compactions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "output_journal_compactions_total",
			Help: "Times an output mount's journal was compacted into a new one, handed to the CSI node plugin's store."}),
		recoveryWaits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "output_recovery_waits_total",
			Help: "Reads (and opens) of output files lost with their node that waited for them to be written again, by how the wait ended: " +
				"recovered, failed (the Lineage gave up, or the file came back with another size), timeout (the CachePolicy's recovery.readWait), interrupted (the reader gave up)."},
			[]string{"outcome"}),
		recoveryWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "output_recovery_waiting_reads",
			Help: "Reads (and opens) of lost output files waiting now for them to be written again."}),
	}
}
