package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/periodic"
	"github.com/strata-cache/strata/master/masterpb"
)

// orphanSweep is how often the operator looks for lost workers of TierPools that are gone,
// which a deletion it did not see (it was down) left behind.
const orphanSweep = 10 * time.Minute

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

// forgetOrphans forgets the lost workers of TierPools that no longer exist: those of pools
// deleted while the operator was not running. A worker that is alive is left alone, whatever
// its id: only a lost one is known to be gone.
func (r *TierPoolReconciler) forgetOrphans(ctx context.Context, _ time.Time) {
	log := ctrl.LoggerFrom(ctx).WithName("orphan-workers")
	pools := &datav1alpha1.TierPoolList{}
	if err := r.Client.List(ctx, pools); err != nil {
		log.Error(err, "listing TierPools to find the workers of deleted ones; trying again later")
		return
	}
	exists := map[string]bool{}
	for _, p := range pools.Items {
		exists[p.Name] = true
	}
	workers, err := r.Forgetter.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
	if err != nil {
		log.Error(err, "listing the master's workers to find those of deleted TierPools; trying again later")
		return
	}
	for _, w := range workers.Workers {
		pool, _, ok := strings.Cut(w.Id, "/")
		if !ok || exists[pool] || w.State != masterpb.WorkerState_WORKER_STATE_LOST || w.LossPending {
			continue
		}
		if _, err := r.Forgetter.ForgetWorker(ctx, w.Id); err != nil {
			log.Error(err, "forgetting a lost worker of a deleted TierPool; trying again later", "worker", w.Id)
			continue
		}
		log.Info("forgot a lost worker of a deleted TierPool", "worker", w.Id)
	}
}

// sweepOrphans forgets the lost workers of deleted TierPools at start and every orphanSweep.
func (r *TierPoolReconciler) sweepOrphans(ctx context.Context) error {
	r.forgetOrphans(ctx, time.Now())
	periodic.Every(ctx, orphanSweep, r.forgetOrphans)
	return nil
}
