package controllers

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/policy"
)

var _ = Describe("The provisioner of output volumes", func() {
	var namespace string

	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "outputs-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
	})

	storageClass := func(reclaim corev1.PersistentVolumeReclaimPolicy, params map[string]string) *storagev1.StorageClass {
		class := &storagev1.StorageClass{
			ObjectMeta:    metav1.ObjectMeta{Name: "strata-" + namespace},
			Provisioner:   CSIDriverName,
			Parameters:    params,
			ReclaimPolicy: &reclaim,
		}
		Expect(k8sClient.Create(ctx, class)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, class))).To(Succeed()) })
		return class
	}
	claim := func(name, class string, changes ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				StorageClassName: &class,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
			},
		}
		for _, change := range changes {
			change(pvc)
		}
		Expect(k8sClient.Create(ctx, pvc)).To(Succeed())
		return pvc
	}
	volumeOf := func(pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
		pv := &corev1.PersistentVolume{}
		Eventually(func() error { return k8sClient.Get(ctx, client.ObjectKey{Name: "pvc-" + string(pvc.UID)}, pv) }).
			Should(Succeed(), "waiting for the claim's volume")
		return pv
	}
	release := func(pv *corev1.PersistentVolume) {
		pv.Status.Phase = corev1.VolumeReleased
		Expect(k8sClient.Status().Update(ctx, pv)).To(Succeed())
	}

	It("provisions a writable output volume for a claim of its class, and deletes it once released", func() {
		pool := createPool(map[string]string{"strata.dev/cache": "true"}, nil, memTier("1Gi"))
		class := storageClass(corev1.PersistentVolumeReclaimDelete, map[string]string{ParameterTierPool: pool.Name})
		pvc := claim("scratch", class.Name)

		pv := volumeOf(pvc)
		Expect(pv.Spec.ClaimRef).To(HaveField("UID", pvc.UID))
		Expect(pv.Spec.StorageClassName).To(Equal(class.Name))
		Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimDelete))
		Expect(pv.Spec.AccessModes).To(ConsistOf(corev1.ReadWriteMany))
		Expect(pv.Spec.Capacity.Storage().String()).To(Equal("2Gi"))
		Expect(pv.Spec.CSI.VolumeHandle).To(Equal(namespace + "/scratch/" + string(pvc.UID)))
		Expect(pv.Spec.CSI.VolumeAttributes).To(Equal(map[string]string{
			datav1alpha1.VolumeAttributeNamespace: namespace,
			datav1alpha1.VolumeAttributeDataset:   "scratch",
			datav1alpha1.VolumeAttributeUID:       string(pvc.UID),
			datav1alpha1.VolumeAttributePool:      pool.Name,
			datav1alpha1.VolumeAttributeOutput:    "true",
		}))
		Expect(pv.Spec.NodeAffinity).NotTo(BeNil(), "the volume is served on the pool's nodes")
		Eventually(func() []string { return eventReasons(namespace, pvc.Name) }).Should(ContainElement(ReasonProvisioningSucceeded))
		Eventually(func() []string { return eventMessages(namespace, pvc.Name, ReasonNotReplicated) }).Should(ContainElement(
			ContainSubstring("follows no CachePolicy, and a node's loss loses what it holds")), "the claim says what it risks, and what to do")

		By("deleting the volume once Kubernetes releases it from its deleted claim")
		release(pv)
		// Its protection finalizer keeps it until the kube-controller-manager (absent in
		// envtest) releases it.
		Eventually(func() bool {
			err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pv), pv)
			return apierrors.IsNotFound(err) || (err == nil && !pv.DeletionTimestamp.IsZero())
		}).Should(BeTrue(), "waiting for the released volume to be deleted")
	})

	It("keeps a released volume whose class says Retain", func() {
		pool := createPool(nil, nil, memTier("1Gi"))
		class := storageClass(corev1.PersistentVolumeReclaimRetain, map[string]string{ParameterTierPool: pool.Name})
		pv := volumeOf(claim("kept", class.Name))
		release(pv)
		Consistently(func() error { return k8sClient.Get(ctx, client.ObjectKeyFromObject(pv), pv) }, "2s").Should(Succeed())
	})

	It("says what to fix in the claim's events when the class is wrong, and provisions nothing", func() {
		pool := createPool(nil, nil, memTier("1Gi"))
		block := corev1.PersistentVolumeBlock
		cases := map[string]struct {
			params map[string]string
			change func(*corev1.PersistentVolumeClaim)
			says   string
		}{
			"an unknown parameter":         {params: map[string]string{"replicas": "3"}, says: `parameter "replicas", which Strata does not know`},
			"a TierPool that is not there": {params: map[string]string{ParameterTierPool: "no-such-pool"}, says: `TierPool "no-such-pool", which does not exist`},
			"a CachePolicy that is not there": {params: map[string]string{ParameterTierPool: pool.Name, ParameterCachePolicy: "no-such-policy"},
				says: `CachePolicy "no-such-policy" (from the annotation data.strata.dev/cache-policy or the StorageClass's cachePolicyName parameter) does not exist`},
			"a block volume": {params: map[string]string{ParameterTierPool: pool.Name},
				change: func(pvc *corev1.PersistentVolumeClaim) { pvc.Spec.VolumeMode = &block }, says: "remove volumeMode: Block"},
		}
		i := 0
		for name, tc := range cases {
			By(name)
			i++
			class := &storagev1.StorageClass{
				ObjectMeta:  metav1.ObjectMeta{Name: "strata-" + namespace + "-" + string(rune('a'+i))},
				Provisioner: CSIDriverName, Parameters: tc.params, ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
			}
			Expect(k8sClient.Create(ctx, class)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, class))).To(Succeed()) })
			var changes []func(*corev1.PersistentVolumeClaim)
			if tc.change != nil {
				changes = append(changes, tc.change)
			}
			pvc := claim("bad-"+string(rune('a'+i)), class.Name, changes...)
			Eventually(func() []string { return eventMessages(namespace, pvc.Name, ReasonProvisioningFailed) }).
				Should(ContainElement(ContainSubstring(tc.says)))
			Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "pvc-" + string(pvc.UID)}, &corev1.PersistentVolume{})).
				To(Satisfy(apierrors.IsNotFound))
		}
	})

	It("replicates a claim's volume as the CachePolicy its annotation or its class names says", func() {
		pool := createPool(nil, nil, memTier("1Gi"))
		for name, count := range map[string]int32{"two-copies": 2, "one-copy": 1} {
			Expect(k8sClient.Create(ctx, &datav1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: datav1alpha1.CachePolicySpec{Replication: datav1alpha1.ReplicationSpec{Count: count, Scope: datav1alpha1.ReplicateAnyNode}}})).To(Succeed())
		}
		class := storageClass(corev1.PersistentVolumeReclaimDelete, map[string]string{ParameterTierPool: pool.Name, ParameterCachePolicy: "one-copy"})
		byClass := claim("by-class", class.Name)
		Eventually(func() []string { return eventMessages(namespace, byClass.Name, ReasonNotReplicated) }).Should(ContainElement(
			ContainSubstring("follows CachePolicy one-copy, which keeps one copy")))
		annotated := claim("annotated", class.Name, func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Annotations = map[string]string{datav1alpha1.AnnotationCachePolicy: "two-copies"}
		})
		pv := volumeOf(annotated)
		Expect(pv.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(datav1alpha1.VolumeAttributeCachePolicy, "two-copies"), "the annotation wins over the class")
		Eventually(func() []string { return eventReasons(namespace, annotated.Name) }).Should(ContainElement(ReasonProvisioningSucceeded))
		Consistently(func() []string { return eventReasons(namespace, annotated.Name) }, "1s").ShouldNot(ContainElement(ReasonNotReplicated))

		By("the pool's workers replicate its files: the volume's policy is in the pool's policies file")
		Eventually(func(g Gomega) {
			cm := &corev1.ConfigMap{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: testWorkerSpec.Namespace, Name: WorkerName(pool.Name)}, cm)).To(Succeed())
			set, err := policy.Parse([]byte(cm.Data[policy.FileName]))
			g.Expect(err).NotTo(HaveOccurred())
			r, ok := set.Replication(datav1alpha1.MasterDatasetName(namespace, "annotated", string(annotated.UID)))
			g.Expect(ok).To(BeTrue())
			g.Expect(r.Count).To(Equal(2))
		}).Should(Succeed())
	})

	It("waits for the scheduler's node when the class binds at first use", func() {
		pool := createPool(nil, nil, memTier("1Gi"))
		class := &storagev1.StorageClass{
			ObjectMeta:        metav1.ObjectMeta{Name: "strata-late-" + namespace},
			Provisioner:       CSIDriverName,
			Parameters:        map[string]string{ParameterTierPool: pool.Name},
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		}
		Expect(k8sClient.Create(ctx, class)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, class))).To(Succeed()) })
		pvc := claim("late", class.Name)
		Consistently(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Name: "pvc-" + string(pvc.UID)}, &corev1.PersistentVolume{})
		}, "2s").Should(Satisfy(apierrors.IsNotFound), "no volume before a pod is scheduled")

		By("the scheduler names a node on the claim, as it does for a pod that uses it")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)).To(Succeed())
		pvc.Annotations = map[string]string{annSelectedNode: "node-a"}
		Expect(k8sClient.Update(ctx, pvc)).To(Succeed())
		volumeOf(pvc)
	})

	It("leaves claims of other provisioners alone", func() {
		class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "other-" + namespace}, Provisioner: "example.com/other"}
		Expect(k8sClient.Create(ctx, class)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, class))).To(Succeed()) })
		pvc := claim("theirs", class.Name)
		Consistently(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Name: "pvc-" + string(pvc.UID)}, &corev1.PersistentVolume{})
		}, "2s").Should(Satisfy(apierrors.IsNotFound))
	})
})

// eventMessages are the messages of the events with reason about the object named name in
// namespace.
func eventMessages(namespace, name, reason string) []string {
	events := &corev1.EventList{}
	Expect(k8sClient.List(ctx, events, client.InNamespace(namespace))).To(Succeed())
	var out []string
	for _, e := range events.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}

// eventReasons are the reasons of the events about the object named name in namespace.
func eventReasons(namespace, name string) []string {
	events := &corev1.EventList{}
	Expect(k8sClient.List(ctx, events, client.InNamespace(namespace))).To(Succeed())
	var out []string
	for _, e := range events.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}
