//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The master's storage changed after install (master.persistence), as a user's `helm upgrade
// --set` changes it: from the emptyDir of the Kind values onto claims, then to a size the
// cluster cannot give, then back. The Kind cluster provisions no volume, and its class allows no
// expansion: the spec makes the replicas' volumes itself (hostPath, one folder per replica on
// every node, each volume bound ahead to its replica's claim). A pipeline's output, which
// exists nowhere but in a worker's memory and the master's records, is read after each change:
// the replicas, rolled one at a time, kept the group's state. Not in smoke: it rolls the master
// three times.
var _ = Describe("The master's storage", Ordered, Label("master-storage"), func() {
	var (
		namespace string
		nodes     []string
		written   []object
	)
	const (
		class  = "standard" // the Kind node image's class: provisions nothing, allows no expansion
		folder = "/var/lib/strata-e2e-master"
	)
	install := func(values ...string) {
		GinkgoHelper()
		helm(append([]string{"upgrade", "--install", releaseName, "../charts/strata", "--values", "../hack/kind/strata-values.yaml",
			"--set", "image.tag=" + imageTag, "--wait", "--timeout", "5m"}, values...)...)
	}
	claimName := func(i int) string { return fmt.Sprintf("data-%s-%d", masterName, i) }
	statefulSet := func(ctx context.Context, g Gomega) *appsv1.StatefulSet {
		sts := &appsv1.StatefulSet{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: masterName}, sts)).To(Succeed())
		return sts
	}
	// rolled waits until the StatefulSet (made anew or not) runs three ready replicas of its
	// current template, and returns it.
	rolled := func(ctx context.Context, what string) *appsv1.StatefulSet {
		GinkgoHelper()
		var sts *appsv1.StatefulSet
		Eventually(func(g Gomega) {
			sts = statefulSet(ctx, g)
			g.Expect(sts.DeletionTimestamp).To(BeNil())
			g.Expect(sts.Status.ObservedGeneration).To(Equal(sts.Generation))
			g.Expect(sts.Status.UpdateRevision).To(Equal(sts.Status.CurrentRevision))
			g.Expect(sts.Status.UpdatedReplicas).To(Equal(int32(3)))
			g.Expect(sts.Status.ReadyReplicas).To(Equal(int32(3)))
		}).WithContext(ctx).WithTimeout(8*minute).Should(Succeed(), what)
		return sts
	}
	event := func(ctx context.Context, reason, text string) {
		GinkgoHelper()
		Eventually(func(g Gomega) []string {
			var events corev1.EventList
			g.Expect(k8sClient.List(ctx, &events, client.InNamespace(strataNamespace))).To(Succeed())
			var found []string
			for _, e := range events.Items {
				if e.InvolvedObject.Kind == "StatefulSet" && e.InvolvedObject.Name == masterName && e.Reason == reason {
					found = append(found, e.Message)
				}
			}
			return found
		}).WithContext(ctx).WithTimeout(2*minute).Should(ContainElement(ContainSubstring(text)), "waiting for a %s event on StatefulSet %s", reason, masterName)
	}
	claimSizes := func(ctx context.Context) []string {
		GinkgoHelper()
		var sizes []string
		for i := range 3 {
			pvc := &corev1.PersistentVolumeClaim{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: claimName(i)}, pvc)).To(Succeed())
			size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
			sizes = append(sizes, string(pvc.Status.Phase)+" "+size.String())
		}
		return sizes
	}

	BeforeAll(func(ctx SpecContext) {
		var all corev1.NodeList
		Expect(k8sClient.List(ctx, &all)).To(Succeed())
		for _, n := range all.Items {
			// The master runs as an unprivileged user, and a hostPath volume is not given to its
			// group as a claim's volume would be.
			out, err := exec.CommandContext(ctx, "docker", "exec", n.Name, "sh", "-c",
				fmt.Sprintf("rm -rf %[1]s && mkdir -p %[1]s/0 %[1]s/1 %[1]s/2 && chmod -R 0777 %[1]s", folder)).CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "making the volumes' folders on %s: %s", n.Name, out)
		}
		for i := range 3 {
			pv := &corev1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("e2e-master-data-%d", i)},
				Spec: corev1.PersistentVolumeSpec{
					Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
					AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName:              class,
					PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
					ClaimRef:                      &corev1.ObjectReference{Namespace: strataNamespace, Name: claimName(i)},
					PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
						Path: fmt.Sprintf("%s/%d", folder, i), Type: ptr.To(corev1.HostPathDirectory)}},
				},
			}
			Expect(k8sClient.Create(ctx, pv)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) {
				pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: strataNamespace, Name: claimName(i)}}
				Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pvc))).To(Succeed())
				Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pv))).To(Succeed())
			})
		}
		DeferCleanup(func(ctx SpecContext) {
			// Whatever failed, the master goes back on the Kind values' emptyDir for the specs after.
			install()
			Eventually(func(g Gomega) {
				g.Expect(statefulSet(ctx, g).Spec.VolumeClaimTemplates).To(BeEmpty())
			}).WithContext(ctx).WithTimeout(2 * minute).Should(Succeed())
			rolled(ctx, "waiting for the master back on its emptyDir")
		})
		rolled(ctx, "waiting for the master as installed")

		namespace = testNamespace(ctx, "e2e-master-storage-")
		nodes = cacheNodes(ctx)
		pool := memoryPool(ctx, "mstorage", "4Mi")
		written = copiedOutput(ctx, namespace, pool, "e2e-master-storage", nodes, 5<<20, 7, nil)
		Expect(sumClaim(ctx, namespace, nodes[1], "out")).To(ConsistOf(written))
	})
	AfterEach(func() { dumpOnFailure(strataNamespace, namespace) })

	// outputKept reads the pipeline's output, whose files only the master knows of, from the
	// node that did not write it.
	outputKept := func(ctx context.Context) {
		GinkgoHelper()
		Expect(sumClaim(ctx, namespace, nodes[1], "out")).To(ConsistOf(written))
	}

	It("moves the replicas from an emptyDir onto claims, one at a time, and they form one group again", func(ctx SpecContext) {
		install("--set", "master.persistence.size=1Gi", "--set", "master.persistence.storageClass="+class)
		event(ctx, "StorageSwitched", "from an emptyDir to claims of 1Gi")
		Eventually(func(g Gomega) {
			g.Expect(statefulSet(ctx, g).Spec.VolumeClaimTemplates).To(HaveLen(1))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the StatefulSet made anew with claims")
		sts := rolled(ctx, "waiting for every replica on its claim")
		Expect(sts.Spec.Template.Spec.Volumes).NotTo(ContainElement(HaveField("Name", "data")), "the claim is the data volume")
		Expect(claimSizes(ctx)).To(Equal([]string{"Bound 1Gi", "Bound 1Gi", "Bound 1Gi"}))
		for i := range 3 {
			pod := &corev1.Pod{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: fmt.Sprintf("%s-%d", masterName, i)}, pod)).To(Succeed())
			Expect(pod.Spec.Volumes).To(ContainElement(HaveField("PersistentVolumeClaim.ClaimName", claimName(i))))
		}
		outputKept(ctx)
	})

	It("says why it cannot expand claims whose class allows no expansion, and keeps them", func(ctx SpecContext) {
		install("--set", "master.persistence.size=2Gi", "--set", "master.persistence.storageClass="+class)
		event(ctx, "StorageNotExpanded", "allowVolumeExpansion: true")
		Expect(claimSizes(ctx)).To(Equal([]string{"Bound 1Gi", "Bound 1Gi", "Bound 1Gi"}))
		sts := rolled(ctx, "waiting for the master, which keeps its claims")
		Expect(sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests).To(HaveKeyWithValue(corev1.ResourceStorage, resource.MustParse("1Gi")))
		outputKept(ctx)
	})

	It("moves them back onto an emptyDir, leaving the claims for the user to delete", func(ctx SpecContext) {
		install()
		event(ctx, "StorageSwitched", "from claims to an emptyDir")
		Eventually(func(g Gomega) {
			g.Expect(statefulSet(ctx, g).Spec.VolumeClaimTemplates).To(BeEmpty())
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the StatefulSet made anew on an emptyDir")
		sts := rolled(ctx, "waiting for every replica on its emptyDir")
		Expect(sts.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("EmptyDir", Not(BeNil()))))
		for i := range 3 {
			err := k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: claimName(i)}, &corev1.PersistentVolumeClaim{})
			Expect(apierrors.IsNotFound(err)).To(BeFalse(), "claim %s stays", claimName(i))
		}
		outputKept(ctx)
	})
})
