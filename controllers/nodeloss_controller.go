package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/strata-cache/strata/master/masterpb"
)

// DefaultNodeLossGrace is how long a Node must stay NotReady before its workers are declared
// lost: long enough that a kubelet restart does not send every block of the node to
// recomputation, short enough that readers waiting on lost data are not left hanging.
const DefaultNodeLossGrace = time.Minute

// WorkerRegistry is the part of the master the node-loss reconciler talks to.
type WorkerRegistry interface {
	WorkerLister
	MarkWorkerLost(ctx context.Context, worker, reason string) (*masterpb.MarkWorkerLostResponse, error)
}

// WorkerLister lists the workers the master knows, with what their tiers hold.
type WorkerLister interface {
	ListWorkers(ctx context.Context, req *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error)
}

// NodeLossReconciler tells the master when a Node is gone or has been NotReady for longer than
// Grace, so that the master marks the blocks of the node's workers lost without waiting for
// their heartbeats to time out, and records which of them a replica or a checkpoint still holds.
type NodeLossReconciler struct {
	Client  client.Client
	Workers WorkerRegistry
	Grace   time.Duration
	// Now is the clock; tests set it.
	Now func() time.Time
}

// Reconcile checks one Node.
func (r *NodeLossReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	reason, wait, err := r.lossReason(ctx, req.Name)
	if err != nil || reason == "" {
		return ctrl.Result{RequeueAfter: wait}, err
	}
	workers, err := r.Workers.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the master's workers for node %s: %w", req.Name, err)
	}
	for _, w := range workers.Workers {
		if w.Node != req.Name || w.State == masterpb.WorkerState_WORKER_STATE_LOST {
			continue
		}
		resp, err := r.Workers.MarkWorkerLost(ctx, w.Id, reason)
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("marking worker %s of node %s lost: %w", w.Id, req.Name, err)
		}
		log.Info("worker declared lost", "worker", w.Id, "reason", reason, "blocksLost", resp.BlocksLost)
	}
	return ctrl.Result{}, nil
}

// lossReason says why the node's workers are lost, or, when they are not (yet), how long to wait
// before looking again.
func (r *NodeLossReconciler) lossReason(ctx context.Context, name string) (string, time.Duration, error) {
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("node %s was deleted", name), 0, nil
		}
		return "", 0, fmt.Errorf("reading node %s: %w", name, err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady || c.Status == corev1.ConditionTrue {
			continue
		}
		down := r.now().Sub(c.LastTransitionTime.Time)
		if down < r.grace() {
			return "", r.grace() - down, nil
		}
		return fmt.Sprintf("node %s has been NotReady (%s) since %s", name, c.Reason, c.LastTransitionTime.UTC().Format(time.RFC3339)), 0, nil
	}
	return "", 0, nil
}

func (r *NodeLossReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *NodeLossReconciler) grace() time.Duration {
	if r.Grace > 0 {
		return r.Grace
	}
	return DefaultNodeLossGrace
}

// SetupWithManager runs the reconciler on every Node event, deletions included.
func (r *NodeLossReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodeloss").
		For(&corev1.Node{}).
		Complete(r)
}
