//go:build e2e

package e2e

import (
	"context"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

var _ = Describe("The cache workers", Ordered, Label("smoke", "worker"), func() {
	var (
		namespace string
		pool      string
		nodes     []string
	)

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-worker-")
		nodes = cacheNodes(ctx)

		// The tier folders hack/kind/up.sh makes on every cache node: a tmpfs for memory, a
		// folder for NVMe.
		pool = uniqueName("e2e")
		tp := &datav1alpha1.TierPool{
			ObjectMeta: metav1.ObjectMeta{Name: pool},
			Spec: datav1alpha1.TierPoolSpec{
				NodeSelector: map[string]string{cacheNodeLabel: "true"},
				Tiers: []datav1alpha1.Tier{
					{Name: "mem", Medium: datav1alpha1.MediumMemory, Paths: []string{"/mnt/strata/mem"}, Quota: resource.MustParse("128Mi")},
					{Name: "nvme", Medium: datav1alpha1.MediumNVMe, Paths: []string{"/mnt/strata/nvme"}, Quota: resource.MustParse("512Mi")},
				},
				BlockSize: resource.MustParse("8Mi"),
			},
		}
		Expect(k8sClient.Create(ctx, tp)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, tp))).To(Succeed()) })
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	workerSet := func() types.NamespacedName {
		return types.NamespacedName{Namespace: strataNamespace, Name: "strata-worker-" + pool}
	}

	It("run as a DaemonSet the operator deploys from a TierPool, one ready worker per cache node", func(ctx SpecContext) {
		Eventually(func(g Gomega) {
			var ds appsv1.DaemonSet
			g.Expect(k8sClient.Get(ctx, workerSet(), &ds)).To(Succeed())
			g.Expect(ds.Status.DesiredNumberScheduled).To(Equal(int32(2)))
			g.Expect(ds.Status.NumberReady).To(Equal(int32(2)))
		}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for two ready workers of pool %s", pool)

		Eventually(func(g Gomega) {
			var tp datav1alpha1.TierPool
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: pool}, &tp)).To(Succeed())
			g.Expect(tp.Status.ReadyWorkers).To(Equal(int32(2)))
		}).WithContext(ctx).WithTimeout(minute).Should(Succeed(), "waiting for the TierPool's status to count two ready workers")
	})

	It("serve a block across nodes and keep it when the worker's pod is replaced", func(ctx SpecContext) {
		holder, reader := nodes[0], nodes[1]
		worker := pool + "/" + holder
		block := uniqueName("block")
		common := []string{"--master", strings.Join(masterAddresses(3), ","), "--worker", worker, "--block", block}

		By("writing an 8 MiB block from " + reader + " to the worker on " + holder)
		written := trustedTestkit(ctx, namespace, reader, append([]string{"worker", "put", "--size", "8388608", "--seed", "11",
			"--dataset", namespace + "-blocks"}, common...)...)
		Expect(written.Bytes).To(Equal(int64(8 << 20)))

		read := trustedTestkit(ctx, namespace, reader, append([]string{"worker", "get"}, common...)...)
		Expect(read.SHA256).To(Equal(written.SHA256), "the block read back over the pod network differs")

		By("replacing the worker's pod on " + holder)
		old := workerPod(ctx, pool, holder)
		Expect(k8sClient.Delete(ctx, old)).To(Succeed())
		Eventually(func(g Gomega) {
			pod := workerPod(ctx, pool, holder)
			g.Expect(pod).NotTo(BeNil())
			g.Expect(pod.UID).NotTo(Equal(old.UID))
			g.Expect(podReady(pod)).To(BeTrue())
		}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for a new ready worker on %s", holder)

		// The new pod has a new address; testkit finds it through the master, where the worker
		// registered again, and the block is still in the node's memory tier.
		again := trustedTestkit(ctx, namespace, reader, append([]string{"worker", "get"}, common...)...)
		Expect(again.SHA256).To(Equal(written.SHA256), "the block did not survive the worker's restart")
	})
})

// workerPod returns the worker pod of pool on node, or nil.
func workerPod(ctx context.Context, pool, node string) *corev1.Pod {
	var pods corev1.PodList
	Expect(k8sClient.List(ctx, &pods, client.InNamespace(strataNamespace),
		client.MatchingLabels{"app.kubernetes.io/name": "strata-worker", "app.kubernetes.io/instance": pool})).To(Succeed())
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			return p
		}
	}
	return nil
}

// workerMetric is the sum of the samples of metric of the worker of pool on node whose labels
// include every one of labels (such as `tier="mem"`); found says whether there was any.
func workerMetric(ctx context.Context, g Gomega, pool, node, metric string, labels ...string) (sum float64, found bool) {
	worker := workerPod(ctx, pool, node)
	g.Expect(worker).NotTo(BeNil(), "no worker of pool %s on node %s", pool, node)
	raw, err := clientset.CoreV1().Pods(strataNamespace).ProxyGet("http", worker.Name, "8080", "/metrics", nil).DoRaw(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		if !allIn(line, labels) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		g.Expect(err).NotTo(HaveOccurred(), "sample %q", line)
		sum, found = sum+v, true
	}
	return sum, found
}

func allIn(line string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(line, p) {
			return false
		}
	}
	return true
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
