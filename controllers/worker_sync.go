package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/masterpb"
)

// syncCallTimeout bounds one worker's sync: it lists the whole source, as its mount did.
const syncCallTimeout = 2 * time.Minute

// WorkerSyncs is the DatasetSyncer over the workers' data-plane port: it finds a pool's live
// workers at the master and asks each, with the operator's certificate (the workers allow the
// sync to the operator alone), to sync its mount of the Dataset.
type WorkerSyncs struct {
	Workers WorkerLister
	// Peers speak to the workers, with the operator's client certificate and the check of theirs.
	Peers *dataplane.Peers
}

// liveWorkers are the data-plane addresses of the pool's live workers by id, and the ids in
// order.
func (w *WorkerSyncs) liveWorkers(ctx context.Context, pool string) (map[string]string, []string, error) {
	lctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	resp, err := w.Workers.ListWorkers(lctx, &masterpb.ListWorkersRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("listing the workers at the master: %w", err)
	}
	addrs := map[string]string{}
	for _, wk := range resp.GetWorkers() {
		// Worker ids are "<pool>/<node>" (see the worker DaemonSet).
		if strings.HasPrefix(wk.GetId(), pool+"/") && wk.GetState() == masterpb.WorkerState_WORKER_STATE_ALIVE {
			addrs[wk.GetId()] = wk.GetAddress()
		}
	}
	ids := slices.Sorted(maps.Keys(addrs))
	return addrs, ids, nil
}

// SyncDataset implements DatasetSyncer. One worker that mounts the Dataset lists the source;
// the others then take its listing, so that every node shows one tree. Workers that do not
// mount it answer at once; one that fails is named, keeps its tree, and the next worker that
// mounts the Dataset lists instead.
func (w *WorkerSyncs) SyncDataset(ctx context.Context, pool, uid string) (SyncOutcome, error) {
	addrs, ids, err := w.liveWorkers(ctx, pool)
	if err != nil {
		return SyncOutcome{}, err
	}
	syncOne := func(ctx context.Context, id, listingFrom string) (*workerpb.SyncDatasetResponse, error) {
		ctx, cancel := context.WithTimeout(ctx, syncCallTimeout)
		defer cancel()
		return w.Peers.SyncDataset(ctx, addrs[id], uid, listingFrom)
	}
	var out SyncOutcome
	// passed are the workers asked before the first that mounts the Dataset: they are asked
	// again with its listing, so that they drop what they hold of replaced versions too.
	var passed []string
	for i, id := range ids {
		r, err := syncOne(ctx, id, "")
		switch {
		case err != nil:
			out.Failures = append(out.Failures, fmt.Sprintf("worker %s: %v", id, err))
			continue
		case !r.GetMounted():
			passed = append(passed, id)
			continue
		}
		out.merge(r.GetAdded(), r.GetRemoved(), r.GetChanged())
		out.View = &DatasetView{Files: r.GetFiles(), Bytes: r.GetBytes(), Worker: id}
		rest := syncEach(ctx, append(passed, ids[i+1:]...), func(ctx context.Context, other string) (bool, int64, int64, int64, error) {
			r, err := syncOne(ctx, other, addrs[id])
			if err != nil {
				return false, 0, 0, 0, err
			}
			return r.GetMounted(), r.GetAdded(), r.GetRemoved(), r.GetChanged(), nil
		})
		out.add(rest)
		break
	}
	slices.Sort(out.Failures)
	return out, nil
}

// ForgetDataset implements DatasetSyncer.
func (w *WorkerSyncs) ForgetDataset(ctx context.Context, pool, uid string) error {
	addrs, ids, err := w.liveWorkers(ctx, pool)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		fctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
		if err := w.Peers.ForgetDataset(fctx, addrs[id], uid); err != nil {
			errs = append(errs, fmt.Errorf("worker %s: %w", id, err))
		}
		cancel()
	}
	return errors.Join(errs...)
}

// DescribeDataset implements DatasetSyncer: the first worker of the pool, in order, that
// mounts the Dataset describes its mount. Workers that cannot be asked are passed over; if
// none answers at all, the error says why.
func (w *WorkerSyncs) DescribeDataset(ctx context.Context, pool, uid string) (DatasetView, bool, error) {
	addrs, ids, err := w.liveWorkers(ctx, pool)
	if err != nil {
		return DatasetView{}, false, err
	}
	var errs []error
	for _, id := range ids {
		dctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
		r, err := w.Peers.DescribeDataset(dctx, addrs[id], uid, nil)
		cancel()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("worker %s: %w", id, err))
		case r.GetMounted():
			return DatasetView{Files: r.GetFiles(), Bytes: r.GetBytes(), Worker: id}, true, nil
		}
	}
	if len(errs) == len(ids) && len(errs) > 0 {
		return DatasetView{}, false, errors.Join(errs...)
	}
	return DatasetView{}, false, nil
}

// Nodes implements LoadNodes: the nodes of the pool's live workers, in order.
func (w *WorkerSyncs) Nodes(ctx context.Context, pool string) ([]string, error) {
	_, ids, err := w.liveWorkers(ctx, pool)
	if err != nil {
		return nil, err
	}
	nodes := make([]string, 0, len(ids))
	for _, id := range ids {
		nodes = append(nodes, strings.TrimPrefix(id, pool+"/"))
	}
	return nodes, nil
}

// Held implements LoadNodes: the pool's worker on node counts what it holds of the files of
// Dataset uid that paths select.
func (w *WorkerSyncs) Held(ctx context.Context, pool, node, uid string, sel *workerpb.Selection) (SelectionHeld, bool, error) {
	addrs, _, err := w.liveWorkers(ctx, pool)
	if err != nil {
		return SelectionHeld{}, false, err
	}
	addr, ok := addrs[pool+"/"+node]
	if !ok {
		return SelectionHeld{}, false, fmt.Errorf("no live worker of TierPool %s on node %s", pool, node)
	}
	dctx, cancel := context.WithTimeout(ctx, syncCallTimeout)
	defer cancel()
	r, err := w.Peers.DescribeDataset(dctx, addr, uid, sel)
	if err != nil {
		return SelectionHeld{}, false, fmt.Errorf("asking the worker on node %s: %w", node, err)
	}
	held := r.GetSelected()
	return SelectionHeld{Files: held.GetFiles(), Bytes: held.GetBytes(), HeldFiles: held.GetHeldFiles(), HeldBytes: held.GetHeldBytes()},
		r.GetMounted(), nil
}

// Tree implements DatasetTrees: the tree the first worker of the pool, in order, that mounts
// the Dataset shows; when none mounts it, the newest listing a worker keeps of it (the tree its
// next mount starts from). Workers that cannot be asked are passed over; when none has a
// listing, errNotListed if every worker answered so, else why the others could not say.
func (w *WorkerSyncs) Tree(ctx context.Context, pool, uid string, visit func(understore.ObjectInfo)) error {
	addrs, ids, err := w.liveWorkers(ctx, pool)
	if err != nil {
		return err
	}
	var errs []error
	// visited says objects went to visit: a listing that fails after that cannot be taken back,
	// so the tree fails rather than being given twice.
	visited := false
	objects := dataplane.ListingVisitor{Object: func(o understore.ObjectInfo) { visited = true; visit(o) }}
	// stream streams a worker's listing into v; false if it has none, or failed (said in errs).
	stream := func(id string, mountedOnly bool, v dataplane.ListingVisitor) bool {
		lctx, cancel := context.WithTimeout(ctx, syncCallTimeout)
		defer cancel()
		err := w.Peers.VisitListing(lctx, addrs[id], uid, mountedOnly, v)
		if err != nil && !errors.Is(err, listings.ErrNotFound) {
			errs = append(errs, fmt.Errorf("worker %s: %w", id, err))
		}
		return err == nil
	}
	for _, id := range ids {
		if stream(id, true, objects) {
			return nil
		}
		if visited {
			return errors.Join(errs...)
		}
	}
	// No node mounts it: of the listings kept, the newest, asked for their time alone first.
	var newest string
	var newestTaken time.Time
	for _, id := range ids {
		stream(id, false, dataplane.ListingVisitor{Taken: func(t time.Time) bool {
			if newest == "" || t.After(newestTaken) {
				newest, newestTaken = id, t
			}
			return false
		}})
	}
	if newest != "" && stream(newest, false, objects) {
		return nil
	}
	if visited {
		return errors.Join(errs...)
	}
	if len(errs) > 0 {
		// Not errNotListed: a worker that could not be asked may well mount the Dataset, and
		// the user is told why it could not show its tree, not that no node mounts it.
		return fmt.Errorf("no worker that answered has listed the Dataset: %w", errors.Join(errs...))
	}
	return errNotListed
}
