package controllers

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

var _ = Describe("Prefetching the inputs of the Lineages that run next (a CachePolicy's prefetch policy)", func() {
	It("reads ahead what the policy plans during the running step, and stops when the plan drops it", func() {
		namespace, poolName := newTenant("prefetch-", "")
		makeServable(poolName)
		policy := &datav1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Name: "ahead", Namespace: namespace},
			Spec: datav1alpha1.CachePolicySpec{Prefetch: datav1alpha1.PrefetchSpec{Policy: datav1alpha1.PrefetchCMR}}}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		raw := s3DatasetOf(namespace, "raw", poolName, map[string]int{"r.bin": 1000})
		lookup := s3DatasetOf(namespace, "lookup", poolName, map[string]int{"a.bin": 2000, "b.bin": 2000})
		lookup.Spec.CachePolicyName = "ahead"
		for _, ds := range []*datav1alpha1.Dataset{raw, lookup} {
			Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		}
		for name, writer := range map[string]string{"mid": "extract", "out": "join"} {
			Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: datav1alpha1.DatasetSpec{TierPoolName: poolName, Lineage: &datav1alpha1.LineageReference{Name: writer}}})).To(Succeed())
		}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(lookup), lookup)).To(Succeed())
			g.Expect(lookup.Status.TotalBytes).To(BeEquivalentTo(4000))
		}).Should(Succeed())

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
		Expect(k8sClient.Create(ctx, newLineage(namespace, "extract", []string{"raw"}, []string{"mid"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "join", []string{"mid", "lookup"}, []string{"out"}))).To(Succeed())

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
})
