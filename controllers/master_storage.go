package controllers

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Reasons of the events about the master's storage, on its StatefulSet.
const (
	ReasonMasterStorageExpanded      = "StorageExpanded"
	ReasonMasterStorageNotExpanded   = "StorageNotExpanded"
	ReasonMasterStorageChangeRefused = "StorageChangeRefused"
)

// storageRetry is how long before the operator tries again a change of the master's storage
// that the cluster refused (a StorageClass may be given allowVolumeExpansion meanwhile).
const storageRetry = 5 * time.Minute

// masterDataClaim is the StatefulSet's claim template for the replicas' data, nil when they
// keep it in an emptyDir.
func masterDataClaim(sts *appsv1.StatefulSet) *corev1.PersistentVolumeClaim {
	for i := range sts.Spec.VolumeClaimTemplates {
		if sts.Spec.VolumeClaimTemplates[i].Name == masterDataVolume {
			return &sts.Spec.VolumeClaimTemplates[i]
		}
	}
	return nil
}

func claimSize(c *corev1.PersistentVolumeClaim) resource.Quantity {
	return c.Spec.Resources.Requests[corev1.ResourceStorage]
}

// reconcileStorage carries out a change of the master's storage (master.persistence) that the
// StatefulSet cannot take itself: its claim templates never change after it is made. It returns
// whether the StatefulSet may be updated now (false while the old one goes) and when to look
// again. A refused change leaves the StatefulSet's other fields to be updated (an image, a
// replica count), with its storage as it is.
//
//   - A larger size expands every replica's claim (which their StorageClass must allow), then
//     makes the StatefulSet anew with the new size for replicas to come; its pods keep running
//     (deleted with the orphan policy, the new StatefulSet adopts them, and its template is the
//     same, so nothing rolls).
//   - A smaller size or another StorageClass is refused, said in an event, and the replicas
//     keep their claims: a claim cannot shrink nor move to another class.
//   - A change between an emptyDir and claims is refused too. Kubernetes cannot change the
//     volumes of a running pod: a StatefulSet made anew with claims stops at its first pod,
//     whose update the API server refuses, and goes no further (tried on Kind). The event says
//     how: a backup, and a new install restored from it.
func (r *MasterReconciler) reconcileStorage(ctx context.Context, desired *appsv1.StatefulSet) (bool, time.Duration, error) {
	cur := &appsv1.StatefulSet{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(desired), cur); apierrors.IsNotFound(err) {
		return true, 0, nil
	} else if err != nil {
		return false, 0, fmt.Errorf("reading StatefulSet %s/%s: %w", desired.Namespace, desired.Name, err)
	}
	if cur.DeletionTimestamp != nil {
		// Made anew once the garbage collector has let its pods go (orphan deletion).
		return false, time.Second, nil
	}
	have, want := masterDataClaim(cur), masterDataClaim(desired)
	log := ctrl.LoggerFrom(ctx).WithValues("statefulset", cur.Name)
	switch {
	case have == nil && want == nil:
		return true, 0, nil
	case (have == nil) != (want == nil):
		from, to := "an emptyDir", "claims of "+r.Spec.StorageSize.String()
		if want == nil {
			from, to = "claims", "an emptyDir"
		}
		r.event(cur, corev1.EventTypeWarning, ReasonMasterStorageChangeRefused, fmt.Sprintf(
			"master.persistence changed from %s to %s after install: the replicas keep %s, since a running replica's volume cannot change in place. "+
				"To move them, take a backup (`kubectl strata backup`, with master.backup set), uninstall, and install with the new master.persistence "+
				"and master.backup.restoreFrom (docs/upgrade.md); or set master.persistence back",
			from, to, from))
		keepStorage(desired, cur)
		return true, storageRetry, nil
	}
	haveSize, wantSize := claimSize(have), claimSize(want)
	switch {
	case ptr.Deref(have.Spec.StorageClassName, "") != ptr.Deref(want.Spec.StorageClassName, ""):
		r.event(cur, corev1.EventTypeWarning, ReasonMasterStorageChangeRefused, fmt.Sprintf(
			"master.persistence.storageClass changed from %q to %q: a claim cannot move to another StorageClass, so the replicas keep theirs. "+
				"To move the master, take a backup (master.backup), and install anew with master.backup.restoreFrom (docs/upgrade.md)",
			ptr.Deref(have.Spec.StorageClassName, ""), ptr.Deref(want.Spec.StorageClassName, "")))
		return true, storageRetry, nil
	case wantSize.Cmp(haveSize) < 0:
		r.event(cur, corev1.EventTypeWarning, ReasonMasterStorageChangeRefused, fmt.Sprintf(
			"master.persistence.size %s is smaller than the replicas' claims of %s: a claim cannot shrink, so they keep %s; set it back to %s or more",
			wantSize.String(), haveSize.String(), haveSize.String(), haveSize.String()))
		return true, storageRetry, nil
	case wantSize.Cmp(haveSize) == 0:
		return true, 0, nil
	}
	if err := r.expandClaims(ctx, cur, wantSize); err != nil {
		msg := fmt.Sprintf("cannot expand the master's claims to master.persistence.size %s, so the replicas keep %s: %v. "+
			"Allow volume expansion in their StorageClass (allowVolumeExpansion: true) and the operator tries again, or set the size back to %s",
			wantSize.String(), haveSize.String(), err, haveSize.String())
		log.Info(msg)
		r.event(cur, corev1.EventTypeWarning, ReasonMasterStorageNotExpanded, msg)
		return true, storageRetry, nil
	}
	msg := fmt.Sprintf("expanded the claims of every replica to %s (the volumes grow as their CSI driver resizes them); "+
		"making StatefulSet %s anew so that new replicas get %s too, its pods left running", wantSize.String(), cur.Name, wantSize.String())
	log.Info(msg)
	r.event(cur, corev1.EventTypeNormal, ReasonMasterStorageExpanded, msg)
	return false, time.Second, r.remake(ctx, cur)
}

// expandClaims asks for size on every replica's data claim that asks for less.
func (r *MasterReconciler) expandClaims(ctx context.Context, sts *appsv1.StatefulSet, size resource.Quantity) error {
	for i := range ptr.Deref(sts.Spec.Replicas, 0) {
		key := client.ObjectKey{Namespace: sts.Namespace, Name: fmt.Sprintf("%s-%s-%d", masterDataVolume, sts.Name, i)}
		pvc := &corev1.PersistentVolumeClaim{}
		if err := r.Client.Get(ctx, key, pvc); apierrors.IsNotFound(err) {
			continue // a replica not started yet gets the size from the new template
		} else if err != nil {
			return fmt.Errorf("reading claim %s: %w", key.Name, err)
		}
		if have := claimSize(pvc); have.Cmp(size) >= 0 {
			continue
		}
		patch := client.MergeFrom(pvc.DeepCopy())
		pvc.Spec.Resources.Requests[corev1.ResourceStorage] = size
		if err := r.Client.Patch(ctx, pvc, patch); err != nil {
			return fmt.Errorf("claim %s: %w", key.Name, err)
		}
	}
	return nil
}

// keepStorage makes desired keep cur's data volume, an emptyDir or a claim of its templates
// (which an update leaves as they are), whatever the spec says now.
func keepStorage(desired, cur *appsv1.StatefulSet) {
	volumes := desired.Spec.Template.Spec.Volumes[:0:0]
	for _, v := range desired.Spec.Template.Spec.Volumes {
		if v.Name != masterDataVolume {
			volumes = append(volumes, v)
		}
	}
	for _, v := range cur.Spec.Template.Spec.Volumes {
		if v.Name == masterDataVolume {
			volumes = append(volumes, v)
		}
	}
	desired.Spec.Template.Spec.Volumes = volumes
	desired.Spec.VolumeClaimTemplates = cur.Spec.VolumeClaimTemplates
}

// remake deletes the StatefulSet and leaves its pods and claims (orphan): the next reconcile
// makes it anew, and the new one adopts them.
func (r *MasterReconciler) remake(ctx context.Context, sts *appsv1.StatefulSet) error {
	err := r.Client.Delete(ctx, sts, client.PropagationPolicy(metav1.DeletePropagationOrphan), client.Preconditions{UID: &sts.UID})
	if client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting StatefulSet %s/%s, its pods left running, to make it anew: %w", sts.Namespace, sts.Name, err)
	}
	return nil
}

func (r *MasterReconciler) event(obj client.Object, kind, reason, msg string) {
	if r.Recorder != nil {
		r.Recorder.Event(obj, kind, reason, msg)
	}
}
