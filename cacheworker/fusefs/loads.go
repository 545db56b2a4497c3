package fusefs

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Loads tells the reads of loads (a DataLoad's or a Dataset's preload Jobs, and so the
// prefetches of the Lineages' plans) from the reads of the pods that use the data, across every
// mount of a worker:
//
//   - a load never delays a read a pod waits for: a load's block that is not held locally is
//     fetched only while no pod waits for a fetch of the worker's;
//   - the metrics say what the loads brought in, and how much of it pods then read from the
//     tiers before anything else did (strata_worker_load_*_bytes_total, by Dataset).
//
// A load is a read by a process of the loader's user id (the load Jobs run as it, see
// cacheworker/warmup.LoaderUID), which the kernel gives in every FUSE request. A pod of a tenant
// may run as that user too; it then only deprioritises its own reads and counts them as loads
// of a Dataset it may read anyway, so the id needs no secrecy.
type Loads struct {
	uid uint32

	mu sync.Mutex
	// podFetches counts the fetches pods wait for; idle is closed while it is 0.
	podFetches int
	idle       chan struct{}

	loaded, held, hits *prometheus.CounterVec
	// waiting counts the loads that wait for the pods' fetches now.
	waiting prometheus.Gauge
}

// NewLoads returns the loads of a worker whose loaders run as uid, with their metrics on reg.
func NewLoads(reg prometheus.Registerer, uid uint32) (*Loads, error) {
	l := newLoads(uid)
	for _, c := range []prometheus.Collector{l.loaded, l.held, l.hits, l.waiting} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the load metrics: %w", err)
		}
	}
	return l, nil
}

func newLoads(uid uint32) *Loads {
	idle := make(chan struct{})
	close(idle)
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}, []string{"dataset"})
	}
	return &Loads{
		uid: uid, idle: idle,
		loaded: counter("load_fetched_bytes_total",
			"Bytes of blocks that loads (DataLoads, preloads, prefetches) brought into the tiers, by Dataset (namespace/name)."),
		held: counter("load_held_bytes_total",
			"Bytes of blocks that loads read and the tiers held already, by Dataset (namespace/name)."),
		hits: counter("load_hit_bytes_total",
			"Bytes of blocks that a load brought in and a pod then read from the tiers (each block counted once): the loads' worth, by Dataset (namespace/name)."),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem, Name: "loads_waiting",
			Help: "Loads' block fetches that wait because a pod waits for a fetch of this worker's."}),
	}
}

// isLoader says whether a request of user uid is a load's.
func (l *Loads) isLoader(uid uint32) bool { return l != nil && l.uid != 0 && uid == l.uid }

// podFetch records that a pod waits for a fetch until done is called.
func (l *Loads) podFetch() (done func()) {
	if l == nil {
		return func() {}
	}
	l.mu.Lock()
	if l.podFetches == 0 {
		l.idle = make(chan struct{})
	}
	l.podFetches++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.podFetches--
		if l.podFetches == 0 {
			close(l.idle)
		}
	}
}

// waitForPods returns once no pod waits for a fetch, or with ctx's error.
func (l *Loads) waitForPods(ctx context.Context) error {
	counted := false
	defer func() {
		if counted {
			l.waiting.Dec()
		}
	}()
	for {
		l.mu.Lock()
		idle, waiting := l.idle, l.podFetches > 0
		l.mu.Unlock()
		if !waiting {
			return nil
		}
		if !counted {
			l.waiting.Inc()
			counted = true
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// forget drops the series of the Dataset a mount named name served, once it is unmounted.
func (l *Loads) forget(name string) {
	if l == nil {
		return
	}
	d := datasetLabel(name)
	l.loaded.DeleteLabelValues(d)
	l.held.DeleteLabelValues(d)
	l.hits.DeleteLabelValues(d)
}

// datasetLabel is the Dataset a mount's name (strata:namespace/name) names.
func datasetLabel(name string) string { return strings.TrimPrefix(name, "strata:") }

// maxFresh bounds the blocks a mount remembers as loaded and not read yet: the hit count is
// the loads' worth, not a record, and must not grow the worker with a Dataset of millions of
// blocks. Blocks past it are loaded as any other but not counted when read.
const maxFresh = 1 << 18

// fresh remembers, for one mounted Dataset, the blocks loads brought in that no pod read yet.
type fresh struct {
	mu     sync.Mutex
	blocks map[blockKey]int64 // their sizes
}

// loadFetched counts block index of file n, which load h brought into the tiers.
func (fsys *fileSystem) loadFetched(h *handle, n *node, index int64) {
	size, first := h.count(fsys, n, index)
	if !first {
		return
	}
	fsys.loads.loaded.WithLabelValues(fsys.dataset).Add(float64(size))
	fsys.fresh.mu.Lock()
	defer fsys.fresh.mu.Unlock()
	if len(fsys.fresh.blocks) < maxFresh {
		fsys.fresh.blocks[blockKey{h.node, index}] = size
	}
}

// loadHeld counts block index of file n, which load h found in the tiers, unless h is fetching
// it: another request of the load for the same block found it stored by that fetch, which
// counts it as fetched when it returns.
func (fsys *fileSystem) loadHeld(h *handle, n *node, index int64) {
	h.mu.Lock()
	fetching := h.fetching[index] > 0
	h.mu.Unlock()
	if fetching {
		return
	}
	if size, first := h.count(fsys, n, index); first {
		fsys.loads.held.WithLabelValues(fsys.dataset).Add(float64(size))
	}
}

// fetch records that h fetches block index, until the function it returns is called.
func (h *handle) fetch(index int64) (done func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fetching == nil {
		h.fetching = map[int64]int{}
	}
	h.fetching[index]++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.fetching[index]--; h.fetching[index] == 0 {
			delete(h.fetching, index)
		}
	}
}

// count says how large block index of file n is, and whether load h counts it for the first
// time: the kernel may ask for one block in several requests at once.
func (h *handle) count(fsys *fileSystem, n *node, index int64) (size int64, first bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counted[index] {
		return 0, false
	}
	if h.counted == nil {
		h.counted = map[int64]bool{}
	}
	h.counted[index] = true
	return min(fsys.blockSize, n.size-index*fsys.blockSize), true
}

// podRead counts a pod's read of block key from the tiers as a hit of the load that brought it.
func (fsys *fileSystem) podRead(key blockKey) {
	if fsys.loads == nil {
		return
	}
	fsys.fresh.mu.Lock()
	size, ok := fsys.fresh.blocks[key]
	delete(fsys.fresh.blocks, key)
	fsys.fresh.mu.Unlock()
	if ok {
		fsys.loads.hits.WithLabelValues(fsys.dataset).Add(float64(size))
	}
}
