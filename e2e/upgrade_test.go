//go:build e2e

package e2e

import (
	"fmt"
	"os/exec"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// upgradeFrom is the chart of the release `make e2e-upgrade` installs first: the last version
// before mutual TLS.
var upgradeFrom = envOr("E2E_UPGRADE_FROM", "")

var _ = Describe("An upgrade from the version before mutual TLS", Ordered, Label("upgrade"), func() {
	var (
		tenant, attacker string
		pool             string
		nodes            []string
		written          []object
		ds               *datav1alpha1.Dataset
	)
	const bucket = "e2e-upgrade"

	BeforeAll(func(ctx SpecContext) {
		Expect(upgradeFrom).NotTo(BeEmpty(), "run these specs with `make e2e-upgrade`, which installs the previous release first")
		tenant = testNamespace(ctx, "e2e-upgrade-")
		attacker = testNamespace(ctx, "e2e-attacker-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "upgrade", "4Mi")

		By("caching a tenant's Dataset of twelve 4 MiB files on " + nodes[0])
		var keys []string
		for i := range 12 {
			keys = append(keys, fmt.Sprintf("%s/part-%02d.bin", tenant, i))
		}
		written = putObjects(ctx, tenant, nodes[0], bucket, keys, 4<<20, 31)
		for i := range written {
			written[i].Key = strings.TrimPrefix(written[i].Key, tenant+"/")
		}
		ds = minioDataset(tenant, "steady", pool, "s3://"+bucket+"/"+tenant+"/")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)
		Expect(sumClaim(ctx, tenant, nodes[0], "steady")).To(Equal(contents(written)))
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
	})
	AfterEach(func() { dumpOnFailure(tenant, attacker) })

	It("lets a pod of another namespace read the tenant's cached block before it (what the fix closes)", func(ctx SpecContext) {
		worker := workerPod(ctx, pool, nodes[0])
		Expect(worker).NotTo(BeNil())
		// Only what leaves the installation whole: the other attempts would break it.
		got := runAttack(ctx, testkitPod(attacker, nodes[1], append([]string{"attack", "--only", "read-block,list-files"},
			attackTarget(worker, pool, ds, "part-00.bin", "")...)...))
		Expect(got["read-block"].Code).To(Equal("OK"), "the previous version served the block to anyone: %+v", got["read-block"])
		Expect(got["list-files"].Code).To(Equal("OK"), "the previous version listed every namespace's files: %+v", got["list-files"])
	})

	It("upgrades to this chart while a pod reads the Dataset, and the pod reads every byte", func(ctx SpecContext) {
		By("starting a pod that reads the Dataset slowly, through its page cache, for the whole upgrade")
		reader := claimPod(tenant, nodes[0], "steady", "sum", "--rate", "131072", "--uncached", "/data")
		Expect(k8sClient.Create(ctx, reader)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(reader), reader)).To(Succeed())
			g.Expect(reader.Status.Phase).To(Equal(corev1.PodRunning))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the reader to run")
		before := workerPod(ctx, pool, nodes[0])
		Expect(before).NotTo(BeNil())

		By("upgrading the release to this chart")
		out, err := kubectl("apply", "--server-side", "--force-conflicts", "-f", "../charts/strata/crds/")
		Expect(err).NotTo(HaveOccurred(), "applying the CRDs: %s", out)
		helm("upgrade", releaseName, "../charts/strata", "--values", "../hack/kind/strata-values.yaml",
			"--set", "image.tag="+imageTag, "--wait", "--timeout", "8m")

		By("waiting for every master replica and worker to run this version, on mutual TLS")
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(strataNamespace),
				client.MatchingLabels{"app.kubernetes.io/name": "strata-master"})).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(3))
			for _, p := range pods.Items {
				g.Expect(p.Spec.Containers[0].Args).To(ContainElement(HavePrefix("--ca-file=")), "master %s", p.Name)
				g.Expect(podReady(&p)).To(BeTrue(), "master %s ready", p.Name)
			}
			var workers appsv1.DaemonSet
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: "strata-worker-" + pool}, &workers)).To(Succeed())
			g.Expect(workers.Status.UpdatedNumberScheduled).To(Equal(workers.Status.DesiredNumberScheduled))
			g.Expect(workers.Status.NumberReady).To(Equal(workers.Status.DesiredNumberScheduled))
			g.Expect(workers.Status.ObservedGeneration).To(Equal(workers.Generation))
		}).WithContext(ctx).WithTimeout(8*minute).Should(Succeed(), "waiting for the masters and workers of this version")
		after := workerPod(ctx, pool, nodes[0])
		Expect(after).NotTo(BeNil())
		Expect(after.UID).NotTo(Equal(before.UID), "the reader's worker was replaced by the upgrade")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(reader), reader)).To(Succeed())
		Expect(reader.Status.Phase).To(Equal(corev1.PodRunning), "the reader was still reading when the upgrade was done: %s",
			podLogs(ctx, reader))

		By("the reader finishing with every byte it would have read without the upgrade")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(reader), reader)).To(Succeed())
			if reader.Status.Phase == corev1.PodFailed {
				StopTrying("the reader failed during the upgrade: " + podLogs(ctx, reader)).Now()
			}
			g.Expect(reader.Status.Phase).To(Equal(corev1.PodSucceeded))
		}).WithContext(ctx).WithTimeout(10*minute).Should(Succeed(), "waiting for the reader to finish")
		Expect(contents(runLogs(ctx, reader))).To(Equal(contents(written)), "what the pod read through the upgrade differs")
	})

	It("refuses the same pod after it", func(ctx SpecContext) {
		worker := workerPod(ctx, pool, nodes[0])
		Expect(worker).NotTo(BeNil())
		refusedAll(runAttack(ctx, testkitPod(attacker, nodes[1], append([]string{"attack"},
			attackTarget(worker, pool, ds, "part-00.bin", "")...)...)), "after the upgrade, a pod with no certificate:")
	})

	It("serves the Dataset to new pods on both nodes after it", func(ctx SpecContext) {
		for _, node := range nodes {
			Expect(sumClaim(ctx, tenant, node, "steady")).To(Equal(contents(written)), "what a new pod read on %s", node)
		}
	})
})

// kubectl runs kubectl against the e2e cluster.
func kubectl(args ...string) (string, error) {
	out, err := exec.Command(kubectlPath, append([]string{"--context", kubeContext}, args...)...).CombinedOutput()
	return string(out), err
}
