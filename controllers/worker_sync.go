package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

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
	// DialOptions carry the operator's client certificate and the check of the workers'.
	DialOptions []grpc.DialOption

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // by address
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
	w.keepOnly(addrs)
	ids := make([]string, 0, len(addrs))
	for id := range addrs {
		ids = append(ids, id)
	}
	return syncEach(ctx, ids, func(ctx context.Context, id string) (bool, int64, int64, int64, error) {
		stub, err := w.stub(addrs[id])
		if err != nil {
			return false, 0, 0, 0, err
		}
		ctx, cancel := context.WithTimeout(ctx, syncCallTimeout)
		defer cancel()
		r, err := stub.SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid})
		if err != nil {
			return false, 0, 0, 0, err
		}
		return r.GetMounted(), r.GetAdded(), r.GetRemoved(), r.GetChanged(), nil
	}), nil
}

func (w *WorkerSyncs) stub(addr string) (workerpb.DatasetSyncClient, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conns == nil {
		w.conns = map[string]*grpc.ClientConn{}
	}
	c, ok := w.conns[addr]
	if !ok {
		var err error
		if c, err = grpc.NewClient(addr, w.DialOptions...); err != nil {
			return nil, fmt.Errorf("connecting to %s: %w", addr, err)
		}
		w.conns[addr] = c
	}
	return workerpb.NewDatasetSyncClient(c), nil
}

// keepOnly closes the connections to addresses no live worker has any more (restarted pods
// come back at new addresses).
func (w *WorkerSyncs) keepOnly(live map[string]string) {
	keep := map[string]bool{}
	for _, a := range live {
		keep[a] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for addr, c := range w.conns {
		if !keep[addr] {
			_ = c.Close()
			delete(w.conns, addr)
		}
	}
}

// Close closes every connection.
func (w *WorkerSyncs) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for addr, c := range w.conns {
		errs = append(errs, c.Close())
		delete(w.conns, addr)
	}
	return errors.Join(errs...)
}
