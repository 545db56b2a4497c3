//go:build e2e

package e2e

import (
	"context"
	"os/exec"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

var _ = Describe("A Dataset whose source stops answering", Ordered, Label("smoke", "outage"), func() {
	var (
		namespace, pool, prefix string
		nodes                   []string
		cached                  []object
	)
	const bucket = "e2e-outage"

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-outage-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "outage", "4Mi")
		prefix = namespace + "/"
		cached = putObjects(ctx, namespace, nodes[0], bucket, []string{prefix + "cached/a.bin", prefix + "cached/b.txt"}, 5<<20, 1)
		putObjects(ctx, namespace, nodes[0], bucket, []string{prefix + "uncached/c.txt"}, 3000, 2)
		trimPrefix(cached, prefix+"cached/")
		Expect(k8sClient.Create(ctx, minioDataset(namespace, "kept", pool, "s3://"+bucket+"/"+prefix))).To(Succeed())
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("is read on one node only, where its cached/ folder is cached", func(ctx SpecContext) {
		waitReady(ctx, &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: namespace}})
		Expect(contents(runPod(ctx, claimPod(namespace, nodes[0], "kept", "sum", "/data/cached")))).To(Equal(contents(cached)))
	})

	It("serves what is cached to a new pod on the node that never mounted it while MinIO cannot be reached, and says so", func(ctx SpecContext) {
		By("cutting every node off from MinIO (TCP resets)")
		restore := cutOffMinio(ctx)
		DeferCleanup(restore)

		By("reading the cached files on " + nodes[1] + ", with the listing the other node kept")
		Expect(contents(runPod(ctx, claimPod(namespace, nodes[1], "kept", "sum", "/data/cached")))).To(Equal(contents(cached)),
			"a node that never mounted the Dataset reads its cached files byte for byte")

		By("failing with EIO on a file no node caches")
		uncached := claimPod(namespace, nodes[1], "kept", "sum", "/data/uncached")
		Expect(k8sClient.Create(ctx, uncached)).To(Succeed())
		waitFailedWith(ctx, uncached, "input/output error")

		By("saying in the Dataset's status that the source is unreachable, and since when, while it stays Ready")
		ds := &datav1alpha1.Dataset{}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "kept"}, ds)).To(Succeed())
			c := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionSourceReachable)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse), "%s: %s", c.Reason, c.Message)
			g.Expect(c.Message).To(And(ContainSubstring("unreachable since"), ContainSubstring("last good listing")))
		}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for the operator to notice the outage")
		Expect(meta.IsStatusConditionTrue(ds.Status.Conditions, datav1alpha1.ConditionReady)).To(BeTrue())

		By("saying the source is back once it answers again")
		restore(context.WithoutCancel(ctx))
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(ds.Status.Conditions, datav1alpha1.ConditionSourceReachable)).To(BeTrue())
		}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for the operator to see the source back")
	})
})

// cutOffMinio makes every node of the cluster reset TCP connections to the MinIO pod (its data
// lives in an emptyDir, so it cannot be stopped without losing every spec's objects), and
// returns what undoes it; undoing twice is harmless.
func cutOffMinio(ctx context.Context) (restore func(context.Context)) {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(k8sClient.List(ctx, &pods, client.InNamespace("minio"))).To(Succeed())
	Expect(pods.Items).To(HaveLen(1))
	ip := pods.Items[0].Status.PodIP
	Expect(ip).NotTo(BeEmpty())
	var nodes corev1.NodeList
	Expect(k8sClient.List(ctx, &nodes)).To(Succeed())
	rule := func(op, chain string) []string {
		return []string{"iptables", op, chain, "-d", ip, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"}
	}
	for _, n := range nodes.Items {
		for _, chain := range []string{"FORWARD", "OUTPUT"} {
			out, err := exec.CommandContext(ctx, "docker", append([]string{"exec", n.Name}, rule("-I", chain)...)...).CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "cutting %s off from MinIO: %s", n.Name, out)
		}
	}
	done := false
	return func(ctx context.Context) {
		if done {
			return
		}
		done = true
		for _, n := range nodes.Items {
			for _, chain := range []string{"FORWARD", "OUTPUT"} {
				out, err := exec.CommandContext(ctx, "docker", append([]string{"exec", n.Name}, rule("-D", chain)...)...).CombinedOutput()
				Expect(err).NotTo(HaveOccurred(), "letting %s reach MinIO again: %s", n.Name, out)
			}
		}
	}
}
