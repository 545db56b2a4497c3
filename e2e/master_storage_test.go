//go:build e2e

package e2e

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The master's storage changed after install (master.persistence), as a user's `helm upgrade
// --set` changes it: from the emptyDir of the Kind values to claims, which the operator refuses
// (a running replica's volume cannot change in place) with an event that says how, while the
// master goes on serving with its state: a pipeline's output, which exists nowhere but in a
// worker's memory and the master's records, is read after the change.
var _ = Describe("The master's storage", Ordered, Label("master-storage"), func() {
	var (
		namespace string
		nodes     []string
		written   []object
	)
	statefulSet := func(ctx context.Context, g Gomega) *appsv1.StatefulSet {
		sts := &appsv1.StatefulSet{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: masterName}, sts)).To(Succeed())
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

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-master-storage-")
		nodes = cacheNodes(ctx)
		pool := memoryPool(ctx, "mstorage", "4Mi")
		written = copiedOutput(ctx, namespace, pool, "e2e-master-storage", nodes, 5<<20, 7, nil)
		Expect(sumClaim(ctx, namespace, nodes[1], "out")).To(ConsistOf(written))
	})
	AfterEach(func() { dumpOnFailure(strataNamespace, namespace) })

	It("refuses to move the replicas from their emptyDir onto claims in place, says how, and serves on", func(ctx SpecContext) {
		var before *appsv1.StatefulSet
		Eventually(func(g Gomega) { before = statefulSet(ctx, g) }).WithContext(ctx).Should(Succeed())
		DeferCleanup(func() { installStrata() }) // the Kind values, as the specs after expect them
		installStrata("--set", "master.persistence.size=1Gi", "--set", "master.persistence.storageClass=standard")
		event(ctx, "StorageChangeRefused", "from an emptyDir to claims of 1Gi after install")
		Eventually(func(g Gomega) {
			sts := statefulSet(ctx, g)
			g.Expect(sts.UID).To(Equal(before.UID), "the StatefulSet is not made anew")
			g.Expect(sts.Spec.VolumeClaimTemplates).To(BeEmpty())
			g.Expect(sts.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("EmptyDir", Not(BeNil()))))
			g.Expect(sts.Status.ObservedGeneration).To(Equal(sts.Generation))
			g.Expect(sts.Status.ReadyReplicas).To(Equal(int32(3)))
		}).WithContext(ctx).WithTimeout(2 * minute).Should(Succeed())
		Expect(sumClaim(ctx, namespace, nodes[1], "out")).To(ConsistOf(written), "the master kept its state")
	})
})
