//go:build e2e

package e2e

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// A step's pod is evicted mid-write on its first run, on a node that stays up, as a drain or a
// preemption does: its Job retries it on the same node, the retry writes the same paths again
// (before, the killed pod's files, sealed when it exited, made the retry fail with EEXIST and
// the Lineage JobFailed), and the output is exactly what the retry wrote.
var _ = Describe("A step whose pod is evicted mid-write", Ordered, Label("smoke", "lineage", "attempts"), func() {
	var (
		namespace, pool string
		nodes           []string
		written         []object
	)

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-attempts-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "attempts", "4Mi")
		written = chainInput(ctx, namespace, pool, nodes[1], "e2e-attempts")
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("is retried by its Job, and the output holds every byte of the retry and nothing of the evicted pod", func(ctx SpecContext) {
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "copied", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "copy"}, TierPoolName: pool},
		})).To(Succeed())
		step := copyLineage(namespace, "copy", "raw", "copied", nodes[0], true)
		// Slowly, so that it is evicted half way; and with no retry for a failure of its own
		// (backoffLimit 0): only a disruption is retried.
		step.Spec.Template.Spec.Template.Spec.Containers[0].Args = []string{"copy", "--rate", "4194304", "--progress", "4194304", "/data", "/out"}
		Expect(k8sClient.Create(ctx, step)).To(Succeed())

		By("evicting the step's pod once it has written 4 MiB")
		var first corev1.Pod
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{"data.strata.dev/lineage": "copy"})).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(1))
			first = pods.Items[0]
			g.Expect(first.Status.Phase).To(Equal(corev1.PodRunning))
			g.Expect(podLogs(ctx, &first)).To(ContainSubstring("copied 4194304 bytes"))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the step to have written 4 MiB")
		Expect(first.Finalizers).To(ContainElement("data.strata.dev/attempt"), "the pod is held until what it wrote is settled")
		Expect(k8sClient.SubResource("eviction").Create(ctx, &first, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: first.Name, Namespace: namespace},
		})).To(Succeed())

		By("the Job retries it, and the Lineage is written")
		waitLineage(ctx, namespace, "copy", "Written")
		var pods corev1.PodList
		Expect(k8sClient.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{"data.strata.dev/lineage": "copy"})).To(Succeed())
		var retries []string
		for _, p := range pods.Items {
			if p.UID != first.UID {
				retries = append(retries, p.Name)
				Expect(p.Spec.NodeName).To(Equal(nodes[0]), "the retry wrote on the same node")
			}
		}
		Expect(retries).To(HaveLen(1), "one retry")
		var job batchv1.Job
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "copy-run"}, &job)).To(Succeed())
		Expect(job.Status.Succeeded).To(BeEquivalentTo(1))

		By("the operator discarded what the evicted pod wrote, and let both pods go")
		var events corev1.EventList
		Expect(k8sClient.List(ctx, &events, client.InNamespace(namespace))).To(Succeed())
		discarded := false
		for _, e := range events.Items {
			if e.Reason == "AttemptDiscarded" && strings.Contains(e.Message, first.Name) {
				discarded = true
			}
		}
		Expect(discarded).To(BeTrue(), "an AttemptDiscarded event names the evicted pod")
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{"data.strata.dev/lineage": "copy"})).To(Succeed())
			for _, p := range pods.Items {
				g.Expect(p.Finalizers).NotTo(ContainElement("data.strata.dev/attempt"), "pod %s", p.Name)
			}
		}).WithContext(ctx).WithTimeout(minute).Should(Succeed())

		By("a pod on the other node reads exactly the input")
		Expect(sumClaim(ctx, namespace, nodes[1], "copied")).To(Equal(contents(written)))
	})
})
