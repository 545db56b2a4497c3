package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"sync"

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
	// APIReader lists the pool's worker pods, which the operator does not cache; nil leaves the
	// refresh of their policies file to the kubelet's periodic sync.
	APIReader client.Reader
	// Recorder records Events on TierPools.
	Recorder record.EventRecorder
	Spec     WorkerSpec

	markedMu sync.Mutex
	// marked is, by pool, the hash of the policies file its pods were last marked with.
	marked map[string]string
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
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;patch

// Reconcile makes the worker objects of one TierPool match its spec.
func (r *WorkerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &datav1alpha1.TierPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		// Gone: the garbage collector removes what the pool owned.
		if apierrors.IsNotFound(err) {
			r.forgetMarks(req.Name)
		}
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
	if err := r.refreshPolicies(ctx, pool, policies); err != nil {
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

// refreshPolicies marks each worker pod of the pool with the hash of the policies file
// (PoliciesHashAnnotation), so that the kubelet writes the file into the pod now: a changed
// CachePolicy, or a prefetch's pin, applies within the worker's poll of the file instead of
// after the kubelet's next periodic sync. The pods are listed only when the file changed since
// they were last marked (a reconcile that changes nothing reads and writes nothing); a pod
// started since reads the file as it is then.
func (r *WorkerReconciler) refreshPolicies(ctx context.Context, pool *datav1alpha1.TierPool, policies string) error {
	if r.APIReader == nil {
		return nil
	}
	sum := sha256.Sum256([]byte(policies))
	hash := hex.EncodeToString(sum[:8])
	r.markedMu.Lock()
	defer r.markedMu.Unlock()
	if r.marked[pool.Name] == hash {
		return nil
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(r.Spec.Namespace), client.MatchingLabels(workerSelector(pool.Name))); err != nil {
		return fmt.Errorf("listing the worker pods of TierPool %s to refresh their policies file: %w", pool.Name, err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil || pod.Annotations[PoliciesHashAnnotation] == hash {
			continue
		}
		patch := client.MergeFrom(pod.DeepCopy())
		metav1.SetMetaDataAnnotation(&pod.ObjectMeta, PoliciesHashAnnotation, hash)
		if err := r.Client.Patch(ctx, pod, patch); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("marking worker pod %s/%s with the hash of its new policies file: %w", pod.Namespace, pod.Name, err)
		}
	}
	if r.marked == nil {
		r.marked = map[string]string{}
	}
	r.marked[pool.Name] = hash
	return nil
}

// forgetMarks drops what refreshPolicies remembers of a deleted pool.
func (r *WorkerReconciler) forgetMarks(pool string) {
	r.markedMu.Lock()
	defer r.markedMu.Unlock()
	delete(r.marked, pool)
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
