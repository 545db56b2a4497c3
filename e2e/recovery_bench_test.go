//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// The recovery benchmark of docs/benchmarks.md: a Job that has nothing to do with the lost data
// (it reads another Dataset), created while a recomputation holds the node's CPU, side by side
// in one run with the same Job on the same node before the loss, and with the same Job at the
// recomputation's own priority. Recomputations run at the lowest PriorityClass, so the
// scheduler preempts them to make room for the unrelated Job (Tachyon §5: recovery must not
// slow jobs that do not depend on it), and a preempted one comes back as a new recomputation,
// which waits for room.
var _ = Describe("An unrelated Job while lost data is recomputed", Ordered, Label("bench", "recovery"), func() {
	const bucket = "e2e-recovery"
	var (
		namespace, pool string
		nodes           []string
		cpu             resource.Quantity
	)

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-recovery-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "recovery", "4Mi")
		for _, name := range []string{"raw", "other"} {
			putObjects(ctx, namespace, nodes[1], bucket, []string{namespace + "/" + name + "/a.bin", namespace + "/" + name + "/b.bin"}, 8<<20, 31)
			ds := minioDataset(namespace, name, pool, "s3://"+bucket+"/"+namespace+"/"+name+"/")
			Expect(k8sClient.Create(ctx, ds)).To(Succeed())
			waitReady(ctx, ds)
		}
		// Every read of the unrelated Job is hot: what it waits for is the measure.
		sumClaim(ctx, namespace, nodes[1], "other")
		// Each of the recomputation and the unrelated Job asks for 60% of the CPU left on the node
		// they share: either fits alone, both do not.
		cpu = *resource.NewMilliQuantity(freeMilliCPU(ctx, nodes[1])*6/10, resource.DecimalSI)
		GinkgoWriter.Printf("each pod requests %s of CPU on %s\n", cpu.String(), nodes[1])
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	// unrelated reads the Dataset other on nodes[1], placed by the scheduler, at class (none: the
	// default priority), and returns how long it waited to start and how long it read.
	unrelated := func(ctx context.Context, class string) (wait, run time.Duration) {
		pod := claimPod(namespace, "", "other", "sum", "--summary", "/data")
		pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: nodes[1]}
		pod.Spec.PriorityClassName = class
		pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: cpu}
		read := one(runPod(ctx, pod))
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		started := pod.Status.ContainerStatuses[0].State.Terminated.StartedAt
		return started.Sub(pod.CreationTimestamp.Time), time.Duration(read.Seconds * float64(time.Second))
	}
	recomputePods := func(ctx context.Context) []corev1.Pod {
		var pods corev1.PodList
		Expect(k8sClient.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{"data.strata.dev/lineage": "slow"},
			client.HasLabels{"batch.kubernetes.io/job-name"})).To(Succeed())
		var out []corev1.Pod
		for _, p := range pods.Items {
			if p.Spec.PriorityClassName == "strata-recompute-lowest" {
				out = append(out, p)
			}
		}
		return out
	}

	It("starts an unrelated Job of normal priority at once, by preempting the recomputation", func(ctx SpecContext) {
		By("a step that copies its input slowly, asking for the CPU, writes its output on " + nodes[0])
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "slow"}, TierPoolName: pool},
		})).To(Succeed())
		l := copyLineage(namespace, "slow", "raw", "out", nodes[0], false)
		container := &l.Spec.Template.Spec.Template.Spec.Containers[0]
		container.Args = []string{"copy", "--rate", "262144", "/data", "/out"} // 16 MiB in about a minute
		container.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: cpu}
		l.Spec.Template.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
		Expect(k8sClient.Create(ctx, l)).To(Succeed())
		waitLineage(ctx, namespace, "slow", "Written")

		By("the unrelated Job on " + nodes[1] + ", before any loss")
		beforeWait, beforeRun := unrelated(ctx, "")

		stopNode(ctx, nodes[0])
		By("the recomputation runs on " + nodes[1] + ", at the lowest class")
		Eventually(func(g Gomega) {
			pods := recomputePods(ctx)
			g.Expect(pods).NotTo(BeEmpty())
			g.Expect(pods[0].Status.Phase).To(Equal(corev1.PodRunning))
		}).WithContext(ctx).WithTimeout(5*minute).Should(Succeed(), "waiting for the recomputation to run")

		By("the unrelated Job of normal priority, while the recomputation holds the CPU")
		duringWait, duringRun := unrelated(ctx, "")
		var events corev1.EventList
		Expect(k8sClient.List(ctx, &events, client.InNamespace(namespace))).To(Succeed())
		Expect(events.Items).To(ContainElement(And(HaveField("Reason", "Preempted"),
			HaveField("InvolvedObject.Name", HavePrefix("slow-recompute-1-")))),
			"the scheduler made room by preempting the recomputation")

		By("the same Job at the recomputation's own class waits for it")
		Eventually(func(g Gomega) {
			running := 0
			for _, p := range recomputePods(ctx) {
				if p.Status.Phase == corev1.PodRunning && strings.HasPrefix(p.Labels["batch.kubernetes.io/job-name"], "slow-recompute-2-") {
					running++
				}
			}
			g.Expect(running).To(Equal(1))
		}).WithContext(ctx).WithTimeout(5*minute).Should(Succeed(), "waiting for the second recomputation to run")
		sameWait, sameRun := unrelated(ctx, "strata-recompute-lowest")

		By("the preempted recomputation came back as a second, which finished")
		waitRecomputed(ctx, namespace, "slow", 2)

		for _, row := range []struct {
			what      string
			wait, run time.Duration
		}{
			{"before the loss", beforeWait, beforeRun},
			{"during the recomputation, normal priority", duringWait, duringRun},
			{"during the recomputation, the recomputation's class", sameWait, sameRun},
		} {
			GinkgoWriter.Printf("unrelated Job %-52s waited %6.1f s to start, read for %5.2f s\n", row.what, row.wait.Seconds(), row.run.Seconds())
			AddReportEntry("unrelated Job "+row.what, fmt.Sprintf("waited %.1f s, read %.2f s", row.wait.Seconds(), row.run.Seconds()))
		}
	})
})

// freeMilliCPU is the CPU, in thousandths, that node's allocatable leaves after the requests of
// the pods on it.
func freeMilliCPU(ctx context.Context, node string) int64 {
	GinkgoHelper()
	var n corev1.Node
	Expect(k8sClient.Get(ctx, client.ObjectKey{Name: node}, &n)).To(Succeed())
	free := n.Status.Allocatable.Cpu().MilliValue()
	var pods corev1.PodList
	Expect(k8sClient.List(ctx, &pods)).To(Succeed())
	for _, p := range pods.Items {
		if p.Spec.NodeName != node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Spec.Containers {
			free -= c.Resources.Requests.Cpu().MilliValue()
		}
	}
	return free
}
