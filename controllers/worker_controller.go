package controllers

import (
	"context"
	"fmt"
	"maps"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// Reasons of the Events the worker reconciler records on a TierPool.
const (
	// EventReasonCreated is recorded when a worker object of the pool is created.
	EventReasonCreated = "Created"
	// EventReasonUpdated is recorded when a worker object of the pool is changed back to, or on
	// to, what the pool says.
	EventReasonUpdated = "Updated"
	// EventReasonApplyFailed is recorded when a worker object cannot be written.
	EventReasonApplyFailed = "ApplyFailed"
	// EventReasonInvalidName is recorded when the pool's name cannot label its workers.
	EventReasonInvalidName = "InvalidName"
)

// WorkerReconciler deploys, for each TierPool, a ConfigMap with the pool's tiers and a DaemonSet
// of workers on the pool's nodes, and heals them: a deleted object is recreated and a changed
// one is put back as the pool says. Both are owned by the pool, so they go away with it.
type WorkerReconciler struct {
	Client client.Client
	// Recorder records Events on TierPools.
	Recorder record.EventRecorder
	Spec     WorkerSpec
}

// +kubebuilder:rbac:groups=data.strata.dev,resources=tierpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=data.strata.dev,resources=tierpools/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,namespace=strata-system,resources=daemonsets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=strata-system,resources=configmaps,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=strata-system,resources=secrets,verbs=get;create;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=data.strata.dev,resources=datasets;cachepolicies;lineages,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile makes the worker objects of one TierPool match its spec.
func (r *WorkerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &datav1alpha1.TierPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		// Gone: the garbage collector removes what the pool owned.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("namespace", r.Spec.Namespace, "name", WorkerName(pool.Name))

	if problem := workerNameProblem(pool.Name); problem != "" {
		// Retrying cannot help; the pool's status says the same.
		log.Info("not deploying the pool's workers", "reason", problem)
		r.Recorder.Event(pool, corev1.EventTypeWarning, EventReasonInvalidName, problem)
		return ctrl.Result{}, nil
	}

	tiers, err := tiersFile(pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	lineages := &namespaceLineages{client: r.Client}
	policies, err := r.policiesFile(ctx, pool, lineages)
	if err != nil {
		return ctrl.Result{}, err
	}
	// The ConfigMap first: the pods of a new DaemonSet mount it.
	wantConfigMap := r.Spec.configMap(pool, tiers, policies)
	if err := r.apply(ctx, pool, "ConfigMap", &corev1.ConfigMap{ObjectMeta: keyOnly(wantConfigMap.ObjectMeta)}, func(obj client.Object) {
		mutateConfigMap(obj.(*corev1.ConfigMap), wantConfigMap)
	}); err != nil {
		return ctrl.Result{}, err
	}
	// Before the operator served the checkpoint settings, it pooled the outputs' keys of every
	// namespace in a Secret of the pool: remove it.
	legacy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.Spec.Namespace, Name: WorkerName(pool.Name)}}
	if err := r.Client.Delete(ctx, legacy); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("deleting the former checkpoint Secret %s/%s: %w", legacy.Namespace, legacy.Name, err)
	}
	wantDaemonSet := r.Spec.daemonSet(pool, tiers)
	if err := r.apply(ctx, pool, "DaemonSet", &appsv1.DaemonSet{ObjectMeta: keyOnly(wantDaemonSet.ObjectMeta)}, func(obj client.Object) {
		mutateDaemonSet(obj.(*appsv1.DaemonSet), wantDaemonSet)
	}); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// apply creates obj, or updates it when mutate changes it, with the pool as its controller.
// obj holds the key only; mutate copies in the fields the operator owns.
func (r *WorkerReconciler) apply(ctx context.Context, pool *datav1alpha1.TierPool, kind string, obj client.Object,
	mutate func(client.Object),
) error {
	key := client.ObjectKeyFromObject(obj)
	var readVersion string
	result, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
		readVersion = obj.GetResourceVersion()
		mutate(obj)
		if err := controllerutil.SetControllerReference(pool, obj, r.Client.Scheme()); err != nil {
			return fmt.Errorf("making TierPool %s the controller of %s %s: %w", pool.Name, kind, key, err)
		}
		return nil
	})
	if err != nil {
		// A conflict is someone else's concurrent write: the retry reads it and tells no one.
		if !apierrors.IsConflict(err) {
			r.Recorder.Eventf(pool, corev1.EventTypeWarning, EventReasonApplyFailed, "writing %s %s: %v", kind, key, err)
		}
		return fmt.Errorf("applying %s %s of TierPool %s: %w", kind, key, pool.Name, err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("kind", kind, "object", key)
	switch {
	case result == controllerutil.OperationResultCreated:
		log.Info("worker object created")
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, EventReasonCreated, "created %s %s", kind, key)
	// An update the server found to change nothing keeps the resource version: no news.
	case result == controllerutil.OperationResultUpdated && obj.GetResourceVersion() != readVersion:
		log.Info("worker object updated")
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, EventReasonUpdated, "updated %s %s to match the TierPool", kind, key)
	}
	return nil
}

// keyOnly is the name and namespace of meta, for CreateOrUpdate to read the object into.
func keyOnly(meta metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: meta.Name, Namespace: meta.Namespace}
}

// mutateConfigMap copies into current the fields of want that the operator owns.
func mutateConfigMap(current, want *corev1.ConfigMap) {
	current.Labels = mergeStrings(current.Labels, want.Labels)
	current.Data = want.Data
}

// mutateDaemonSet copies into current, read from the server, the fields of want that the
// operator owns. Pod-template labels and annotations of others (such as the restart time of
// `kubectl rollout restart`) are kept: removing them would roll the pods once more.
func mutateDaemonSet(current, want *appsv1.DaemonSet) {
	current.Labels = mergeStrings(current.Labels, want.Labels)
	if current.CreationTimestamp.IsZero() {
		// Immutable after creation.
		current.Spec.Selector = want.Spec.Selector
	}
	current.Spec.UpdateStrategy = want.Spec.UpdateStrategy
	template := *want.Spec.Template.DeepCopy()
	template.Labels = mergeStrings(current.Spec.Template.Labels, template.Labels)
	template.Annotations = mergeStrings(current.Spec.Template.Annotations, template.Annotations)
	current.Spec.Template = template
}

// mergeStrings returns base with the entries of over added or replaced.
func mergeStrings(base, over map[string]string) map[string]string {
	merged := make(map[string]string, len(base)+len(over))
	maps.Copy(merged, base)
	maps.Copy(merged, over)
	return merged
}

// SetupWithManager registers the reconciler: it runs on changes to a TierPool's spec and on
// changes to, or the deletion of, the objects a pool owns.
func (r *WorkerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("worker").
		For(&datav1alpha1.TierPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// The DaemonSet controller writes status often; only spec and label changes can need
		// putting back.
		Owns(&appsv1.DaemonSet{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Owns(&corev1.ConfigMap{}).
		// The pool's policies follow its Datasets, their CachePolicies and the Lineages (MRD's
		// next uses). Its checkpoint settings are made when a worker asks (CheckpointsHandler).
		Watches(&datav1alpha1.Dataset{}, handler.EnqueueRequestsFromMapFunc(poolOfDataset),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A CachePolicy may be named by the claims of any pool, besides the namespace's Datasets.
		Watches(&datav1alpha1.CachePolicy{}, handler.EnqueueRequestsFromMapFunc(r.allPools),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&datav1alpha1.Lineage{}, handler.EnqueueRequestsFromMapFunc(r.poolsOfNamespace)).
		// A prefetch pins what it loaded while it lasts.
		Watches(&datav1alpha1.DataLoad{}, handler.EnqueueRequestsFromMapFunc(r.poolsOfNamespace),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[prefetchLabel] != "" }))).
		// And the claims' volumes that name a CachePolicy.
		Watches(&corev1.PersistentVolume{}, handler.EnqueueRequestsFromMapFunc(poolOfVolume),
			builder.WithPredicates(predicate.NewPredicateFuncs(provisionedByStrata))).
		// The replication scopes follow the nodes' labels (see topology).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allPools),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Complete(r)
}

// poolOfVolume maps a provisioned volume to its TierPool, whose policies file lists it.
func poolOfVolume(_ context.Context, obj client.Object) []reconcile.Request {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.VolumeAttributes[datav1alpha1.VolumeAttributePool] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: pv.Spec.CSI.VolumeAttributes[datav1alpha1.VolumeAttributePool]}}}
}

// allPools are every TierPool: a node's labels may bound the replicas of any.
func (r *WorkerReconciler) allPools(ctx context.Context, _ client.Object) []reconcile.Request {
	var pools datav1alpha1.TierPoolList
	if err := r.Client.List(ctx, &pools); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(pools.Items))
	for _, p := range pools.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
	}
	return reqs
}
