//go:build e2e

package e2e

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// A pipeline whose outputs live only in the memory of one node, and that node stops: while it
// is down, the outputs are recomputed on the other, parents first, and a pod of high priority
// that reads the last one reads it, whole, in one pass with no retry of its own (its reads wait
// for the recomputation instead of failing with EIO), without being restarted.
var _ = Describe("A pipeline that loses the node holding its outputs", Ordered, Label("smoke", "lineage"), func() {
	var (
		namespace, pool string
		nodes           []string
		written         []object
	)
	steps := chainSteps

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-lineage-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "lineage", "4Mi")
		written = chainInput(ctx, namespace, pool, nodes[1], "e2e-lineage")
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("runs the three steps on one node, their outputs in its memory", func(ctx SpecContext) {
		for _, s := range steps {
			Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: s.output, Namespace: namespace},
				Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: s.name}, TierPoolName: pool},
			})).To(Succeed())
			// Preferred, not required: once the node is gone, recomputations run on the other.
			Expect(k8sClient.Create(ctx, copyLineage(namespace, s.name, s.input, s.output, nodes[0], false))).To(Succeed())
		}
		for _, s := range steps {
			waitLineage(ctx, namespace, s.name, "Written")
		}
		Eventually(func(g Gomega) {
			var c datav1alpha1.Lineage
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "step-c"}, &c)).To(Succeed())
			g.Expect(c.Status.UncheckpointedDepth).To(BeEquivalentTo(3))
			var out datav1alpha1.Dataset
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "out-c"}, &out)).To(Succeed())
			g.Expect(out.Status.Nodes).To(HaveExactElements(HaveField("Node", nodes[0])), "the outputs are on %s alone", nodes[0])
		}).WithContext(ctx).WithTimeout(2 * minute).Should(Succeed())

		By("each step learned its run time from its run, and predicts the next")
		Eventually(func(g Gomega) {
			for _, s := range steps {
				var l datav1alpha1.Lineage
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: s.name}, &l)).To(Succeed())
				g.Expect(l.Status.RunTime).NotTo(BeNil(), "Lineage %s has no run time", s.name)
				g.Expect(l.Status.RunTime.Runs).To(HaveExactElements(And(HaveField("Job", s.name+"-run"),
					HaveField("Milliseconds", BeNumerically(">", 0)), HaveField("InputBytes", BeNumerically(">", 0)))),
					"Lineage %s: its run, and what it read (its input written by the step before, as the master says)", s.name)
				g.Expect(l.Status.RunTime.Predicted).NotTo(BeEmpty(), "Lineage %s predicts no run time", s.name)
			}
		}).WithContext(ctx).WithTimeout(2 * minute).Should(Succeed())
	})

	It("recomputes the outputs in order when that node stops, and a waiting pod of high priority reads them", func(ctx SpecContext) {
		urgent := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-urgent-" + namespace}, Value: 1000000}
		Expect(k8sClient.Create(ctx, urgent)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, urgent))).To(Succeed()) })

		start := stopNode(ctx, nodes[0])

		By("a pod of high priority on " + nodes[1] + " reads the last output once, with no retry: its reads wait")
		reader := claimPod(namespace, nodes[1], "out-c", "sum", "/data")
		reader.Spec.PriorityClassName = urgent.Name
		Expect(k8sClient.Create(ctx, reader)).To(Succeed())
		Consistently(func() corev1.PodPhase {
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(reader), reader)).To(Succeed())
			return reader.Status.Phase
		}).WithContext(ctx).WithTimeout(30*time.Second).ShouldNot(Equal(corev1.PodSucceeded), "the data is gone with the node")

		// The node stays down: the masters keep a majority on the other two nodes (one replica
		// per node, the control plane's included), and the operator runs on the control plane.
		By("while " + nodes[0] + " is down, each step is recomputed once, parents first, all at the priority of the pod that waits for the last")
		for _, s := range steps {
			waitRecomputed(ctx, namespace, s.name, 1)
		}
		var jobs batchv1.JobList
		Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace), client.HasLabels{"data.strata.dev/recomputation"})).To(Succeed())
		started := map[string]time.Time{}
		classes := map[string]string{}
		for _, j := range jobs.Items {
			if j.DeletionTimestamp == nil && j.Status.Succeeded > 0 {
				started[j.Labels["data.strata.dev/lineage"]] = j.CreationTimestamp.Time
				classes[j.Labels["data.strata.dev/lineage"]] = j.Spec.Template.Spec.PriorityClassName
			}
		}
		Expect(started).To(HaveLen(3))
		Expect(started["step-a"]).To(BeTemporally("<", started["step-b"]), "a before b")
		Expect(started["step-b"]).To(BeTemporally("<", started["step-c"]), "b before c")
		// The pod waits for out-c, which waits for out-b, which waits for out-a: inheritance is
		// transitive, so the first recomputation runs at the pod's class too, not the lowest.
		Expect(classes).To(Equal(map[string]string{"step-a": urgent.Name, "step-b": urgent.Name, "step-c": urgent.Name}),
			"every lost ancestor of what the pod waits for inherits its class")

		By("the waiting pod reads every byte of the recomputed output in its one pass, never restarted")
		Expect(contents(runLogsWhenDone(ctx, reader))).To(Equal(contents(written)))
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(reader), reader)).To(Succeed())
		Expect(reader.Status.ContainerStatuses).To(HaveExactElements(HaveField("RestartCount", BeZero())))

		By("starting " + nodes[0] + " again: it comes back with an empty memory tier, and nothing is recomputed twice")
		start(ctx)
		Consistently(func(g Gomega) {
			for _, s := range steps {
				var l datav1alpha1.Lineage
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: s.name}, &l)).To(Succeed())
				g.Expect(l.Status.Recomputations).To(BeEquivalentTo(1), "Lineage %s", s.name)
			}
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())
	})
})

// chainSteps are the steps of a chain of three copies: raw → out-a → out-b → out-c.
var chainSteps = []struct{ name, input, output string }{
	{"step-a", "raw", "out-a"},
	{"step-b", "out-a", "out-b"},
	{"step-c", "out-b", "out-c"},
}

// chainInput puts the objects a chain of steps copies into bucket, under the namespace's name,
// and declares them as the namespace's Dataset raw, in pool, Ready; it returns the objects, by
// their keys in raw.
func chainInput(ctx context.Context, namespace, pool, node, bucket string) []object {
	GinkgoHelper()
	prefix := namespace + "/"
	written := putObjects(ctx, namespace, node, bucket, []string{prefix + "big.bin", prefix + "dir/a.txt", prefix + "dir/b.txt"}, 9<<20, 5)
	for i := range written {
		written[i].Key = strings.TrimPrefix(written[i].Key, prefix)
	}
	raw := minioDataset(namespace, "raw", pool, "s3://"+bucket+"/"+prefix)
	Expect(k8sClient.Create(ctx, raw)).To(Succeed())
	waitReady(ctx, raw)
	return written
}

// runLogsWhenDone waits for a pod created already and decodes what it printed.
func runLogsWhenDone(ctx context.Context, pod *corev1.Pod) []object {
	GinkgoHelper()
	waitSucceeded(ctx, pod)
	return runLogs(ctx, pod)
}
