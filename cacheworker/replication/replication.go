// Package replication keeps the copies a CachePolicy asks for of the outputs Lineages write,
// while they are not checkpointed (ISS's replication of intermediate data):
//
//   - asynchronous: a writer's close never waits for a replica; a worker looks at the blocks
//     it holds every pass (Replicator.Run) and copies what lacks copies;
//   - within a scope: every copy is on a node that shares the writer's value of the scope's node
//     label (a rack, a zone; the operator writes the nodes' values into the policies file), or
//     on any node for scope Node; never two copies on one node;
//   - selective: every live copy on a node of the scope counts, however it got there (a reader
//     that keeps what it read from another node, as outputfs does for selective policies), so
//     that data a step already moved is not copied again.
//
// The master knows every copy (each is reported as a location of its block by the worker that
// stores it), so that when a node is lost its blocks are read from another copy, and its
// outputs count as neither lost nor recomputed. One live holder of a block makes the copies it
// lacks (the one of the smallest worker id, so that two holders never both copy), which also
// restores the count on the nodes left after a loss, and on a node that comes back empty.
// Copies go to the workers of the scope in an order fixed per block (rendezvous hashing), so
// that the blocks of a file spread over the nodes, one at a time, under the policy's bandwidth
// cap. A checkpointed block (clean: the under-store has it) needs no replica.
package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/throttle"
	"github.com/strata-cache/strata/master/masterpb"
)

// Store is the part of the tier store the replicator reads.
type Store interface {
	UncleanBlocks() []tierstore.BlockInfo
	OpenVerified(ctx context.Context, id string) (io.ReadCloser, tierstore.BlockInfo, error)
}

// Master is the part of the master client the replicator asks where blocks and workers are.
type Master interface {
	GetBlockLocations(ctx context.Context, req *masterpb.GetBlockLocationsRequest) (*masterpb.GetBlockLocationsResponse, error)
	ListWorkers(ctx context.Context, req *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error)
}

// Sender writes a block to another worker's data plane (dataplane.Peers).
type Sender interface {
	WriteBlock(ctx context.Context, addr string, h *workerpb.WriteBlockHeader, data []byte) (*workerpb.BlockHeader, error)
}

// Config configures a Replicator.
type Config struct {
	// Self is this worker's id at the master, Node its node's name.
	Self, Node string
	Store      Store
	Master     Master
	Sender     Sender
	// Policies returns the policies applied last: which Datasets are replicated, how, and the
	// nodes' labels.
	Policies func() *policy.Set
	// Recheck is how long a block is left alone once a pass found it with all its copies, or
	// with nothing this worker can do for it (another holder makes its copies; no node of its
	// scope has room), before it is looked at again: a node lost or added since may change
	// that. 0 means DefaultRecheck.
	Recheck time.Duration
	// Metrics receives the counts; nil counts nowhere.
	Metrics *Metrics
	Log     logr.Logger
}

// DefaultRecheck is Config.Recheck's default.
const DefaultRecheck = 30 * time.Second

// Replicator makes the replicas of the blocks its worker holds.
type Replicator struct {
	cfg     Config
	limiter *rate.Limiter

	mu sync.Mutex
	// settled holds the blocks a pass left alone until Recheck, and whether each lacks copies.
	settled map[string]verdict
	// unplaced remembers the problems logged already (a node without its scope label), so
	// that each is logged once, not every pass.
	unplaced map[string]bool
}

// New returns a replicator.
func New(cfg Config) *Replicator {
	if cfg.Recheck <= 0 {
		cfg.Recheck = DefaultRecheck
	}
	if cfg.Metrics == nil {
		cfg.Metrics = newMetrics()
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	return &Replicator{cfg: cfg, limiter: rate.NewLimiter(rate.Inf, throttle.Chunk),
		settled: map[string]verdict{}, unplaced: map[string]bool{}}
}

// Run makes a pass every interval until ctx ends.
func (r *Replicator) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Log.Error(err, "replicating blocks; trying again on the next pass")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Result is what one pass did.
type Result struct {
	// Copied counts the copies made, Unreplicated the blocks held that still lack copies.
	Copied, Unreplicated int
}

// verdict is what a pass found of a block it settled, and when.
type verdict struct {
	at      time.Time
	lagging bool
}

// outcome is what a pass did for a block.
type outcome int

const (
	// replicated: the block has all its copies (or needs none any more).
	replicated outcome = iota
	// waiting: it lacks copies that this worker cannot make now (another holder makes them, no
	// node of the scope has room, this node's place in the scope is unknown).
	waiting
	// retry: it lacks copies, to be tried again on the next pass (not published yet, a copy
	// failed).
	retry
)

// candidate is a block this worker holds that its Dataset's policy replicates.
type candidate struct {
	info   tierstore.BlockInfo
	origin *workerpb.BlockOrigin
	policy policy.Replication
}

// Pass looks at every block this worker holds whose Dataset is replicated and makes the copies
// it lacks, and updates the lag metrics.
func (r *Replicator) Pass(ctx context.Context) (Result, error) {
	set := r.cfg.Policies()
	now := time.Now()
	candidates, behind := r.candidates(set, now)
	var res Result
	var lagBytes int64
	var oldest time.Time
	lagging := func(info tierstore.BlockInfo) {
		res.Unreplicated++
		lagBytes += info.Size
		if oldest.IsZero() || info.Created.Before(oldest) {
			oldest = info.Created
		}
	}
	for _, info := range behind {
		lagging(info)
	}
	defer func() {
		r.cfg.Metrics.lagBytes.Set(float64(lagBytes))
		age := 0.0
		if !oldest.IsZero() {
			age = now.Sub(oldest).Seconds()
		}
		r.cfg.Metrics.lagSeconds.Set(age)
	}()
	if len(candidates) == 0 {
		return res, nil
	}
	workers, err := r.workers(ctx)
	if err != nil {
		for _, c := range candidates {
			lagging(c.info)
		}
		return res, err
	}
	var errs []error
	for _, c := range candidates {
		copied, out, err := r.replicate(ctx, set, c, workers)
		res.Copied += copied
		if err != nil {
			errs = append(errs, err)
		}
		if out != replicated {
			lagging(c.info)
		}
		if out != retry {
			r.mu.Lock()
			r.settled[c.info.ID] = verdict{at: now, lagging: out == waiting}
			r.mu.Unlock()
		}
		if ctx.Err() != nil {
			break
		}
	}
	return res, errors.Join(errs...)
}

// candidates are the blocks held whose Dataset is replicated and that are not checkpointed
// (clean) nor settled within Recheck; behind are those settled as lacking copies. It looks at
// the blocks not clean only, a few among the cached copies a node mostly holds.
func (r *Replicator) candidates(set *policy.Set, now time.Time) (out []candidate, behind []tierstore.BlockInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := map[string]bool{} // the blocks not clean: a block settled and since clean or gone is forgotten
	for _, b := range r.cfg.Store.UncleanBlocks() {
		held[b.ID] = true
		if len(b.Origin) == 0 {
			continue
		}
		if v, ok := r.settled[b.ID]; ok && now.Sub(v.at) < r.cfg.Recheck {
			if v.lagging {
				behind = append(behind, b)
			}
			continue
		}
		var o workerpb.BlockOrigin
		if err := proto.Unmarshal(b.Origin, &o); err != nil || o.GetFileToken() == "" {
			continue // not an output's block
		}
		p, ok := set.Replication(o.GetDataset())
		if !ok {
			continue
		}
		out = append(out, candidate{info: b, origin: &o, policy: p})
	}
	for id := range r.settled {
		if !held[id] {
			delete(r.settled, id)
		}
	}
	return out, behind
}

// worker is a live worker of the cluster.
type worker struct{ id, addr, node string }

func (r *Replicator) workers(ctx context.Context) ([]worker, error) {
	resp, err := r.cfg.Master.ListWorkers(ctx, &masterpb.ListWorkersRequest{StaleOk: true})
	if err != nil {
		return nil, fmt.Errorf("listing the workers: %w", err)
	}
	var out []worker
	for _, w := range resp.GetWorkers() {
		if w.GetState() == masterpb.WorkerState_WORKER_STATE_ALIVE && w.GetAddress() != "" && w.GetNode() != "" {
			out = append(out, worker{id: w.GetId(), addr: w.GetAddress(), node: w.GetNode()})
		}
	}
	return out, nil
}

// replicate makes the copies block c lacks, if this worker is the one to make them.
func (r *Replicator) replicate(ctx context.Context, set *policy.Set, c candidate, workers []worker) (copied int, _ outcome, err error) {
	inScope, ok := r.scope(set, c)
	if !ok {
		return 0, waiting, nil
	}
	resp, err := r.cfg.Master.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{
		BlockIds: []uint64{locations.MasterBlockID(c.info.ID)}, StaleOk: true,
	})
	switch {
	case status.Code(err) == codes.NotFound:
		return 0, retry, nil // not published yet, or its file is gone (the sweeper drops it)
	case err != nil:
		return 0, retry, fmt.Errorf("looking up the copies of block %s: %w", c.info.ID, err)
	case len(resp.GetBlocks()) != 1 || resp.GetBlocks()[0].GetPath() != c.origin.GetPath():
		return 0, replicated, nil // a block of a version the file no longer has
	}
	nodeOf := map[string]string{}
	for _, w := range workers {
		nodeOf[w.id] = w.node
	}
	holders := map[string]bool{r.cfg.Node: true} // nodes of the scope with a live copy
	copier := r.cfg.Self
	for _, l := range resp.GetBlocks()[0].GetLocations() {
		node, live := nodeOf[l.GetWorker()]
		if l.GetLost() || !live || !inScope(node) {
			continue
		}
		holders[node] = true
		copier = min(copier, l.GetWorker())
	}
	need := c.policy.Count - len(holders)
	if need <= 0 {
		return 0, replicated, nil
	}
	if copier != r.cfg.Self {
		return 0, waiting, nil // the holder of the smallest id makes the copies
	}
	targets := r.targets(c.info.ID, workers, holders, inScope)
	if len(targets) == 0 {
		r.logOnce("no room:"+c.origin.GetDataset(), "no other node of the replication scope has a live worker: "+
			"the Dataset's blocks have fewer copies than its CachePolicy asks for",
			"dataset", c.origin.GetDataset(), "scopeLabel", c.policy.ScopeLabel, "copies", len(holders), "want", c.policy.Count)
		return 0, waiting, nil
	}
	data, err := r.read(ctx, c)
	if err != nil {
		return 0, retry, err
	}
	h := &workerpb.WriteBlockHeader{BlockId: c.info.ID, Size: c.info.Size, Crc32C: c.info.Checksum, Origin: c.origin}
	for _, t := range targets[:min(need, len(targets))] {
		if _, err := r.cfg.Sender.WriteBlock(ctx, t.addr, h, data); err != nil {
			r.cfg.Metrics.failures.Inc()
			return copied, retry, fmt.Errorf("copying block %s to worker %s on node %s: %w", c.info.ID, t.id, t.node, err)
		}
		copied++
		r.cfg.Metrics.copies.Inc()
		r.cfg.Metrics.copiedBytes.WithLabelValues(scopeName(c.policy.ScopeLabel)).Add(float64(len(data)))
	}
	if len(targets) < need {
		return copied, waiting, nil // the scope has fewer nodes with room than copies wanted
	}
	return copied, replicated, nil
}

// scope returns whether a node is in the scope of c's replicas; false when this node's own
// place in it is unknown (it lacks the scope's label), which is logged once.
func (r *Replicator) scope(set *policy.Set, c candidate) (func(node string) bool, bool) {
	label := c.policy.ScopeLabel
	if label == "" {
		return func(string) bool { return true }, true
	}
	mine, ok := set.NodeLabel(r.cfg.Node, label)
	if !ok {
		r.logOnce("unlabelled:"+label, "this node has no value of the label that bounds the replicas' scope: "+
			"its blocks are not replicated; label the node, or use scope Node",
			"node", r.cfg.Node, "label", label, "dataset", c.origin.GetDataset())
		return nil, false
	}
	return func(node string) bool {
		v, ok := set.NodeLabel(node, label)
		return ok && v == mine
	}, true
}

// targets are the live workers of the scope on nodes without a copy, one per node, in the
// block's own order.
func (r *Replicator) targets(id string, workers []worker, holders map[string]bool, inScope func(string) bool) []worker {
	seen := map[string]bool{}
	var out []worker
	for _, w := range workers {
		if holders[w.node] || seen[w.node] || !inScope(w.node) {
			continue
		}
		seen[w.node] = true
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b worker) int {
		if ha, hb := rank(id, a.id), rank(id, b.id); ha != hb {
			if ha < hb {
				return -1
			}
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
	return out
}

// rank is the rendezvous hash of a block on a worker: each block orders the workers its own way.
func rank(block, worker string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(block))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(worker))
	return h.Sum64()
}

// read reads c's block, checked against its checksum, at the policy's bandwidth.
func (r *Replicator) read(ctx context.Context, c candidate) ([]byte, error) {
	limit := rate.Inf
	if c.policy.BandwidthBytes > 0 {
		limit = rate.Limit(c.policy.BandwidthBytes)
	}
	r.limiter.SetLimit(limit)
	rc, _, err := r.cfg.Store.OpenVerified(ctx, c.info.ID)
	if err != nil {
		return nil, fmt.Errorf("reading block %s to copy it: %w", c.info.ID, err)
	}
	defer func() { _ = rc.Close() }()
	var buf bytes.Buffer
	buf.Grow(int(c.info.Size))
	if _, err := io.Copy(&buf, &throttle.Reader{Ctx: ctx, R: rc, Limiter: r.limiter}); err != nil {
		return nil, fmt.Errorf("reading block %s to copy it: %w", c.info.ID, err)
	}
	return buf.Bytes(), nil
}

func (r *Replicator) logOnce(key, msg string, kv ...any) {
	r.mu.Lock()
	seen := r.unplaced[key]
	r.unplaced[key] = true
	r.mu.Unlock()
	if !seen {
		r.cfg.Log.Info(msg, kv...)
	}
}

// scopeName is a metric label for a scope label: "node" for any node.
func scopeName(label string) string {
	if label == "" {
		return "node"
	}
	return label
}
