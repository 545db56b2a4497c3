package controllers

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

// testLabel is the node label the pools of these tests select on; each spec uses its own value,
// so that the nodes of one spec never match the pool of another.
const testLabel = "test.strata.dev/pool"

var specID atomic.Int32

var _ = Describe("TierPool reconciler", func() {
	var (
		// selected is the value of testLabel this spec's nodes carry to be selected.
		selected string
		selector map[string]string
	)

	BeforeEach(func() {
		selected = fmt.Sprintf("spec-%d", specID.Add(1))
		selector = map[string]string{testLabel: selected}
	})

	It("counts the nodes that match spec.nodeSelector and no other", func() {
		createNode(selector)
		createNode(selector)
		createNode(map[string]string{testLabel: selected + "-other"})
		createNode(nil)
		pool := createPool(selector, nil, memTier("2Gi"))

		Eventually(func(g Gomega) {
			p := getPool(g, pool.Name)
			g.Expect(p.Status.Nodes).To(BeEquivalentTo(2))
			g.Expect(p.Status.ReadyWorkers).To(BeZero())
			g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
			ready := readyCondition(g, p)
			g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
			// envtest runs no DaemonSet controller: the worker DaemonSet exists but has no pod.
			g.Expect(ready.Reason).To(Equal(ReasonWorkersNotReady))
			g.Expect(ready.Message).To(HavePrefix("0 of 2 worker(s) ready"))
			g.Expect(ready.ObservedGeneration).To(Equal(p.Generation))
		}).Should(Succeed(), "awaiting status.nodes = 2 (the two labelled nodes) and Ready=False/WorkersNotReady")

		By("showing no ready worker as 0, not as nothing, in `kubectl get tierpools`")
		raw := &unstructured.Unstructured{}
		raw.SetGroupVersionKind(datav1alpha1.GroupVersion.WithKind("TierPool"))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: pool.Name}, raw)).To(Succeed())
		ready, found, err := unstructured.NestedInt64(raw.Object, "status", "readyWorkers")
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue(), "status.readyWorkers is written when it is 0")
		Expect(ready).To(BeZero())
	})

	It("leaves out a node whose taint the pool does not tolerate, and counts it once the pool tolerates it", func() {
		createNode(selector)
		createNode(selector, corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule})
		pool := createPool(selector, nil, memTier("1Gi"))

		Eventually(func(g Gomega) {
			p := getPool(g, pool.Name)
			g.Expect(p.Status.Nodes).To(BeEquivalentTo(1))
			g.Expect(readyCondition(g, p).Message).To(ContainSubstring(
				"1 more node(s) match spec.nodeSelector but have a taint the pool does not tolerate, such as dedicated=gpu:NoSchedule"))
		}).Should(Succeed(), "awaiting status.nodes = 1: the tainted node is not counted")

		patchPool(pool, func(p *datav1alpha1.TierPool) {
			p.Spec.Tolerations = []corev1.Toleration{{
				Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule,
			}}
		})
		Eventually(func(g Gomega) {
			p := getPool(g, pool.Name)
			g.Expect(p.Status.Nodes).To(BeEquivalentTo(2))
			g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
			g.Expect(readyCondition(g, p).Message).NotTo(ContainSubstring("taint"))
		}).Should(Succeed(), "awaiting status.nodes = 2 after the pool tolerates the taint")
	})

	It("follows nodes that are added, labelled and deleted", func() {
		createNode(selector)
		unlabelled := createNode(nil)
		pool := createPool(selector, nil, memTier("1Gi"))
		expectNodes(pool, 1, "awaiting status.nodes = 1, the one labelled node")

		added := createNode(selector)
		expectNodes(pool, 2, "awaiting status.nodes = 2 after a matching node is created")

		patchNode(unlabelled, func(n *corev1.Node) { n.Labels = selector })
		expectNodes(pool, 3, "awaiting status.nodes = 3 after a node gets the selected label")

		Expect(k8sClient.Delete(ctx, added)).To(Succeed())
		expectNodes(pool, 2, "awaiting status.nodes = 2 after a matching node is deleted")
	})

	It("reports Ready=False/NoNodesSelected with what to fix when no node matches", func() {
		createNode(nil)
		pool := createPool(map[string]string{testLabel: selected, "strata.dev/cache": "true"}, nil, memTier("4Gi"))

		Eventually(func(g Gomega) {
			p := getPool(g, pool.Name)
			g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
			g.Expect(p.Status.Nodes).To(BeZero())
			g.Expect(p.Status.Tiers).To(ConsistOf(datav1alpha1.TierStatus{
				Name: "mem", Medium: datav1alpha1.MediumMemory, CapacityBytes: 0, UsedBytes: 0,
			}))
			ready := readyCondition(g, p)
			g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(ready.Reason).To(Equal(ReasonNoNodesSelected))
			g.Expect(ready.Message).To(Equal(fmt.Sprintf(
				"no node matches spec.nodeSelector {strata.dev/cache=true, %[1]s=%[2]s}: label nodes with "+
					"`kubectl label node <node> strata.dev/cache=true %[1]s=%[2]s` or change the selector",
				testLabel, selected)))
		}).Should(Succeed(), "awaiting Ready=False/NoNodesSelected with a message that says how to label nodes")
	})

	It("reports Ready=False/NoNodesSelected naming the taint when every matching node is tainted", func() {
		createNode(selector, corev1.Taint{Key: "maintenance", Effect: corev1.TaintEffectNoExecute})
		pool := createPool(selector, nil, memTier("1Gi"))

		Eventually(func(g Gomega) {
			p := getPool(g, pool.Name)
			g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
			g.Expect(p.Status.Nodes).To(BeZero())
			ready := readyCondition(g, p)
			g.Expect(ready.Reason).To(Equal(ReasonNoNodesSelected))
			g.Expect(ready.Message).To(Equal(fmt.Sprintf(
				"1 node(s) match spec.nodeSelector {%s=%s}, but each has a taint the pool does not tolerate, "+
					"such as maintenance:NoExecute: add a toleration to spec.tolerations or remove the taint from the nodes",
				testLabel, selected)))
		}).Should(Succeed(), "awaiting Ready=False/NoNodesSelected naming the taint")
	})

	It("sets each tier's capacity to its quota times the number of nodes, and nothing used", func() {
		for range 3 {
			createNode(selector)
		}
		pool := createPool(selector, nil,
			memTier("2Gi"),
			datav1alpha1.Tier{
				Name: "nvme", Medium: datav1alpha1.MediumNVMe, Paths: []string{"/mnt/strata/nvme0"},
				Quota: resource.MustParse("20Gi"), Watermarks: datav1alpha1.Watermarks{High: 0.95, Low: 0.8},
			})

		Eventually(func(g Gomega) []datav1alpha1.TierStatus {
			return getPool(g, pool.Name).Status.Tiers
		}).Should(Equal([]datav1alpha1.TierStatus{
			{Name: "mem", Medium: datav1alpha1.MediumMemory, CapacityBytes: 3 * 2 << 30, UsedBytes: 0},
			{Name: "nvme", Medium: datav1alpha1.MediumNVMe, CapacityBytes: 3 * 20 << 30, UsedBytes: 0},
		}), "awaiting capacity 3 × 2Gi for mem and 3 × 20Gi for nvme, in spec order")
	})

	It("makes the master forget the workers of a deleted pool, and no other's", func() {
		pool := createPool(selector, nil, memTier("2Gi"))
		other := pool.Name + "-other/node-a"
		for _, id := range []string{pool.Name + "/node-a", pool.Name + "/node-b", other} {
			_, err := lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: id, Node: strings.TrimPrefix(id, pool.Name+"/")})
			Expect(err).NotTo(HaveOccurred())
		}
		_, err := lineageMaster.MarkWorkerLost(ctx, pool.Name+"/node-b", "test: node gone")
		Expect(err).NotTo(HaveOccurred())

		Expect(k8sClient.Delete(ctx, pool)).To(Succeed())
		Eventually(func(g Gomega) {
			workers, err := lineageMaster.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
			g.Expect(err).NotTo(HaveOccurred())
			var ids []string
			for _, w := range workers.Workers {
				if strings.HasPrefix(w.Id, pool.Name) {
					ids = append(ids, w.Id)
				}
			}
			g.Expect(ids).To(ConsistOf(other), "the alive and the lost worker of the pool are forgotten")
		}).Should(Succeed())
	})

	It("forgets the lost workers of pools deleted while it was not looking, and no others", func() {
		prefix := fmt.Sprintf("gone-%d", specID.Add(1))
		kept := createPool(selector, nil, memTier("2Gi"))
		ids := map[string]bool{ // worker: whether it is lost
			prefix + "/node-lost": true, prefix + "/node-alive": false, kept.Name + "/node-lost": true,
		}
		for id, lost := range ids {
			_, err := lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: id, Node: "n"})
			Expect(err).NotTo(HaveOccurred())
			if lost {
				_, err = lineageMaster.MarkWorkerLost(ctx, id, "test: node gone")
				Expect(err).NotTo(HaveOccurred())
			}
		}
		(&TierPoolReconciler{Client: k8sClient, Forgetter: lineageMaster}).forgetOrphans(ctx, time.Now())
		workers, err := lineageMaster.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
		Expect(err).NotTo(HaveOccurred())
		var left []string
		for _, w := range workers.Workers {
			if _, ours := ids[w.Id]; ours {
				left = append(left, w.Id)
			}
		}
		Expect(left).To(ConsistOf(prefix+"/node-alive", kept.Name+"/node-lost"),
			"the lost worker of a pool that is gone is forgotten; an alive one, and a lost one of a pool that exists, stay")
	})

	It("counts every node when spec.nodeSelector is empty", func() {
		createNode(nil)
		createNode(selector)
		pool := createPool(nil, nil, memTier("1Gi"))

		Eventually(func(g Gomega) {
			all := &corev1.NodeList{}
			g.Expect(k8sClient.List(ctx, all)).To(Succeed())
			g.Expect(all.Items).NotTo(BeEmpty())
			g.Expect(getPool(g, pool.Name).Status.Nodes).To(BeEquivalentTo(len(all.Items)))
		}).Should(Succeed(), "awaiting status.nodes = the number of nodes in the cluster")
	})

	It("records an Event when the number of selected nodes changes", func() {
		pool := createPool(selector, nil, memTier("1Gi"))
		Eventually(func(g Gomega) {
			g.Expect(readyCondition(g, getPool(g, pool.Name)).Reason).To(Equal(ReasonNoNodesSelected))
		}).Should(Succeed(), "awaiting the first status, with no node")

		createNode(selector)
		Eventually(func(g Gomega) []string {
			events := &corev1.EventList{}
			// Events about a cluster-scoped object go to the namespace "default".
			g.Expect(k8sClient.List(ctx, events, client.InNamespace(metav1.NamespaceDefault),
				client.MatchingFields{"involvedObject.name": pool.Name})).To(Succeed())
			var messages []string
			for _, e := range events.Items {
				if e.Reason == EventReasonNodesChanged && e.InvolvedObject.UID == pool.UID {
					messages = append(messages, e.Message)
				}
			}
			return messages
		}).Should(ContainElement("TierPool selects 1 node(s), was 0"),
			"awaiting a NodesChanged Event on the pool once a matching node appears")
	})
})

var _ = Describe("Which taints keep a pool's worker off a node", func() {
	gpuTaint := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}

	DescribeTable("untoleratedTaint",
		func(taint corev1.Taint, tolerations []corev1.Toleration, keptOff bool) {
			got := untoleratedTaint([]corev1.Taint{taint}, tolerations)
			if keptOff {
				Expect(got).To(HaveValue(Equal(taint)))
			} else {
				Expect(got).To(BeNil())
			}
		},
		Entry("a NoSchedule taint the pool does not tolerate keeps it off", gpuTaint, nil, true),
		Entry("a NoExecute taint the pool does not tolerate keeps it off",
			corev1.Taint{Key: "maintenance", Effect: corev1.TaintEffectNoExecute}, nil, true),
		Entry("a PreferNoSchedule taint does not",
			corev1.Taint{Key: "spot", Effect: corev1.TaintEffectPreferNoSchedule}, nil, false),
		Entry("a taint tolerated by key with Exists does not", gpuTaint,
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}, false),
		Entry("a taint tolerated by key, value and effect does not", gpuTaint,
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}, false),
		Entry("a toleration of another value keeps it off", gpuTaint,
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "db"}}, true),
		Entry("a toleration of another effect keeps it off", gpuTaint,
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}, true),
		Entry("a cordoned node does not, since a DaemonSet tolerates it",
			corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}, nil, false),
		Entry("a node that has not been ready yet keeps it off, as it keeps a DaemonSet's pods off",
			corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}, nil, true),
		Entry("a node that stopped being ready does not evict it, since a DaemonSet tolerates that",
			corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}, nil, false),
	)
})

// createNode creates a ready Node with the given labels and taints and deletes it when the spec
// ends. There is no kubelet in envtest, so the Node is only an object; that is all the reconciler
// reads. The API server taints every new Node node.kubernetes.io/not-ready:NoSchedule (admission
// plugin TaintNodesByCondition) and the node lifecycle controller lifts the taint once the kubelet
// reports Ready; neither runs here, so createNode does the lifting.
func createNode(labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	GinkgoHelper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "strata-test-", Labels: labels}}
	Expect(k8sClient.Create(ctx, node)).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, node))).To(Succeed())
	})
	node.Spec.Taints = taints
	Expect(k8sClient.Update(ctx, node)).To(Succeed(), "replacing the taints of Node %s", node.Name)
	return node
}

// createPool creates a TierPool and deletes it when the spec ends.
func createPool(selector map[string]string, tolerations []corev1.Toleration, tiers ...datav1alpha1.Tier) *datav1alpha1.TierPool {
	GinkgoHelper()
	pool := &datav1alpha1.TierPool{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "strata-test-"},
		Spec: datav1alpha1.TierPoolSpec{
			NodeSelector: selector,
			Tolerations:  tolerations,
			Tiers:        tiers,
			BlockSize:    resource.MustParse("64Mi"),
		},
	}
	Expect(k8sClient.Create(ctx, pool)).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pool))).To(Succeed())
	})
	return pool
}

// memTier is a MEM tier named mem with the given quota per node.
func memTier(quota string) datav1alpha1.Tier {
	return datav1alpha1.Tier{
		Name: "mem", Medium: datav1alpha1.MediumMemory, Paths: []string{"/mnt/strata/mem"},
		Quota: resource.MustParse(quota), Watermarks: datav1alpha1.Watermarks{High: 0.9, Low: 0.7},
	}
}

func getPool(g Gomega, name string) *datav1alpha1.TierPool {
	pool := &datav1alpha1.TierPool{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, pool)).To(Succeed())
	return pool
}

func readyCondition(g Gomega, pool *datav1alpha1.TierPool) *metav1.Condition {
	ready := meta.FindStatusCondition(pool.Status.Conditions, datav1alpha1.ConditionReady)
	g.Expect(ready).NotTo(BeNil(), "TierPool %s has no Ready condition yet", pool.Name)
	return ready
}

func expectNodes(pool *datav1alpha1.TierPool, nodes int, awaiting string) {
	GinkgoHelper()
	Eventually(func(g Gomega) int32 {
		return getPool(g, pool.Name).Status.Nodes
	}).Should(BeEquivalentTo(nodes), awaiting)
}

func patchPool(pool *datav1alpha1.TierPool, change func(*datav1alpha1.TierPool)) {
	GinkgoHelper()
	current := &datav1alpha1.TierPool{}
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pool), current)).To(Succeed())
	before := current.DeepCopy()
	change(current)
	Expect(k8sClient.Patch(ctx, current, client.MergeFrom(before))).To(Succeed())
}

func patchNode(node *corev1.Node, change func(*corev1.Node)) {
	GinkgoHelper()
	current := &corev1.Node{}
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(node), current)).To(Succeed())
	before := current.DeepCopy()
	change(current)
	Expect(k8sClient.Patch(ctx, current, client.MergeFrom(before))).To(Succeed())
}
