package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/strata-cache/strata/master/masterpb"
)

// forgetRecheck is how soon the workers of a deleted TierPool are looked at again when one
// was still alive: its pod may register it again while it terminates.
const forgetRecheck = 30 * time.Second

// WorkerForgetter is the part of the master that lets go of the workers of a deleted TierPool.
type WorkerForgetter interface {
	WorkerRegistry
	ForgetWorker(ctx context.Context, worker string) (*masterpb.ForgetWorkerResponse, error)
}

// forgetWorkers makes the master let go of the workers of pool, which was deleted (a worker's
// id is "<pool>/<node>"). Each is declared lost first, so that its blocks are accounted for as
// when a node goes, then forgotten: a worker left lost forever would make every later
// recomputation keep off its node, as if the node still held lost data. A worker that was
// still alive (its pod terminating) is looked at again later, in case it registered again.
func (r *TierPoolReconciler) forgetWorkers(ctx context.Context, pool string) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	workers, err := r.Forgetter.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the master's workers of deleted TierPool %s: %w", pool, err)
	}
	var result ctrl.Result
	for _, w := range workers.Workers {
		if !strings.HasPrefix(w.Id, pool+"/") {
			continue
		}
		if w.State != masterpb.WorkerState_WORKER_STATE_LOST || w.LossPending {
			resp, err := r.Forgetter.MarkWorkerLost(ctx, w.Id, fmt.Sprintf("TierPool %s was deleted", pool))
			if err != nil {
				return ctrl.Result{}, fmt.Errorf("declaring worker %s of deleted TierPool %s lost: %w", w.Id, pool, err)
			}
			log.Info("worker of a deleted TierPool declared lost", "worker", w.Id, "blocksLost", resp.BlocksLost)
			if w.State != masterpb.WorkerState_WORKER_STATE_LOST {
				result.RequeueAfter = forgetRecheck
			}
		}
		if _, err := r.Forgetter.ForgetWorker(ctx, w.Id); err != nil {
			return ctrl.Result{}, fmt.Errorf("forgetting worker %s of deleted TierPool %s: %w", w.Id, pool, err)
		}
		log.Info("worker of a deleted TierPool forgotten", "worker", w.Id)
	}
	return result, nil
}
