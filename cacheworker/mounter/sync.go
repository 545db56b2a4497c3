package mounter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/fusefs"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/lineage/kariz"
)

// syncMetrics count the syncs of mounted Datasets (the operator asks for them).
type syncMetrics struct {
	syncs   *prometheus.CounterVec
	changes *prometheus.CounterVec
	dropped prometheus.Counter
}

// Results of a sync, the syncs counter's label.
const (
	syncChanged    = "changed"
	syncUnchanged  = "unchanged"
	syncNotMounted = "not_mounted"
	syncFailed     = "failed"
)

func newSyncMetrics() *syncMetrics {
	return &syncMetrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_worker_dataset_syncs_total",
			Help: "Syncs of a Dataset the operator asked this worker for, by result: changed, unchanged, not_mounted (nothing to do here) or failed (the tree was kept).",
		}, []string{"result"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_worker_dataset_sync_changes_total",
			Help: "Files the syncs of this worker's mounts found added, removed or changed in their under-stores.",
		}, []string{"change"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_worker_dataset_sync_dropped_blocks_total",
			Help: "Blocks of replaced object versions that syncs removed from this worker's tiers.",
		}),
	}
}

func (s *syncMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.syncs, s.changes, s.dropped}
}

// SyncService is the worker's DatasetSync service over a mounter's mounts, which also says
// which Datasets are mounted (a peer asks for the listing of a mount).
type SyncService interface {
	workerpb.DatasetSyncServer
	Mounted(uid string) bool
}

// SyncServer is the worker's DatasetSync service over this mounter's mounts.
func (m *Mounter) SyncServer() SyncService { return syncServer{m: m} }

// Mounted implements SyncService.
func (s syncServer) Mounted(uid string) bool { return s.m.Mounted(uid) }

type syncServer struct {
	workerpb.UnimplementedDatasetSyncServer
	m *Mounter
}

// SyncDataset implements workerpb.DatasetSyncServer.
func (s syncServer) SyncDataset(ctx context.Context, req *workerpb.SyncDatasetRequest) (*workerpb.SyncDatasetResponse, error) {
	if req.GetForget() {
		return s.m.forgetDeleted(ctx, req.GetUid())
	}
	resp, err := s.m.sync(ctx, req.GetUid(), req.GetListingFrom())
	switch {
	case err != nil:
		s.m.syncs.syncs.WithLabelValues(syncFailed).Inc()
	case !resp.GetMounted():
		s.m.syncs.syncs.WithLabelValues(syncNotMounted).Inc()
	case resp.GetAdded()+resp.GetRemoved()+resp.GetChanged() == 0:
		s.m.syncs.syncs.WithLabelValues(syncUnchanged).Inc()
	default:
		s.m.syncs.syncs.WithLabelValues(syncChanged).Inc()
	}
	return resp, err
}

// sync refreshes the mount of uid, if this worker serves one, holding the UID's lock so that
// no mount, unmount or other sync of it runs meanwhile.
func (m *Mounter) sync(ctx context.Context, uid, listingFrom string) (*workerpb.SyncDatasetResponse, error) {
	mnt, unlock, err := m.lockedMount(ctx, uid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if mnt == nil {
		dropped := m.pruneUnmounted(ctx, uid, listingFrom, m.log.WithValues("uid", uid))
		m.syncs.dropped.Add(float64(dropped))
		return &workerpb.SyncDatasetResponse{BlocksDropped: int64(dropped)}, nil
	}
	input, ok := mnt.fs.(*fusefs.Server)
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition,
			"Dataset %s is a Lineage's output, written by pods: it has no under-store to sync with", mnt.dataset())
	}
	log := m.log.WithValues("dataset", mnt.dataset(), "uid", uid)
	changes, err := input.Refresh(ctx, m.syncLister(mnt, listingFrom, log))
	if err != nil {
		if changes.None() {
			log.Error(err, "sync failed; the mount keeps serving the tree it had")
			return nil, storeError("syncing", mnt.dataset(), err)
		}
		// Changed, but the kernel may show some of the old tree until its timeouts: said, and
		// the blocks are dropped all the same.
		log.Error(err, "synced, but the kernel was not told of every change")
	}
	// The next worker must take over the new tree, not the one the store holds.
	m.hold(ctx, mnt)
	dropped := m.dropReplaced(ctx, uid, changes.Replaced, log)
	m.syncs.changes.WithLabelValues("added").Add(float64(changes.Added))
	m.syncs.changes.WithLabelValues("removed").Add(float64(changes.Removed))
	m.syncs.changes.WithLabelValues("changed").Add(float64(changes.Changed))
	m.syncs.dropped.Add(float64(dropped))
	if !changes.None() {
		log.Info("synced the Dataset with its source", "added", changes.Added, "removed", changes.Removed, "changed", changes.Changed,
			"files", changes.Files, "bytes", changes.Bytes, "droppedBlocks", dropped)
	}
	resp := &workerpb.SyncDatasetResponse{
		Mounted: true, Added: int64(changes.Added), Removed: int64(changes.Removed), Changed: int64(changes.Changed),
		Files: int64(changes.Files), Bytes: changes.Bytes, BlocksDropped: int64(dropped),
	}
	if err != nil {
		return resp, status.Errorf(codes.Internal, "Dataset %s: %v", mnt.dataset(), err)
	}
	return resp, nil
}

// forgetDeleted drops the listing this worker keeps of Dataset uid, which is deleted, holding the
// UID's lock so that no mount of it keeps one meanwhile. A mount that pods still hold keeps
// serving the tree it has; it keeps no listing again, and it is unmounted when the last of
// them goes instead of being kept for the next pod. A mount kept idle is unmounted now.
func (m *Mounter) forgetDeleted(ctx context.Context, uid string) (*workerpb.SyncDatasetResponse, error) {
	mnt, unlock, err := m.lockedMount(ctx, uid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if m.cfg.Listings != nil {
		if err := m.cfg.Listings.Remove(uid); err != nil {
			return nil, status.Errorf(codes.Internal, "forgetting Dataset %s: %v", uid, err)
		}
	}
	m.log.V(1).Info("forgot the listing of a deleted Dataset", "uid", uid)
	if mnt == nil {
		return &workerpb.SyncDatasetResponse{}, nil
	}
	// No pod will mount it again: a mount kept for the next pod goes now, with the under-store
	// client and the credentials it holds, and one that pods use goes with the last of them.
	mnt.deleted.Store(true)
	if mnt.stopIdle() {
		if err := m.unmount(ctx, mnt); err != nil {
			m.keepIdle(mnt) // unmounted when its time is up, as before
			return nil, err
		}
		m.log.Info("unmounted the idle mount of a deleted Dataset", "dataset", mnt.dataset(), "uid", uid)
		return &workerpb.SyncDatasetResponse{}, nil
	}
	// The next worker process must know too, should this one restart before the last pod goes.
	m.hold(ctx, mnt)
	return &workerpb.SyncDatasetResponse{Mounted: true}, nil
}

// DescribeDataset implements workerpb.DatasetSyncServer.
func (s syncServer) DescribeDataset(_ context.Context, req *workerpb.DescribeDatasetRequest) (*workerpb.DescribeDatasetResponse, error) {
	if err := validUID(req.GetUid()); err != nil {
		return nil, err
	}
	// Without the UID's lock: a sync holds it while it lists, and the counts are read whole.
	input, ok := s.m.input(req.GetUid())
	if !ok {
		return &workerpb.DescribeDatasetResponse{}, nil
	}
	resp := &workerpb.DescribeDatasetResponse{Mounted: true, Files: int64(input.Files()), Bytes: input.Bytes()}
	if sel := req.GetSelection(); sel != nil {
		held, err := s.m.selectionHeld(input, req.GetUid(), sel.GetPaths(), int(sel.GetPercent()))
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		resp.Selected = held
	}
	return resp, nil
}

// selectionHeld counts the files of a mounted input Dataset that match one of patterns (every
// file if there are none), and what of them this node's tiers hold, block by block: a file
// counts as held once all its selected blocks are (percent of them, spread over the file, when
// percent is 1 to 99: kariz.Share), so a load is never said done while a byte of it would
// still come from the under-store.
func (m *Mounter) selectionHeld(input *fusefs.Server, uid string, patterns []string, percent int) (*workerpb.SelectionHeld, error) {
	compiled := make([]policy.Pattern, 0, len(patterns))
	for i, p := range patterns {
		c, err := policy.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("selection path %d: %w", i, err)
		}
		compiled = append(compiled, c)
	}
	held := &workerpb.SelectionHeld{}
	for _, f := range input.FileVersions() {
		if len(compiled) > 0 && !slices.ContainsFunc(compiled, func(p policy.Pattern) bool { return p.Match(f.Path) }) {
			continue
		}
		held.Files++
		whole := true
		for _, i := range kariz.Share(int((f.Size+m.cfg.BlockSize-1)/m.cfg.BlockSize), percent) {
			size := min(m.cfg.BlockSize, f.Size-int64(i)*m.cfg.BlockSize)
			held.Bytes += size
			if _, err := m.cfg.Store.Info(cache.BlockID(uid, f.Path, f.ETag, int64(i))); err != nil {
				whole = false
				continue
			}
			held.HeldBytes += size
		}
		if whole {
			held.HeldFiles++
		}
	}
	return held, nil
}

// Mounted says whether this worker mounts Dataset uid, read from an under-store, now.
func (m *Mounter) Mounted(uid string) bool {
	_, ok := m.input(uid)
	return ok
}

// input is the file system of this worker's mount of input Dataset uid, if it has one.
func (m *Mounter) input(uid string) (*fusefs.Server, bool) {
	m.mu.Lock()
	mnt := m.mounts[uid]
	m.mu.Unlock()
	if mnt == nil {
		return nil, false
	}
	input, ok := mnt.fs.(*fusefs.Server)
	return input, ok
}

// pruneUnmounted removes, on a worker that does not mount Dataset uid, the blocks of it that
// it holds from an earlier mount and whose object is now of another version, or gone, in the
// listing the worker at listingFrom has just synced to: no mount would read them again (a
// block id names its version), and they would hold tier space until evicted. Without that
// listing it removes nothing. It returns how many it removed.
func (m *Mounter) pruneUnmounted(ctx context.Context, uid, listingFrom string, log logr.Logger) int {
	if listingFrom == "" || m.cfg.ListingPeers == nil {
		return 0
	}
	type held struct {
		id            string
		path, version string
	}
	var blocks []held
	for _, b := range m.cfg.Store.Blocks() {
		var origin workerpb.BlockOrigin
		if len(b.Origin) == 0 || proto.Unmarshal(b.Origin, &origin) != nil ||
			origin.GetSourceVersion() == "" || !strings.HasSuffix(origin.GetRoot(), "/"+uid) {
			continue // another Dataset's, an output's, or of no known version
		}
		blocks = append(blocks, held{id: b.ID, path: strings.TrimPrefix(origin.GetPath(), origin.GetRoot()+"/"), version: origin.GetSourceVersion()})
	}
	if len(blocks) == 0 {
		return 0
	}
	listing, err := m.cfg.ListingPeers.ListingAt(ctx, listingFrom, uid)
	if err != nil {
		log.Error(err, "taking the synced listing to remove blocks of replaced versions; eviction will take them", "worker", listingFrom)
		return 0
	}
	current := make(map[string]string, len(listing.Objects))
	for _, o := range listing.Objects {
		current[o.Path] = o.ETag
	}
	dropped := 0
	for _, b := range blocks {
		if v, ok := current[b.path]; ok && v == b.version {
			continue
		}
		switch err := m.cfg.Store.Delete(ctx, b.id); {
		case err == nil:
			dropped++
		case errors.Is(err, tierstore.ErrNotFound):
		default:
			log.Error(err, "removing a block of a replaced version", "file", b.path, "version", b.version)
		}
	}
	if dropped > 0 {
		log.Info("removed the blocks of replaced versions of a Dataset this node does not mount", "droppedBlocks", dropped)
	}
	return dropped
}

// dropReplaced removes from the tiers the blocks of versions a sync replaced, except those of
// files still open (their readers go on with them; eviction takes them later). It returns how
// many it removed. The tier store tells the master of each.
func (m *Mounter) dropReplaced(ctx context.Context, uid string, replaced []fusefs.FileVersion, log logr.Logger) int {
	dropped := 0
	for _, v := range replaced {
		if v.Open {
			continue
		}
		blocks := (v.Size + m.cfg.BlockSize - 1) / m.cfg.BlockSize
		for i := range max(blocks, 1) {
			err := m.cfg.Store.Delete(ctx, cache.BlockID(uid, v.Path, v.ETag, i))
			switch {
			case err == nil:
				dropped++
			case errors.Is(err, tierstore.ErrNotFound):
			default:
				log.Error(err, "removing a block of a replaced version", "file", v.Path, "version", v.ETag, "block", i)
			}
		}
	}
	return dropped
}
