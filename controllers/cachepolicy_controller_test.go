package controllers

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

var _ = Describe("The CachePolicy reconciler", func() {
	It("counts the Datasets that use a policy and says whether the workers can apply it", func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "policies-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		cp := &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "hot", Namespace: ns.Name},
			Spec:       datav1alpha1.CachePolicySpec{PinnedPaths: []string{"index/**"}},
		}
		Expect(k8sClient.Create(ctx, cp)).To(Succeed())
		dataset := func(name, policy string) *datav1alpha1.Dataset {
			return &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name},
				Spec: datav1alpha1.DatasetSpec{
					Source:       &datav1alpha1.DatasetSource{URI: "s3://bucket/" + name + "/"},
					TierPoolName: "none", CachePolicyName: policy,
				},
			}
		}
		a, b := dataset("a", "hot"), dataset("b", "hot")
		for _, ds := range []*datav1alpha1.Dataset{a, b, dataset("c", "")} {
			Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		}
		status := func(datasets int32, reason string) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cp), cp)).To(Succeed())
				g.Expect(cp.Status.Datasets).To(Equal(datasets))
				c := meta.FindStatusCondition(cp.Status.Conditions, datav1alpha1.ConditionReady)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Reason).To(Equal(reason))
				g.Expect(c.ObservedGeneration).To(Equal(cp.Generation))
			}).Should(Succeed())
		}
		status(2, ReasonPolicyAccepted)

		By("following a Dataset that stops naming the policy")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(b), b)).To(Succeed())
			b.Spec.CachePolicyName = ""
			g.Expect(k8sClient.Update(ctx, b)).To(Succeed())
		}).Should(Succeed())
		status(1, ReasonPolicyAccepted)

		By("saying which pattern the workers cannot apply")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cp), cp)).To(Succeed())
			cp.Spec.PinnedPaths = []string{"index/**", "shards/[0-9"}
			g.Expect(k8sClient.Update(ctx, cp)).To(Succeed())
		}).Should(Succeed())
		status(1, ReasonInvalidPinnedPaths)
		Expect(meta.FindStatusCondition(cp.Status.Conditions, datav1alpha1.ConditionReady).Message).
			To(ContainSubstring(`spec.pinnedPaths[1]: path pattern "shards/[0-9"`))
		Eventually(func() []string { return eventReasons(ns.Name, cp.Name) }).
			Should(ContainElement(ReasonInvalidPinnedPaths), "a Warning event says it too")

		By("saying which temporary path pattern the workers cannot apply")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cp), cp)).To(Succeed())
			cp.Spec.PinnedPaths = []string{"index/**"}
			cp.Spec.Checkpoint.TemporaryPathPatterns = []string{"**/_tmp/**", "scratch/[a"}
			g.Expect(k8sClient.Update(ctx, cp)).To(Succeed())
		}).Should(Succeed())
		status(1, ReasonInvalidTemporaryPaths)
		Expect(meta.FindStatusCondition(cp.Status.Conditions, datav1alpha1.ConditionReady).Message).
			To(ContainSubstring(`spec.checkpoint.temporaryPathPatterns[1]: path pattern "scratch/[a"`))

		By("accepting DAG-aware eviction (MRD)")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cp), cp)).To(Succeed())
			cp.Spec.Checkpoint.TemporaryPathPatterns = nil
			cp.Spec.Eviction.Policy = datav1alpha1.EvictMRD
			g.Expect(k8sClient.Update(ctx, cp)).To(Succeed())
		}).Should(Succeed())
		status(1, ReasonPolicyAccepted)
	})
})
