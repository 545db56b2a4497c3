//go:build e2e

package e2e

import (
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// #20: a two-step pipeline whose second step's input, read by a CachePolicy with prefetch CMR,
// is in memory, on a node of the pool, before that step starts.
var _ = Describe("Prefetching the input of a pipeline's next step (CMR)", Ordered, Label("smoke", "prefetch"), func() {
	const (
		bucket = "e2e-prefetch"
		mib    = 1 << 20
	)
	var namespace string
	AfterEach(func() { dumpOnFailure(namespace) })

	It("reads the next step's input into memory while the first step runs", func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-prefetch-")
		nodes := cacheNodes(ctx)
		putObjects(ctx, namespace, nodes[0], bucket, []string{namespace + "/raw/r.bin"}, mib, 31)
		putObjects(ctx, namespace, nodes[0], bucket, []string{namespace + "/lookup/a.bin", namespace + "/lookup/b.bin"}, 4*mib, 32)
		pool := memoryPool(ctx, "ahead", "1Mi")
		Expect(k8sClient.Create(ctx, &datav1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Name: "ahead", Namespace: namespace},
			Spec: datav1alpha1.CachePolicySpec{Prefetch: datav1alpha1.PrefetchSpec{Policy: datav1alpha1.PrefetchCMR}}})).To(Succeed())
		raw := minioDataset(namespace, "raw", pool, "s3://"+bucket+"/"+namespace+"/raw/")
		lookup := minioDataset(namespace, "lookup", pool, "s3://"+bucket+"/"+namespace+"/lookup/")
		lookup.Spec.CachePolicyName = "ahead"
		for _, ds := range []*datav1alpha1.Dataset{raw, lookup} {
			Expect(k8sClient.Create(ctx, ds)).To(Succeed())
			waitReady(ctx, ds)
		}
		for name, writer := range map[string]string{"mid": "extract", "out": "join"} {
			Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: writer}, TierPoolName: pool}})).To(Succeed())
		}

		// The first step copies 1 MiB at 64 KiB/s: 16 s during which the next can be read ahead.
		extract := copyLineage(namespace, "extract", "raw", "mid", nodes[0], false)
		container := &extract.Spec.Template.Spec.Template.Spec.Containers[0]
		container.Args = append([]string{"copy", "--rate", strconv.Itoa(64 << 10)}, container.Args[1:]...)
		join := copyLineage(namespace, "join", "lookup", "out", nodes[0], false)
		join.Spec.Inputs = []string{"mid", "lookup"}
		// Placed by the scheduling hints, where its input is.
		join.Spec.Template.Spec.Template.Spec.Affinity = nil
		Expect(k8sClient.Create(ctx, extract)).To(Succeed())
		Expect(k8sClient.Create(ctx, join)).To(Succeed())

		By("seeing the prefetch hold part of lookup on a node before join's Job exists")
		load := &datav1alpha1.DataLoad{}
		Eventually(func(g Gomega) {
			if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "join-run"}, &batchv1.Job{}); err == nil {
				StopTrying("join started before any of its input was read ahead").Now()
			}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "lookup-prefetch"}, load)).To(Succeed())
			g.Expect(load.Labels).To(HaveKeyWithValue("data.strata.dev/prefetch", "CMR"))
			g.Expect(load.Status.Bytes.Done).To(BeNumerically(">", 0))
		}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for the prefetch of lookup")
		GinkgoWriter.Printf("prefetched %d of %d bytes (%d%% of each file) of lookup on %v before join started\n",
			load.Status.Bytes.Done, load.Status.Bytes.Total, *load.Spec.PercentOfEachFile, load.Status.Nodes)

		dataset := `dataset="` + namespace + `/lookup"`
		fetched, _ := workerMetric(ctx, Default, pool, load.Status.Nodes[0].Node, "strata_worker_load_fetched_bytes_total", dataset)
		Expect(fetched).To(BeNumerically(">", 0), "the worker counts what the prefetch brought in")

		By("running join, which reads the prefetched blocks from memory; the prefetch ends once join did")
		waitLineage(ctx, namespace, "join", "Written")
		var hits float64
		for _, node := range nodes {
			n, _ := workerMetric(ctx, Default, pool, node, "strata_worker_load_hit_bytes_total", dataset)
			hits += n
		}
		GinkgoWriter.Printf("the worker of %s brought in %.0f bytes of lookup for the prefetch; join read %.0f bytes of them from its tiers\n",
			load.Status.Nodes[0].Node, fetched, hits)
		Expect(hits).To(BeNumerically(">", 0), "join read blocks of lookup that the prefetch brought into memory")
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "lookup-prefetch"}, load))
		}).WithContext(ctx).WithTimeout(2*minute).Should(BeTrue(), "the prefetch ends, unpinning what it loaded, once join ended")
	})
})
