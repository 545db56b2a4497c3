package controllers

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// unboundNamespaceLabel marks the namespaces whose claims the suite's volume binder leaves
// unbound, for the specs that see what waits for a binding.
const unboundNamespaceLabel = "test.strata.dev/no-volume-binder"

// volumeBinder plays the part of kube-controller-manager's volume binder, which envtest does not
// run: a claim made for a volume (spec.volumeName) whose claimRef names the claim is bound to it,
// the two marked Bound, as the binder does for the volume and claim a Dataset is given.
type volumeBinder struct{ client.Client }

func (b *volumeBinder) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := b.Get(ctx, req.NamespacedName, pvc); err != nil || pvc.Spec.VolumeName == "" || pvc.Status.Phase == corev1.ClaimBound {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	ns := &corev1.Namespace{}
	if err := b.Get(ctx, client.ObjectKey{Name: pvc.Namespace}, ns); err != nil || ns.Labels[unboundNamespaceLabel] != "" {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	pv := &corev1.PersistentVolume{}
	if err := b.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv); apierrors.IsNotFound(err) {
		return ctrl.Result{}, nil // the volume's creation brings the claim back
	} else if err != nil {
		return ctrl.Result{}, err
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Namespace != pvc.Namespace || ref.Name != pvc.Name {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, bindClaim(ctx, b.Client, pvc, pv)
}

// bindClaim marks a volume and its claim Bound, as the volume binder does.
func bindClaim(ctx context.Context, c client.Client, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) error {
	pv.Status.Phase = corev1.VolumeBound
	if err := c.Status().Update(ctx, pv); err != nil {
		return err
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.AccessModes = pv.Spec.AccessModes
	pvc.Status.Capacity = pv.Spec.Capacity
	return c.Status().Update(ctx, pvc)
}

// bindByHand binds the claim namespace/name to the volume made for it, as kube-controller-manager
// would, in a namespace the suite's binder leaves alone.
func bindByHand(namespace, name string) {
	GinkgoHelper()
	pvc := &corev1.PersistentVolumeClaim{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pvc)).To(Succeed())
	pv := &corev1.PersistentVolume{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv)).To(Succeed())
	Expect(bindClaim(ctx, k8sClient, pvc, pv)).To(Succeed())
}

func (b *volumeBinder) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("test-volume-binder").
		For(&corev1.PersistentVolumeClaim{}).
		Watches(&corev1.PersistentVolume{}, handler.EnqueueRequestsFromMapFunc(
			func(_ context.Context, obj client.Object) []reconcile.Request {
				ref := obj.(*corev1.PersistentVolume).Spec.ClaimRef
				if ref == nil {
					return nil
				}
				return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}}}
			})).
		Complete(b)
}
