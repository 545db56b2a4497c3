package cache

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strata-cache/strata/cacheworker/tierstore"
)

const (
	namespace = "strata"
	subsystem = "worker"
)

// StatsSource is what the metrics read the tiers' state from.
type StatsSource interface {
	Stats() []tierstore.TierStats
}

// Metrics are the worker's cache metrics. One Metrics serves every Cache of a worker (one
// per Dataset), since they share the tiers.
type Metrics struct {
	hits          *prometheus.CounterVec
	misses        prometheus.Counter
	fetches       prometheus.Counter
	fetchedBytes  prometheus.Counter
	fetchErrors   prometheus.Counter
	storeFailures prometheus.Counter
	peerFetches   prometheus.Counter
	peerBytes     prometheus.Counter
	// prefetches and prefetchErrors count the blocks read ahead of a sequential reader.
	prefetches     prometheus.Counter
	prefetchErrors prometheus.Counter
}

// NewMetrics registers the cache's metrics, and those of the tiers of stats, on reg.
func NewMetrics(reg prometheus.Registerer, stats StatsSource) (*Metrics, error) {
	m := &Metrics{
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "cache_hits_total",
			Help: "Block reads served from a local tier, by tier."}, []string{"tier"}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "cache_misses_total",
			Help: "Block reads that found no local copy."}),
		fetches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "under_store_fetches_total",
			Help: "Blocks fetched from under-stores; concurrent misses on one block count once."}),
		fetchedBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "under_store_fetched_bytes_total",
			Help: "Bytes fetched from under-stores."}),
		fetchErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "under_store_fetch_errors_total",
			Help: "Block fetches from under-stores that failed."}),
		storeFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "cache_store_failures_total",
			Help: "Fetched blocks that were served but could not be cached, such as when every tier is full of pinned blocks."}),
		peerFetches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "peer_fetches_total",
			Help: "Missing blocks read from another worker instead of the under-store."}),
		peerBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "peer_fetched_bytes_total",
			Help: "Bytes read from other workers."}),
		prefetches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "cache_prefetches_total",
			Help: "Blocks read ahead of a sequential reader, into the top tier, before it asked for them."}),
		prefetchErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "cache_prefetch_errors_total",
			Help: "Blocks read ahead of a sequential reader whose read failed (the reader reads them when it gets there)."}),
	}
	for _, t := range stats.Stats() {
		m.hits.WithLabelValues(t.Name) // so that a tier with no hits yet shows 0 rather than nothing
	}
	for _, c := range []prometheus.Collector{m.hits, m.misses, m.fetches, m.fetchedBytes, m.fetchErrors, m.storeFailures, m.peerFetches, m.peerBytes,
		m.prefetches, m.prefetchErrors, newTierCollector(stats)} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering cache metrics: %w", err)
		}
	}
	return m, nil
}

// tierCollector reads the tiers' state when scraped, so the numbers are never stale and the
// tier store needs no metrics code of its own.
type tierCollector struct {
	stats                                                                             StatsSource
	used, quota, blocks, pinned, promotions, demotions, evictions, corrupt, persisted *prometheus.Desc
	datasetUsed                                                                       *prometheus.Desc
}

func newTierCollector(stats StatsSource) *tierCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, []string{"tier", "medium"}, nil)
	}
	return &tierCollector{
		stats:      stats,
		used:       desc("tier_used_bytes", "Bytes held by a tier, including space reserved for writes and moves under way."),
		quota:      desc("tier_quota_bytes", "A tier's quota."),
		blocks:     desc("tier_blocks", "Blocks held by a tier."),
		pinned:     desc("tier_pinned_blocks", "Blocks of a tier that are pinned (a CachePolicy's pinnedPaths): never evicted."),
		promotions: desc("tier_promotions_total", "Blocks moved up into a tier."),
		demotions:  desc("tier_demotions_total", "Blocks moved down out of a tier."),
		evictions:  desc("tier_evictions_total", "Blocks dropped from a tier."),
		persisted:  desc("tier_persisted_before_drop_total", "Dropped blocks that had to be persisted first."),
		corrupt:    desc("tier_corrupt_blocks_total", "Blocks found corrupt in a tier and removed."),
		datasetUsed: prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "tier_dataset_bytes"),
			"Bytes of a Dataset (namespace/name/uid) a tier holds: what its CachePolicy's watermarks bound.",
			[]string{"tier", "medium", "dataset"}, nil),
	}
}

func (c *tierCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.used, c.quota, c.blocks, c.pinned, c.promotions, c.demotions, c.evictions, c.persisted, c.corrupt, c.datasetUsed} {
		ch <- d
	}
}

func (c *tierCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.stats.Stats() {
		labels := []string{t.Name, string(t.Medium)}
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(t.Used), labels...)
		ch <- prometheus.MustNewConstMetric(c.quota, prometheus.GaugeValue, float64(t.Quota), labels...)
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(t.Blocks), labels...)
		ch <- prometheus.MustNewConstMetric(c.pinned, prometheus.GaugeValue, float64(t.Pinned), labels...)
		ch <- prometheus.MustNewConstMetric(c.promotions, prometheus.CounterValue, float64(t.Promotions), labels...)
		ch <- prometheus.MustNewConstMetric(c.demotions, prometheus.CounterValue, float64(t.Demotions), labels...)
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(t.Evictions), labels...)
		ch <- prometheus.MustNewConstMetric(c.persisted, prometheus.CounterValue, float64(t.Persisted), labels...)
		ch <- prometheus.MustNewConstMetric(c.corrupt, prometheus.CounterValue, float64(t.Corrupt), labels...)
		for dataset, n := range t.Datasets {
			if dataset != "" {
				ch <- prometheus.MustNewConstMetric(c.datasetUsed, prometheus.GaugeValue, float64(n), t.Name, string(t.Medium), dataset)
			}
		}
	}
}
