//go:build e2e

package e2e

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// A pipeline whose CachePolicy keeps two copies of its outputs within a rack (the two cache
// nodes are labelled as one rack), with no checkpoint: its outputs are written on one node and
// copied to the other; that node stops, and the next step reads them from the copies, byte
// for byte, with no recomputation (and no checkpoint to read); when the node comes back empty,
// the copies are made again.
var _ = Describe("A replicated pipeline that loses the node holding its outputs", Ordered, Label("smoke", "replication"), func() {
	var (
		namespace, pool string
		nodes           []string
		written         []object
	)
	const rack = datav1alpha1.DefaultRackLabel
	steps := chainSteps

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-replication-")
		nodes = cacheNodes(ctx)
		for _, n := range nodes {
			labelNode(ctx, n, rack, "e2e-rack")
		}
		pool = memoryPool(ctx, "replicas", "4Mi")
		written = chainInput(ctx, namespace, pool, nodes[1], "e2e-replication")
		Expect(k8sClient.Create(ctx, &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "two-copies", Namespace: namespace},
			Spec: datav1alpha1.CachePolicySpec{
				Replication: datav1alpha1.ReplicationSpec{Count: 2, Scope: datav1alpha1.ReplicateSameRack},
				Checkpoint:  datav1alpha1.CheckpointSpec{Strategy: datav1alpha1.CheckpointNone},
			},
		})).To(Succeed())
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	replicas := func(ctx context.Context, g Gomega, name string) int32 {
		var ds datav1alpha1.Dataset
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &ds)).To(Succeed())
		return ds.Status.Replicas
	}

	It("writes the three steps on one node and copies their outputs to the other node of its rack", func(ctx SpecContext) {
		for _, s := range steps {
			Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: s.output, Namespace: namespace},
				Spec: datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: s.name}, TierPoolName: pool,
					CachePolicyName: "two-copies"},
			})).To(Succeed())
			Expect(k8sClient.Create(ctx, copyLineage(namespace, s.name, s.input, s.output, nodes[0], false))).To(Succeed())
		}
		for _, s := range steps {
			waitLineage(ctx, namespace, s.name, "Written")
		}
		Eventually(func(g Gomega) {
			for _, s := range steps {
				g.Expect(replicas(ctx, g, s.output)).To(BeEquivalentTo(2), "output %s", s.output)
				var l datav1alpha1.Lineage
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: s.name}, &l)).To(Succeed())
				g.Expect(l.Status.Outputs).To(HaveExactElements(HaveField("Replicas", BeEquivalentTo(2))))
			}
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for every output to have a copy on both nodes")
	})

	It("reads the outputs from their copies when that node stops, with no recomputation, and copies them again when it is back", func(ctx SpecContext) {
		start := stopNode(ctx, nodes[0])

		By("a pod on " + nodes[1] + " reads the last output while " + nodes[0] + " is down")
		reader := claimPod(namespace, nodes[1], "out-c", "sum", "/data")
		Expect(k8sClient.Create(ctx, reader)).To(Succeed())
		Expect(contents(runLogsWhenDone(ctx, reader))).To(Equal(contents(written)))

		By("once the master knows the node is lost, one copy is left, and no Lineage is recomputed: no output counts as lost")
		Eventually(func(g Gomega) {
			g.Expect(replicas(ctx, g, "out-c")).To(BeEquivalentTo(1), "no other node of the rack to copy to")
		}).WithContext(ctx).WithTimeout(2 * minute).Should(Succeed())
		Consistently(func(g Gomega) {
			var jobs batchv1.JobList
			g.Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace), client.HasLabels{"data.strata.dev/recomputation"})).To(Succeed())
			g.Expect(jobs.Items).To(BeEmpty())
			for _, s := range steps {
				var l datav1alpha1.Lineage
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: s.name}, &l)).To(Succeed())
				g.Expect(l.Status.Recomputations).To(BeZero())
				g.Expect(l.Status.Outputs).To(HaveExactElements(HaveField("State", datav1alpha1.OutputInMemory)))
			}
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())

		By("starting " + nodes[0] + " again: it comes back with an empty memory tier, and the copies are made again")
		start(ctx)
		Eventually(func(g Gomega) {
			for _, s := range steps {
				g.Expect(replicas(ctx, g, s.output)).To(BeEquivalentTo(2), "output %s", s.output)
			}
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for the copies to be made again")
	})
})

// labelNode sets a label on a node for the rest of the spec, and puts back the value it had
// (the cluster's nodes carry their own racks and zones, which other specs check).
func labelNode(ctx context.Context, node, key, value string) {
	GinkgoHelper()
	var n corev1.Node
	Expect(k8sClient.Get(ctx, client.ObjectKey{Name: node}, &n)).To(Succeed())
	old, had := n.Labels[key]
	patch := client.MergeFrom(n.DeepCopy())
	n.Labels[key] = value
	Expect(k8sClient.Patch(ctx, &n, patch)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		var n corev1.Node
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: node}, &n)).To(Succeed())
		patch := client.MergeFrom(n.DeepCopy())
		if had {
			n.Labels[key] = old
		} else {
			delete(n.Labels, key)
		}
		Expect(k8sClient.Patch(ctx, &n, patch)).To(Succeed())
	})
}
