package controllers

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var _ = Describe("A change of the master's storage after install", func() {
	It("expands the claims, and says why it refuses to shrink them, to move them between an emptyDir and claims, or cannot expand them", func() {
		class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "master-disk"}, Provisioner: "disk.example.com",
			AllowVolumeExpansion: ptr.To(true)}
		Expect(k8sClient.Create(ctx, class)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, class)).To(Succeed()) })

		spec := testMasterSpec
		spec.Name = "storage-master" // not the suite's master, which its own reconciler keeps
		events := record.NewFakeRecorder(32)
		r := &MasterReconciler{Client: k8sClient, APIReader: k8sClient, Recorder: events, Spec: spec}
		key := client.ObjectKey{Namespace: spec.Namespace, Name: spec.Name}
		claimKey := func(i int) client.ObjectKey {
			return client.ObjectKey{Namespace: spec.Namespace, Name: fmt.Sprintf("data-%s-%d", spec.Name, i)}
		}
		DeferCleanup(func() {
			sts := &appsv1.StatefulSet{}
			if k8sClient.Get(ctx, key, sts) == nil {
				sts.Finalizers = nil
				Expect(k8sClient.Update(ctx, sts)).To(Succeed())
				Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, sts))).To(Succeed())
			}
			for _, name := range []string{spec.Name, spec.PeersServiceName()} {
				Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: name}}))).To(Succeed())
			}
			for i := range 3 {
				pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: claimKey(i).Name}}
				Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pvc))).To(Succeed())
			}
		})

		reconcile := func() ctrl.Result {
			GinkgoHelper()
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
			Expect(err).NotTo(HaveOccurred())
			return res
		}
		statefulSet := func() *appsv1.StatefulSet {
			GinkgoHelper()
			sts := &appsv1.StatefulSet{}
			Expect(k8sClient.Get(ctx, key, sts)).To(Succeed())
			return sts
		}
		event := func() string {
			GinkgoHelper()
			select {
			case e := <-events.Events:
				return e
			default:
				Fail("no event was recorded")
				return ""
			}
		}
		// remade checks that the StatefulSet is being deleted with its pods left running, does the
		// garbage collector's part (envtest runs none), and reconciles again.
		remade := func() *appsv1.StatefulSet {
			GinkgoHelper()
			old := statefulSet()
			Expect(old.DeletionTimestamp).NotTo(BeNil(), "the StatefulSet is deleted, to be made anew")
			Expect(old.Finalizers).To(ContainElement(metav1.FinalizerOrphanDependents), "its pods are left running")
			Expect(reconcile().RequeueAfter).To(BeNumerically(">", 0), "nothing is made while the old one goes")
			old.Finalizers = nil
			Expect(k8sClient.Update(ctx, old)).To(Succeed())
			Eventually(func() bool { return apierrors.IsNotFound(k8sClient.Get(ctx, key, &appsv1.StatefulSet{})) }).Should(BeTrue())
			reconcile()
			sts := statefulSet()
			Expect(sts.UID).NotTo(Equal(old.UID))
			return sts
		}
		dataVolume := func(sts *appsv1.StatefulSet) *corev1.Volume {
			for i := range sts.Spec.Template.Spec.Volumes {
				if v := &sts.Spec.Template.Spec.Volumes[i]; v.Name == "data" {
					return v
				}
			}
			return nil
		}
		claimSizes := func() []string {
			var sizes []string
			for i := range 3 {
				pvc := &corev1.PersistentVolumeClaim{}
				Expect(k8sClient.Get(ctx, claimKey(i), pvc)).To(Succeed())
				size := claimSize(pvc)
				sizes = append(sizes, size.String())
			}
			return sizes
		}

		By("an emptyDir at first; claims are refused, said why, and the rest of the change is made")
		reconcile()
		sts := statefulSet()
		Expect(masterDataClaim(sts)).To(BeNil())
		Expect(dataVolume(sts)).To(HaveField("EmptyDir", Not(BeNil())))
		r.Spec.StorageSize, r.Spec.StorageClassName, r.Spec.Image = resource.MustParse("1Gi"), class.Name, "strata-cache/master:next"
		Expect(reconcile().RequeueAfter).To(Equal(storageRetry))
		Expect(event()).To(And(ContainSubstring(ReasonMasterStorageChangeRefused), ContainSubstring("from an emptyDir to claims of 1Gi"),
			ContainSubstring("master.backup.restoreFrom")))
		after := statefulSet()
		Expect(after.UID).To(Equal(sts.UID))
		Expect(after.DeletionTimestamp).To(BeNil())
		Expect(masterDataClaim(after)).To(BeNil())
		Expect(dataVolume(after)).To(HaveField("EmptyDir", Not(BeNil())), "the replicas keep their emptyDir")
		Expect(after.Spec.Template.Spec.Containers[0].Image).To(Equal("strata-cache/master:next"))

		By("a master installed with claims, as a fresh install with master.persistence makes it")
		Expect(k8sClient.Delete(ctx, after)).To(Succeed())
		Eventually(func() bool { return apierrors.IsNotFound(k8sClient.Get(ctx, key, &appsv1.StatefulSet{})) }).Should(BeTrue())
		reconcile()
		sts = statefulSet()
		Expect(masterDataClaim(sts).Spec.Resources.Requests).To(HaveKeyWithValue(corev1.ResourceStorage, resource.MustParse("1Gi")))
		Expect(dataVolume(sts)).To(BeNil(), "the claim is the data volume")
		for i := range 3 { // as the StatefulSet controller makes them and their binder binds them
			pvc := masterDataClaim(sts).DeepCopy()
			pvc.ObjectMeta = metav1.ObjectMeta{Namespace: spec.Namespace, Name: claimKey(i).Name}
			Expect(k8sClient.Create(ctx, pvc)).To(Succeed())
			pvc.Status.Phase = corev1.ClaimBound
			Expect(k8sClient.Status().Update(ctx, pvc)).To(Succeed())
		}

		By("a larger size: every claim is expanded, then the StatefulSet is made anew for replicas to come")
		r.Spec.StorageSize = resource.MustParse("2Gi")
		reconcile()
		Expect(event()).To(And(ContainSubstring(ReasonMasterStorageExpanded), ContainSubstring("to 2Gi")))
		Expect(claimSizes()).To(Equal([]string{"2Gi", "2Gi", "2Gi"}))
		sts = remade()
		Expect(masterDataClaim(sts).Spec.Resources.Requests).To(HaveKeyWithValue(corev1.ResourceStorage, resource.MustParse("2Gi")))

		By("a smaller size is refused with why")
		r.Spec.StorageSize = resource.MustParse("1Gi")
		Expect(reconcile().RequeueAfter).To(Equal(storageRetry))
		Expect(event()).To(And(ContainSubstring(ReasonMasterStorageChangeRefused), ContainSubstring("a claim cannot shrink, so they keep 2Gi")))
		after = statefulSet()
		Expect(after.UID).To(Equal(sts.UID))
		Expect(masterDataClaim(after).Spec.Resources.Requests).To(HaveKeyWithValue(corev1.ResourceStorage, resource.MustParse("2Gi")))

		By("a class that does not allow expansion: the claims stay, and the event says how to fix it")
		class.AllowVolumeExpansion = ptr.To(false)
		Expect(k8sClient.Update(ctx, class)).To(Succeed())
		r.Spec.StorageSize = resource.MustParse("3Gi")
		Expect(reconcile().RequeueAfter).To(Equal(storageRetry))
		Expect(event()).To(And(ContainSubstring(ReasonMasterStorageNotExpanded), ContainSubstring("allowVolumeExpansion: true")))
		Expect(claimSizes()).To(Equal([]string{"2Gi", "2Gi", "2Gi"}))
		Expect(statefulSet().DeletionTimestamp).To(BeNil())

		By("an emptyDir instead of the claims is refused: the replicas keep them")
		r.Spec.StorageSize, r.Spec.Image = resource.Quantity{}, "strata-cache/master:later"
		Expect(reconcile().RequeueAfter).To(Equal(storageRetry))
		Expect(event()).To(And(ContainSubstring(ReasonMasterStorageChangeRefused), ContainSubstring("from claims to an emptyDir")))
		after = statefulSet()
		Expect(after.UID).To(Equal(sts.UID))
		Expect(masterDataClaim(after)).NotTo(BeNil())
		Expect(dataVolume(after)).To(BeNil(), "no emptyDir beside the claim")
		Expect(after.Spec.Template.Spec.Containers[0].Image).To(Equal("strata-cache/master:later"))
	})
})
