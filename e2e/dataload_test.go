//go:build e2e

package e2e

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// #20: a DataLoad of selected paths onto a chosen node, whose progress reaches 100% only when
// every selected byte is on that node, as the master's count of the node's blocks confirms.
var _ = Describe("A DataLoad of selected paths onto a chosen node", Ordered, Label("smoke", "dataload"), func() {
	const (
		bucket   = "e2e-dataload"
		fileSize = 3 << 20 // three blocks of the pool's 1 MiB
	)
	var namespace string
	AfterEach(func() { dumpOnFailure(namespace) })

	It("loads exactly the selection onto the node, and says Loaded once the node holds all of it", func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-dataload-")
		nodes := cacheNodes(ctx)
		Expect(len(nodes)).To(BeNumerically(">=", 2))
		chosen := nodes[len(nodes)-1]
		keys := []string{namespace + "/train/a.bin", namespace + "/train/b.bin", namespace + "/test/c.bin"}
		putObjects(ctx, namespace, nodes[0], bucket, keys, fileSize, 21)
		pool := memoryPool(ctx, "load", "1Mi")
		ds := minioDataset(namespace, "images", pool, "s3://"+bucket+"/"+namespace+"/")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)

		dl := &datav1alpha1.DataLoad{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: namespace},
			Spec: datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Paths: []string{"train/**"}, Nodes: []string{chosen}}}
		Expect(k8sClient.Create(ctx, dl)).To(Succeed())

		By("waiting for Loaded; whenever the status says 100%, the node holds every selected byte")
		const selected = 2 * fileSize
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(dl), dl)).To(Succeed())
			if dl.Status.Progress == "100%" {
				g.Expect(dl.Status.Bytes).To(Equal(datav1alpha1.LoadCount{Done: selected, Total: selected}))
			}
			c := meta.FindStatusCondition(dl.Status.Conditions, datav1alpha1.ConditionLoaded)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).NotTo(BeElementOf(datav1alpha1.ReasonLoadFailed, datav1alpha1.ReasonNotAllHeld), c.Message)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for the DataLoad to say Loaded")
		Expect(dl.Status.Phase).To(Equal(datav1alpha1.DataLoadLoaded))
		Expect(dl.Status.Progress).To(Equal("100%"))
		Expect(dl.Status.Files).To(Equal(datav1alpha1.LoadCount{Done: 2, Total: 2}))
		Expect(dl.Status.Nodes).To(ConsistOf(HaveField("Node", chosen)))
		GinkgoWriter.Printf("DataLoad %s: %s, %d of %d files, %d of %d bytes on %s\n", dl.Name, dl.Status.Progress,
			dl.Status.Files.Done, dl.Status.Files.Total, dl.Status.Bytes.Done, dl.Status.Bytes.Total, chosen)

		By("checking with the master: the chosen node holds the selection, and no other node anything")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Nodes).To(ConsistOf(datav1alpha1.NodeUsage{Node: chosen, Bytes: selected}),
				fmt.Sprintf("test/c.bin (%d bytes) is not selected and must not be loaded", fileSize))
		}).WithContext(ctx).WithTimeout(2 * minute).Should(Succeed())
	})
})
