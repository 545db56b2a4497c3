package controllers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// The StorageClass parameters the provisioner takes.
const (
	// ParameterTierPool names the TierPool whose workers hold the volumes; "default" if absent.
	ParameterTierPool = "tierPool"
	// ParameterCachePolicy names the CachePolicy, of each claim's namespace, that the volumes
	// follow (their replication); a claim's annotation data.strata.dev/cache-policy names
	// another. Without one, a volume's files live in the memory of the node that wrote them
	// alone, and a node's loss loses them: nothing recomputes them.
	ParameterCachePolicy = "cachePolicyName"
)

// Annotations of dynamic provisioning, as Kubernetes' external provisioners use them.
const (
	annProvisionedBy = "pv.kubernetes.io/provisioned-by"
	annSelectedNode  = "volume.kubernetes.io/selected-node"
)

// Reasons of the provisioner's events, as external provisioners name them.
const (
	ReasonProvisioningFailed    = "ProvisioningFailed"
	ReasonProvisioningSucceeded = "ProvisioningSucceeded"
	ReasonVolumeFailedDelete    = "VolumeFailedDelete"
	// ReasonNotReplicated warns that a provisioned volume has no copy but the writer's.
	ReasonNotReplicated = "NotReplicated"
)

// provisionRetry is how soon a claim whose StorageClass or TierPool is wrong is looked at again.
const provisionRetry = 30 * time.Second

// ProvisionerReconciler provisions output volumes for the PersistentVolumeClaims of Strata's
// StorageClasses (provisioner csi.strata.dev), with the semantics of CSI's CreateVolume and
// DeleteVolume: one PersistentVolume per claim, named after the claim's UID so that a retry
// finds it, bound to the claim; once the claim is gone, a volume whose reclaim policy is Delete
// loses its files at the master (the workers then drop its blocks) and is deleted, and one
// whose policy is Retain is left, data and all, for an administrator.
//
// A provisioned volume is an output like a Lineage's: writable, written into the memory tier of
// the writer's node, sealed file by file. Its handle is "<namespace>/<claim>/<claim uid>", so
// the node plugin serves it only to pods of the claim's namespace.
type ProvisionerReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// Master, when the operator runs one, forgets the files of deleted volumes.
	Master DatasetMetadata
}

// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile provisions a volume for one claim.
func (r *ProvisionerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, pvc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pvc.Spec.VolumeName != "" || !pvc.DeletionTimestamp.IsZero() || pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName == "" {
		return ctrl.Result{}, nil
	}
	class := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: *pvc.Spec.StorageClassName}, class); err != nil {
		// A class that does not exist is Kubernetes' to report; it may name another provisioner.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if class.Provisioner != CSIDriverName {
		return ctrl.Result{}, nil
	}
	if class.VolumeBindingMode != nil && *class.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer &&
		pvc.Annotations[annSelectedNode] == "" {
		return ctrl.Result{}, nil // the scheduler picks a node first, and annotates the claim
	}
	pv, why, err := r.volumeFor(ctx, pvc, class)
	if err != nil {
		return ctrl.Result{}, err
	}
	if why != "" {
		r.Recorder.Event(pvc, corev1.EventTypeWarning, ReasonProvisioningFailed, why)
		return ctrl.Result{RequeueAfter: provisionRetry}, nil
	}
	if err := r.Client.Create(ctx, pv); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, nil // made by an earlier attempt; Kubernetes binds it
		}
		return ctrl.Result{}, fmt.Errorf("creating PersistentVolume %s for claim %s/%s: %w", pv.Name, pvc.Namespace, pvc.Name, err)
	}
	r.Recorder.Eventf(pvc, corev1.EventTypeNormal, ReasonProvisioningSucceeded,
		"provisioned output volume %s in the memory of TierPool %s's workers", pv.Name, pv.Spec.CSI.VolumeAttributes[datav1alpha1.VolumeAttributePool])
	if why := r.unprotected(ctx, pvc.Namespace, pv.Spec.CSI.VolumeAttributes[datav1alpha1.VolumeAttributeCachePolicy]); why != "" {
		r.Recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonNotReplicated, "volume %s %s, and a node's loss loses what it holds "+
			"(nothing recomputes a claim's files): name a CachePolicy with spec.replication.count of 2 or more, in the StorageClass's "+
			"%s parameter or the claim's annotation %s", pv.Name, why, ParameterCachePolicy, datav1alpha1.AnnotationCachePolicy)
	}
	ctrl.LoggerFrom(ctx).Info("provisioned an output volume", "volume", pv.Name)
	return ctrl.Result{}, nil
}

// unprotected says why a volume that follows the CachePolicy named policy of namespace keeps
// no copy of its files but the writer's, or "" if it keeps copies.
func (r *ProvisionerReconciler) unprotected(ctx context.Context, namespace, policy string) string {
	if policy == "" {
		return "follows no CachePolicy"
	}
	cp := &datav1alpha1.CachePolicy{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: policy}, cp); err == nil && cp.Spec.Replication.Count < 2 {
		return fmt.Sprintf("follows CachePolicy %s, which keeps one copy", policy)
	}
	return ""
}

// volumeFor is the PersistentVolume class provisions for pvc, or why there is none.
func (r *ProvisionerReconciler) volumeFor(ctx context.Context, pvc *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (*corev1.PersistentVolume, string, error) {
	for key := range class.Parameters {
		if key != ParameterTierPool && key != ParameterCachePolicy {
			return nil, fmt.Sprintf("StorageClass %s has parameter %q, which Strata does not know: its parameters are %s and %s",
				class.Name, key, ParameterTierPool, ParameterCachePolicy), nil
		}
	}
	policy := cmp.Or(pvc.Annotations[datav1alpha1.AnnotationCachePolicy], class.Parameters[ParameterCachePolicy])
	if policy != "" {
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: policy}, &datav1alpha1.CachePolicy{}); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Sprintf("the claim's CachePolicy %q (from the annotation %s or the StorageClass's %s parameter) does not exist "+
					"in namespace %s: create it, or name one of `kubectl get cachepolicies -n %s`",
					policy, datav1alpha1.AnnotationCachePolicy, ParameterCachePolicy, pvc.Namespace, pvc.Namespace), nil
			}
			return nil, "", fmt.Errorf("reading CachePolicy %s/%s: %w", pvc.Namespace, policy, err)
		}
	}
	if pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return nil, "Strata volumes are file systems: remove volumeMode: Block", nil
	}
	size, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return nil, "the claim requests no storage: set spec.resources.requests.storage", nil
	}
	poolName := class.Parameters[ParameterTierPool]
	if poolName == "" {
		poolName = "default"
	}
	pool := &datav1alpha1.TierPool{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: poolName}, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("StorageClass %s names TierPool %q, which does not exist: create it, or set the class's %s parameter to one of `kubectl get tierpools`",
				class.Name, poolName, ParameterTierPool), nil
		}
		return nil, "", fmt.Errorf("reading TierPool %s: %w", poolName, err)
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		reclaim = *class.ReclaimPolicy
	}
	modes := pvc.Spec.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: "pvc-" + string(pvc.UID),
			Labels: map[string]string{
				"app.kubernetes.io/part-of": "strata", "app.kubernetes.io/managed-by": "strata-operator",
			},
			Annotations: map[string]string{annProvisionedBy: CSIDriverName},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   modes,
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              class.Name,
			MountOptions:                  class.MountOptions,
			ClaimRef: &corev1.ObjectReference{
				APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver:       CSIDriverName,
				VolumeHandle: pvc.Namespace + "/" + pvc.Name + "/" + string(pvc.UID),
				VolumeAttributes: map[string]string{
					datav1alpha1.VolumeAttributeNamespace: pvc.Namespace,
					datav1alpha1.VolumeAttributeDataset:   pvc.Name,
					datav1alpha1.VolumeAttributeUID:       string(pvc.UID),
					datav1alpha1.VolumeAttributePool:      pool.Name,
					datav1alpha1.VolumeAttributeOutput:    "true",
				},
			}},
			NodeAffinity: poolAffinity(pool),
		},
	}
	if policy != "" {
		pv.Spec.CSI.VolumeAttributes[datav1alpha1.VolumeAttributeCachePolicy] = policy
	}
	return pv, "", nil
}

// SetupWithManager registers the provisioner and the reclaimer of its volumes.
func (r *ProvisionerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("provisioner").
		For(&corev1.PersistentVolumeClaim{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			pvc := o.(*corev1.PersistentVolumeClaim)
			return pvc.Spec.VolumeName == "" && pvc.Spec.StorageClassName != nil && *pvc.Spec.StorageClassName != ""
		}))).
		Complete(r); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("reclaimer").
		For(&corev1.PersistentVolume{}, builder.WithPredicates(predicate.NewPredicateFuncs(provisionedByStrata))).
		Complete(&reclaimer{r})
}

// provisionedByStrata says whether o is a volume the provisioner made.
func provisionedByStrata(o client.Object) bool {
	pv, ok := o.(*corev1.PersistentVolume)
	return ok && pv.Annotations[annProvisionedBy] == CSIDriverName && pv.Spec.CSI != nil && pv.Spec.CSI.Driver == CSIDriverName
}

// reclaimer deletes the provisioned volumes whose claim is gone and whose policy says Delete:
// the provisioner's other half, a controller of its own because it watches volumes.
type reclaimer struct{ *ProvisionerReconciler }

func (r *reclaimer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pv := &corev1.PersistentVolume{}
	if err := r.Client.Get(ctx, req.NamespacedName, pv); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !provisionedByStrata(pv) || pv.Status.Phase != corev1.VolumeReleased ||
		pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || !pv.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	attrs := pv.Spec.CSI.VolumeAttributes
	name := datav1alpha1.MasterDatasetName(attrs[datav1alpha1.VolumeAttributeNamespace], attrs[datav1alpha1.VolumeAttributeDataset], attrs[datav1alpha1.VolumeAttributeUID])
	if strings.Count(name, "/") != 2 || slices.Contains(strings.Split(name, "/"), "") {
		r.Recorder.Eventf(pv, corev1.EventTypeWarning, ReasonVolumeFailedDelete,
			"the volume's attributes do not name its claim (%q): delete it by hand", name)
		return ctrl.Result{}, nil
	}
	if err := forgetAtMaster(ctx, r.Master, name); err != nil {
		r.Recorder.Eventf(pv, corev1.EventTypeWarning, ReasonVolumeFailedDelete,
			"the master could not forget the volume's files (it is kept and deletion retried): %v", err)
		return ctrl.Result{}, fmt.Errorf("volume %s: %w", pv.Name, err)
	}
	if err := r.Client.Delete(ctx, pv); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("deleting PersistentVolume %s: %w", pv.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("deleted a released output volume", "volume", pv.Name)
	return ctrl.Result{}, nil
}
