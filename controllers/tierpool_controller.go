package controllers

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

// Reasons of the Events the TierPool reconciler records.
const (
	// EventReasonNodesChanged is recorded when the number of nodes a pool selects changes.
	EventReasonNodesChanged = "NodesChanged"
)

// TierPoolReconciler computes the status of each TierPool from the cluster's Nodes and the
// pool's worker DaemonSet: how many nodes the pool selects, how many run a ready worker, and the
// capacity of each tier over them. The WorkerReconciler deploys the DaemonSet.
type TierPoolReconciler struct {
	// Client reads TierPools, Nodes and DaemonSets (from the manager's cache) and patches
	// TierPool status.
	Client client.Client
	// Recorder records Events on TierPools.
	Recorder record.EventRecorder
	// Workers says where the pools' DaemonSets are, or that the operator deploys none.
	Workers WorkerSpec
	// Master, when the operator runs one, tells what the workers' tiers hold.
	Master WorkerLister
	// Forgetter, when the operator runs a master, lets go of the workers of deleted pools.
	Forgetter WorkerForgetter
}

// The recorder of controller-runtime v0.20 writes core/v1 Events (group ""), not events.k8s.io
// ones; the marker follows what the code does. Events of a cluster-scoped TierPool land in the
// namespace "default", hence the cluster-wide grant.

// +kubebuilder:rbac:groups=data.strata.dev,resources=tierpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=data.strata.dev,resources=tierpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apps,namespace=strata-system,resources=daemonsets,verbs=get;list;watch

// Reconcile brings the status of one TierPool up to date with the Nodes it selects and the
// workers that run on them.
func (r *TierPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)

	pool := &datav1alpha1.TierPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) && r.Forgetter != nil {
			// Gone: the garbage collector removes its workers' objects, and the master lets go
			// of the workers.
			return r.forgetWorkers(ctx, req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}

	sel, err := r.selectNodes(ctx, pool)
	if err != nil {
		return ctrl.Result{}, err
	}

	workers, err := r.observeWorkers(ctx, pool)
	if err != nil {
		return ctrl.Result{}, err
	}

	before := pool.DeepCopy()
	var result ctrl.Result
	used := usedBytes(before)
	if r.Master != nil {
		// Polled: the workers report their tiers to the master, not to the API server.
		result.RequeueAfter = usageRefresh
		if u, err := r.tierUsage(ctx, pool.Name); err != nil {
			log.Info("cannot read the workers' tier usage from the master; keeping the last figures", "error", err.Error())
		} else {
			used = u
		}
	}
	setTierPoolStatus(pool, sel, workers, used)
	if apiequality.Semantic.DeepEqual(before.Status, pool.Status) {
		log.V(1).Info("TierPool status is up to date", "nodes", pool.Status.Nodes)
		return result, nil
	}
	if err := r.Client.Status().Patch(ctx, pool, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, fmt.Errorf("patching status of TierPool %s: %w", pool.Name, err)
	}
	log.Info("TierPool status updated",
		"nodes", pool.Status.Nodes, "matchingNodes", sel.matching, "readyWorkers", pool.Status.ReadyWorkers,
		"observedGeneration", pool.Status.ObservedGeneration)

	// Recorded after the patch succeeded, so that a failed and retried patch records it once.
	if before.Status.Nodes != pool.Status.Nodes {
		eventType := corev1.EventTypeNormal
		if pool.Status.Nodes == 0 {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(pool, eventType, EventReasonNodesChanged,
			"TierPool selects %d node(s), was %d", pool.Status.Nodes, before.Status.Nodes)
	}
	return result, nil
}

// tierUsage sums, per tier, what the pool's live workers report to the master they hold.
func (r *TierPoolReconciler) tierUsage(ctx context.Context, pool string) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	resp, err := r.Master.ListWorkers(ctx, &masterpb.ListWorkersRequest{StaleOk: true})
	if err != nil {
		return nil, fmt.Errorf("listing the master's workers: %w", err)
	}
	used := map[string]int64{}
	for _, w := range resp.GetWorkers() {
		if !liveWorkerOf(w, pool) {
			continue
		}
		for _, t := range w.GetTiers() {
			used[t.GetTier()] += t.GetUsedBytes()
		}
	}
	return used, nil
}

// liveWorkerOf says whether w is a live worker of pool, as the master knows it: worker ids are
// "<pool>/<node>" (see the worker DaemonSet).
func liveWorkerOf(w *masterpb.Worker, pool string) bool {
	return strings.HasPrefix(w.GetId(), pool+"/") && w.GetState() == masterpb.WorkerState_WORKER_STATE_ALIVE
}

// usedBytes is what a pool's status last said its tiers hold.
func usedBytes(pool *datav1alpha1.TierPool) map[string]int64 {
	used := map[string]int64{}
	for _, t := range pool.Status.Tiers {
		used[t.Name] = t.UsedBytes
	}
	return used
}

// nodeSelection is what a TierPool's selector and tolerations pick among the cluster's Nodes.
type nodeSelection struct {
	// matching is how many Nodes match spec.nodeSelector, tolerated or not.
	matching int
	// schedulable are the names of the matching Nodes whose taints the pool tolerates.
	schedulable []string
	// untolerated is one taint that kept a matching Node out, for the status message.
	untolerated *corev1.Taint
}

// selectNodes lists the Nodes that match the pool's selector and keeps those a worker of the
// pool can run on.
func (r *TierPoolReconciler) selectNodes(ctx context.Context, pool *datav1alpha1.TierPool) (nodeSelection, error) {
	var sel nodeSelection
	nodes := &corev1.NodeList{}
	// An empty selector selects every node.
	if err := r.Client.List(ctx, nodes, client.MatchingLabels(pool.Spec.NodeSelector)); err != nil {
		return sel, fmt.Errorf("listing nodes for TierPool %s: %w", pool.Name, err)
	}
	for i := range nodes.Items {
		node := &nodes.Items[i]
		if !node.DeletionTimestamp.IsZero() {
			continue
		}
		sel.matching++
		if taint := untoleratedTaint(node.Spec.Taints, pool.Spec.Tolerations); taint != nil {
			if sel.untolerated == nil {
				sel.untolerated = taint
			}
			continue
		}
		sel.schedulable = append(sel.schedulable, node.Name)
	}
	return sel, nil
}

// observeWorkers reads the pool's worker DaemonSet, when the operator deploys one.
func (r *TierPoolReconciler) observeWorkers(ctx context.Context, pool *datav1alpha1.TierPool) (workerObservation, error) {
	obs := workerObservation{deployed: r.Workers.Deployed(), namespace: r.Workers.Namespace}
	// A pool whose name cannot label pods has no DaemonSet either.
	if !obs.deployed || workerNameProblem(pool.Name) != "" {
		return obs, nil
	}
	ds := &appsv1.DaemonSet{}
	key := client.ObjectKey{Namespace: r.Workers.Namespace, Name: WorkerName(pool.Name)}
	if err := r.Client.Get(ctx, key, ds); err != nil {
		if apierrors.IsNotFound(err) {
			return obs, nil
		}
		return obs, fmt.Errorf("reading the worker DaemonSet %s of TierPool %s: %w", key, pool.Name, err)
	}
	obs.found = true
	obs.desired = ds.Status.DesiredNumberScheduled
	obs.ready = ds.Status.NumberReady
	return obs, nil
}

// SetupWithManager registers the reconciler: it runs on changes to a TierPool's spec, on Nodes
// coming, going or changing labels or taints, and on the pool's workers becoming ready or not.
func (r *TierPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("tierpool").
		// Status writes (our own) bump no generation and need no reconcile.
		For(&datav1alpha1.TierPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Node{},
			handler.EnqueueRequestsFromMapFunc(r.tierPoolsForNode),
			builder.WithPredicates(nodeSchedulingChanged()))
	if r.Workers.Deployed() {
		b = b.Owns(&appsv1.DaemonSet{}, builder.WithPredicates(workerReadinessChanged()))
	}
	if r.Forgetter != nil {
		if err := mgr.Add(manager.RunnableFunc(r.sweepOrphans)); err != nil {
			return fmt.Errorf("adding the sweep of deleted TierPools' workers: %w", err)
		}
	}
	return b.Complete(r)
}

// tierPoolsForNode maps a Node event to every TierPool: whether the node matched a pool's
// selector before the change is not known here, so each pool recounts.
func (r *TierPoolReconciler) tierPoolsForNode(ctx context.Context, _ client.Object) []reconcile.Request {
	pools := &datav1alpha1.TierPoolList{}
	if err := r.Client.List(ctx, pools); err != nil {
		// The cache lists from memory; failing here means the manager is stopping.
		ctrl.LoggerFrom(ctx).Error(err, "listing TierPools to map a Node event")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(pools.Items))
	for _, p := range pools.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	}
	return reqs
}

// workerReadinessChanged lets through DaemonSet creations and deletions, and the status updates
// that change what the pool's status shows: how many workers are wanted and how many are ready.
func workerReadinessChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			oldDS, okOld := e.ObjectOld.(*appsv1.DaemonSet)
			newDS, okNew := e.ObjectNew.(*appsv1.DaemonSet)
			if !okOld || !okNew {
				return true
			}
			return oldDS.Status.NumberReady != newDS.Status.NumberReady ||
				oldDS.Status.DesiredNumberScheduled != newDS.Status.DesiredNumberScheduled
		},
	}
}

// nodeSchedulingChanged lets through Node creations and deletions, and the updates that can
// change which pools select a node: its labels, taints or deletion. Kubelets update Node status
// often; those updates are dropped.
func nodeSchedulingChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			oldNode, okOld := e.ObjectOld.(*corev1.Node)
			newNode, okNew := e.ObjectNew.(*corev1.Node)
			if !okOld || !okNew {
				return true
			}
			return !apiequality.Semantic.DeepEqual(oldNode.Labels, newNode.Labels) ||
				!apiequality.Semantic.DeepEqual(oldNode.Spec.Taints, newNode.Spec.Taints) ||
				oldNode.DeletionTimestamp.IsZero() != newNode.DeletionTimestamp.IsZero()
		},
	}
}
