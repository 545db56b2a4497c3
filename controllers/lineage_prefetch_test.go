package controllers

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/master/masterpb"
)

var _ = Describe("Prefetching the inputs of the Lineages that run next (a CachePolicy's prefetch policy)", func() {
	It("reads ahead what the policy plans during the running step, and stops when the plan drops it", func() {
		namespace, poolName := newTenant("prefetch-", "")
		makeServable(poolName)
		lookup := prefetchedData(namespace, poolName)
		policy := &datav1alpha1.CachePolicy{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "ahead"}, policy)).To(Succeed())

		// Half of lookup fits the pool's memory.
		setMemory := func(quota string) {
			Eventually(func(g Gomega) {
				pool := &datav1alpha1.TierPool{}
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: poolName}, pool)).To(Succeed())
				pool.Spec.Tiers[0].Quota = resource.MustParse(quota)
				g.Expect(k8sClient.Update(ctx, pool)).To(Succeed())
			}).Should(Succeed())
		}
		setMemory("2000")
		startPipeline(namespace)

		prefetch := &datav1alpha1.DataLoad{}
		key := client.ObjectKey{Namespace: namespace, Name: "lookup-prefetch"}
		By("CMR: while extract runs, half of each file of lookup, join's input, as much as memory holds")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, prefetch)).To(Succeed())
			g.Expect(prefetch.Labels).To(HaveKeyWithValue(prefetchLabel, "CMR"))
			g.Expect(prefetch.Spec).To(Equal(datav1alpha1.DataLoadSpec{DatasetName: "lookup", PercentOfEachFile: ptr.To[int32](50)}))
		}).Should(Succeed())
		Expect(metav1.IsControlledBy(prefetch, lookup)).To(BeTrue(), "it goes with its Dataset")

		change := func(p datav1alpha1.PrefetchPolicy) {
			Eventually(func(g Gomega) {
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
				policy.Spec.Prefetch.Policy = p
				g.Expect(k8sClient.Update(ctx, policy)).To(Succeed())
			}).Should(Succeed())
		}
		By("MRD, whole inputs only: lookup does not fit, and the load stops")
		change(datav1alpha1.PrefetchMRD)
		Eventually(func() error { return k8sClient.Get(ctx, key, prefetch) }).Should(MatchError(ContainSubstring("not found")))

		By("MRD with the memory for all of it: the whole of lookup")
		setMemory("1Gi")
		change(datav1alpha1.PrefetchCP)
		change(datav1alpha1.PrefetchMRD)
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, prefetch)).To(Succeed())
			g.Expect(prefetch.Labels).To(HaveKeyWithValue(prefetchLabel, "MRD"))
			g.Expect(prefetch.Spec.PercentOfEachFile).To(Equal(ptr.To[int32](100)))
		}).Should(Succeed())

		By("None: nothing is read ahead")
		change(datav1alpha1.PrefetchNone)
		Eventually(func() error { return k8sClient.Get(ctx, key, prefetch) }).Should(MatchError(ContainSubstring("not found")))
	})

	It("plans within the memory the pool's workers have free, and pins what it loaded until the stage that reads it ends", func() {
		namespace, poolName := newTenant("prefetch-pin-", "")
		makeServable(poolName)
		lookup := prefetchedData(namespace, poolName)

		By("the pool's quota is 1Gi a node, but its worker has 2000 bytes of memory free: half of lookup fits")
		_, err := lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: poolName + "/node-a", Node: "node-a",
			Tiers: []*masterpb.TierUsage{{Tier: "mem", CapacityBytes: 1 << 30, UsedBytes: 1<<30 - 2000}}})
		Expect(err).NotTo(HaveOccurred())
		startPipeline(namespace)
		key := client.ObjectKey{Namespace: namespace, Name: "lookup-prefetch"}
		Eventually(func(g Gomega) {
			prefetch := &datav1alpha1.DataLoad{}
			g.Expect(k8sClient.Get(ctx, key, prefetch)).To(Succeed())
			g.Expect(prefetch.Spec.PercentOfEachFile).To(Equal(ptr.To[int32](50)))
		}).Should(Succeed())

		// prefetchOf is what the pool's policies file pins of lookup as a prefetch.
		master := datav1alpha1.MasterDatasetName(namespace, "lookup", string(lookup.UID))
		prefetchOf := func(g Gomega) *policy.Prefetch {
			cm := &corev1.ConfigMap{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: testWorkerSpec.Namespace, Name: WorkerName(poolName)}, cm)).To(Succeed())
			var file policy.File
			g.Expect(json.Unmarshal([]byte(cm.Data[policy.FileName]), &file)).To(Succeed())
			for _, d := range file.Datasets {
				if d.Name == master {
					return d.Prefetch
				}
			}
			return nil
		}
		By("the workers pin the half of each file it loads")
		Eventually(prefetchOf).Should(Equal(&policy.Prefetch{Percent: 50}))

		job := func(lineage string) *batchv1.Job {
			j := &batchv1.Job{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: lineage + "-run"}, j)).To(Succeed())
			return j
		}
		By("join, which reads it, runs: the load and its pins stay")
		finishJob(job("extract"), true)
		awaitCondition(&datav1alpha1.Lineage{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "join"}},
			lineageConditions, datav1alpha1.ConditionReady, ReasonRunning)
		Consistently(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, &datav1alpha1.DataLoad{})).To(Succeed())
			g.Expect(prefetchOf(g)).To(Equal(&policy.Prefetch{Percent: 50}))
		}, "4s").Should(Succeed(), "a prefetch stays pinned while the stage it was for runs")

		By("join ended: the load goes, and the pins with it")
		finishJob(job("join"), true)
		Eventually(func() error { return k8sClient.Get(ctx, key, &datav1alpha1.DataLoad{}) }).Should(MatchError(ContainSubstring("not found")))
		Eventually(prefetchOf).Should(BeNil())
	})

	It("shares a pool's free memory among the namespaces that prefetch into it", func() {
		nsA, poolName := newTenant("prefetch-a-", "")
		makeServable(poolName)
		nsB, _ := newTenant("prefetch-b-", "")
		pipeline := func(namespace string) {
			GinkgoHelper()
			prefetchedData(namespace, poolName)
			startPipeline(namespace)
		}
		// percent is the share of each file of lookup the prefetch of namespace loads; 0 if none.
		percent := func(g Gomega, namespace string) int32 {
			dl := &datav1alpha1.DataLoad{}
			err := k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "lookup-prefetch"}, dl)
			if client.IgnoreNotFound(err) == nil && err != nil {
				return 0
			}
			g.Expect(err).NotTo(HaveOccurred())
			return ptr.Deref(dl.Spec.PercentOfEachFile, 100)
		}
		_, err := lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: poolName + "/node-a", Node: "node-a",
			Tiers: []*masterpb.TierUsage{{Tier: "mem", CapacityBytes: 1 << 30, UsedBytes: 1<<30 - 4000}}})
		Expect(err).NotTo(HaveOccurred())

		By("alone in the pool, namespace A's plan holds all of its lookup: 4000 bytes free")
		pipeline(nsA)
		Eventually(func(g Gomega) int32 { return percent(g, nsA) }).Should(BeEquivalentTo(100))

		By("with namespace B's pipeline in the same pool, the two plans hold no more than the 4000 bytes between them")
		pipeline(nsB)
		shared := func(g Gomega) {
			a, b := percent(g, nsA), percent(g, nsB)
			// Each DataLoad rounds its share up to a whole percent.
			g.Expect(a+b).To(BeNumerically("<=", 102), "A holds %d%% and B %d%% of their 4000 bytes", a, b)
		}
		Eventually(func(g Gomega) {
			g.Expect(percent(g, nsB)).To(BeNumerically(">", 0), "B's plan holds part of its lookup")
			shared(g)
		}).Should(Succeed())
		Consistently(shared, "4s").Should(Succeed())
	})
})

// prefetchedData makes, in namespace and pool, the CachePolicy "ahead" (prefetch CMR) and the
// Datasets of a two-step pipeline: extract copies raw (1000 bytes) into mid, join reads mid and
// lookup (two files of 2000 bytes, which "ahead" prefetches) into out. It returns lookup, listed.
func prefetchedData(namespace, pool string) *datav1alpha1.Dataset {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, &datav1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Name: "ahead", Namespace: namespace},
		Spec: datav1alpha1.CachePolicySpec{Prefetch: datav1alpha1.PrefetchSpec{Policy: datav1alpha1.PrefetchCMR}}})).To(Succeed())
	raw := s3DatasetOf(namespace, "raw", pool, map[string]int{"r.bin": 1000})
	lookup := s3DatasetOf(namespace, "lookup", pool, map[string]int{"a.bin": 2000, "b.bin": 2000})
	lookup.Spec.CachePolicyName = "ahead"
	for _, ds := range []*datav1alpha1.Dataset{raw, lookup} {
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
	}
	for name, writer := range map[string]string{"mid": "extract", "out": "join"} {
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{TierPoolName: pool, Lineage: &datav1alpha1.LineageReference{Name: writer}}})).To(Succeed())
	}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(lookup), lookup)).To(Succeed())
		g.Expect(lookup.Status.TotalBytes).To(BeEquivalentTo(4000))
	}).Should(Succeed())
	return lookup
}

// startPipeline makes the Lineages of prefetchedData's pipeline: extract runs at once, join
// waits for mid.
func startPipeline(namespace string) {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, newLineage(namespace, "extract", []string{"raw"}, []string{"mid"}))).To(Succeed())
	Expect(k8sClient.Create(ctx, newLineage(namespace, "join", []string{"mid", "lookup"}, []string{"out"}))).To(Succeed())
}
