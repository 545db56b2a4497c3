package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// Reasons of a CachePolicy's Ready condition.
const (
	ReasonPolicyAccepted     = "Accepted"
	ReasonInvalidPinnedPaths = "InvalidPinnedPaths"
	// ReasonInvalidTemporaryPaths: a pattern of spec.checkpoint.temporaryPathPatterns does not parse.
	ReasonInvalidTemporaryPaths = "InvalidTemporaryPathPatterns"
)

// CachePolicyReconciler reports on each CachePolicy: whether the workers can apply it, and how
// many Datasets use it. The workers receive it through their pool's policies file (see
// WorkerReconciler); this reconciler only says what becomes of it.
type CachePolicyReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
}

// +kubebuilder:rbac:groups=data.strata.dev,resources=cachepolicies/status,verbs=get;update;patch

// Reconcile sets the status of one CachePolicy.
func (r *CachePolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cp := &datav1alpha1.CachePolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, cp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var datasets datav1alpha1.DatasetList
	if err := r.Client.List(ctx, &datasets, client.InNamespace(cp.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the Datasets of namespace %s: %w", cp.Namespace, err)
	}
	before := cp.DeepCopy()
	cp.Status.Datasets = 0
	for _, ds := range datasets.Items {
		if ds.Spec.CachePolicyName == cp.Name {
			cp.Status.Datasets++
		}
	}
	cp.Status.ObservedGeneration = cp.Generation
	ready := metav1.Condition{Type: datav1alpha1.ConditionReady, ObservedGeneration: cp.Generation,
		Status: metav1.ConditionTrue, Reason: ReasonPolicyAccepted,
		Message: "the workers of its Datasets' pools apply its pinnedPaths, eviction policy (MRD by the Lineages of the namespace), " +
			"watermarks and promotion threshold, " +
			"its checkpoint settings to the outputs with a spec.checkpoint, its replication to the outputs of Lineages " +
			"and its recovery.readWait to their readers; its prefetch settings are not applied yet"}
	if why := pinnedPathsProblem(cp.Spec.PinnedPaths); why != "" {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonInvalidPinnedPaths, why+": fix the pattern; its Datasets are not served until then"
	} else if why := temporaryPatternsProblem(cp.Spec.Checkpoint.TemporaryPathPatterns); why != "" {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonInvalidTemporaryPaths,
			why+": fix the pattern; its outputs are not checkpointed until then, and stay in memory"
	}
	meta.SetStatusCondition(&cp.Status.Conditions, ready)
	if apiequality.Semantic.DeepEqual(before.Status, cp.Status) {
		return ctrl.Result{}, nil
	}
	if err := r.Client.Status().Patch(ctx, cp, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, fmt.Errorf("patching status of CachePolicy %s/%s: %w", cp.Namespace, cp.Name, err)
	}
	if old := meta.FindStatusCondition(before.Status.Conditions, datav1alpha1.ConditionReady); ready.Status == metav1.ConditionFalse &&
		(old == nil || old.Status != ready.Status || old.Message != ready.Message) {
		r.Recorder.Event(cp, corev1.EventTypeWarning, ready.Reason, ready.Message)
	}
	return ctrl.Result{}, nil
}

// SetupWithManager registers the reconciler: on changes of a CachePolicy's spec, and on
// Datasets that come, go or change the policy they name.
func (r *CachePolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("cachepolicy").
		For(&datav1alpha1.CachePolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&datav1alpha1.Dataset{}, handler.EnqueueRequestsFromMapFunc(r.policiesOfNamespace),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// policiesOfNamespace maps a Dataset to every CachePolicy of its namespace: the one it names
// now and the one it may have named before, whose count changes too.
func (r *CachePolicyReconciler) policiesOfNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	var policies datav1alpha1.CachePolicyList
	if err := r.Client.List(ctx, &policies, client.InNamespace(obj.GetNamespace())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing CachePolicies to map an event")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(policies.Items))
	for _, cp := range policies.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&cp)})
	}
	return reqs
}
