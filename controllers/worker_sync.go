package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/strata-cache/strata/cacheworker/dataplane"
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

// SyncDataset implements DatasetSyncer.
func (w *WorkerSyncs) SyncDataset(ctx context.Context, pool, uid string) (SyncOutcome, error) {
	lctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	resp, err := w.Workers.ListWorkers(lctx, &masterpb.ListWorkersRequest{})
	if err != nil {
		return SyncOutcome{}, fmt.Errorf("listing the workers at the master: %w", err)
	}
	addrs := map[string]string{}
	for _, wk := range resp.GetWorkers() {
		// Worker ids are "<pool>/<node>" (see the worker DaemonSet).
		if strings.HasPrefix(wk.GetId(), pool+"/") && wk.GetState() == masterpb.WorkerState_WORKER_STATE_ALIVE {
			addrs[wk.GetId()] = wk.GetAddress()
		}
	}
	ids := make([]string, 0, len(addrs))
	for id := range addrs {
		ids = append(ids, id)
	}
	return syncEach(ctx, ids, func(ctx context.Context, id string) (bool, int64, int64, int64, error) {
		ctx, cancel := context.WithTimeout(ctx, syncCallTimeout)
		defer cancel()
		r, err := w.Peers.SyncDataset(ctx, addrs[id], uid)
		if err != nil {
			return false, 0, 0, 0, err
		}
		return r.GetMounted(), r.GetAdded(), r.GetRemoved(), r.GetChanged(), nil
	}), nil
}
