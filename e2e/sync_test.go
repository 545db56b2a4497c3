//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

var _ = Describe("A Dataset synced with its source", Ordered, Label("smoke", "sync"), func() {
	var (
		namespace, pool, prefix string
		nodes                   []string
		written                 []object
	)
	const bucket = "e2e-sync"

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-sync-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "sync", "4Mi")
		prefix = namespace + "/"
		By("writing a 10 MiB file of three blocks and two small files to MinIO")
		written = append(written, putObjects(ctx, namespace, nodes[0], bucket, []string{prefix + "train.bin"}, 10<<20, 1)...)
		written = append(written, putObjects(ctx, namespace, nodes[0], bucket, []string{prefix + "keep.txt", prefix + "gone.txt"}, 3000, 2)...)
		trimPrefix(written, prefix)
		Expect(k8sClient.Create(ctx, minioDataset(namespace, "shared", pool, "s3://"+bucket+"/"+prefix))).To(Succeed())
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("serves the source to pods on both nodes", func(ctx SpecContext) {
		waitReady(ctx, &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: namespace}})
		for _, node := range nodes {
			Expect(sumClaim(ctx, namespace, node, "shared")).To(Equal(contents(written)), "read on %s", node)
		}
	})

	It("shows every node's mount an overwritten, a removed and a new object after a sync a user asks for, while open files keep their version", func(ctx SpecContext) {
		By("holding the large file open on both nodes, part read, until later/new.txt appears in the mount")
		var holders []*corev1.Pod
		for _, node := range nodes {
			pod := claimPod(namespace, node, "shared", "hold", "--wait-for", "/data/later/new.txt", "/data/train.bin")
			Expect(k8sClient.Create(ctx, pod)).To(Succeed())
			holders = append(holders, pod)
		}
		for _, pod := range holders {
			Eventually(func() string { return podLogs(ctx, pod) }).WithContext(ctx).WithTimeout(2*minute).
				Should(ContainSubstring("holding /data/train.bin open"), "waiting for the holder on %s", pod.Spec.NodeName)
		}

		By("overwriting train.bin with other bytes and another size, removing gone.txt and adding later/new.txt in MinIO")
		replaced := putObjects(ctx, namespace, nodes[0], bucket, []string{prefix + "train.bin"}, 7<<20+12345, 9)
		added := putObjects(ctx, namespace, nodes[0], bucket, []string{prefix + "later/new.txt"}, 5000, 10)
		runPod(ctx, testkitPod(namespace, nodes[0], "s3", "rm", "--endpoint", minioEndpoint, "--bucket", bucket, "--key", prefix+"gone.txt"))
		trimPrefix(replaced, prefix)
		trimPrefix(added, prefix)

		By("asking for a sync with one kubectl command")
		out, err := kubectl("-n", namespace, "annotate", "dataset", "shared", datav1alpha1.AnnotationSyncRequested+"=first", "--overwrite")
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		ds := waitSynced(ctx, namespace, "shared", "first")
		Expect(ds.Status.Sync.Mounts).To(BeEquivalentTo(2), "the holders keep a mount on both nodes")
		Expect([]int64{ds.Status.Sync.Added, ds.Status.Sync.Removed, ds.Status.Sync.Changed}).To(Equal([]int64{1, 1, 1}))

		By("the holders see later/new.txt appear, and read train.bin on as the version they opened, whole")
		old := one(filterKey(written, "train.bin"))
		for _, pod := range holders {
			got := runLogsWhenDone(ctx, pod)
			Expect(got).To(HaveExactElements(And(HaveField("Bytes", old.Bytes), HaveField("SHA256", old.SHA256))),
				"the holder on %s read the version it opened, whole", pod.Spec.NodeName)
		}

		By("new pods on both nodes read the source as it is now, byte for byte")
		want := append(append(filterKey(written, "keep.txt"), replaced...), added...)
		for _, node := range nodes {
			Expect(sumClaim(ctx, namespace, node, "shared")).To(Equal(contents(want)), "read on %s after the sync", node)
		}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Files).To(BeEquivalentTo(3), "the status counts the synced tree")
		}).WithContext(ctx).WithTimeout(minute).Should(Succeed())
	})

	It("never hands a reader that loops through the files while they are overwritten and synced bytes of no version", func(ctx SpecContext) {
		versions := map[string][]string{} // key: the SHA-256 of every version it had
		for _, o := range append(sumClaim(ctx, namespace, nodes[1], "shared"), written...) {
			versions[o.Key] = append(versions[o.Key], o.SHA256)
		}
		By("reading the whole Dataset on " + nodes[1] + " round after round until the object stop appears")
		reader := claimPod(namespace, nodes[1], "shared", "sum", "--until", "/data/stop", "/data")
		Expect(k8sClient.Create(ctx, reader)).To(Succeed())
		Eventually(func() string { return podLogs(ctx, reader) }).WithContext(ctx).WithTimeout(2 * minute).Should(ContainSubstring(`"key":"keep.txt"`))

		for round := range 3 {
			By(fmt.Sprintf("round %d: overwriting train.bin and keep.txt, then syncing", round+1))
			keys := []string{prefix + "train.bin", prefix + "keep.txt"}
			newer := putObjects(ctx, namespace, nodes[0], bucket, keys, int64(3<<20+round*4096), 100+round)
			trimPrefix(newer, prefix)
			for _, o := range newer {
				versions[o.Key] = append(versions[o.Key], o.SHA256)
			}
			request := fmt.Sprintf("loop-%d", round)
			out, err := kubectl("-n", namespace, "annotate", "dataset", "shared", datav1alpha1.AnnotationSyncRequested+"="+request, "--overwrite")
			Expect(err).NotTo(HaveOccurred(), "%s", out)
			waitSynced(ctx, namespace, "shared", request)
		}
		stop := putObjects(ctx, namespace, nodes[0], bucket, []string{prefix + "stop"}, 1, 1)
		trimPrefix(stop, prefix)
		versions["stop"] = []string{stop[0].SHA256}
		out, err := kubectl("-n", namespace, "annotate", "dataset", "shared", datav1alpha1.AnnotationSyncRequested+"=stop", "--overwrite")
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		waitSynced(ctx, namespace, "shared", "stop")

		reads := runLogsWhenDone(ctx, reader)
		seen := map[string]map[string]bool{}
		for _, r := range reads {
			Expect(versions).To(HaveKey(r.Key), "the reader met a file that never existed")
			Expect(versions[r.Key]).To(ContainElement(r.SHA256), "%s read as %d bytes that match no version of it", r.Key, r.Bytes)
			if seen[r.Key] == nil {
				seen[r.Key] = map[string]bool{}
			}
			seen[r.Key][r.SHA256] = true
		}
		Expect(len(seen["train.bin"])).To(BeNumerically(">=", 2), "the reader saw the file change under it (%d reads)", len(reads))
		GinkgoWriter.Printf("the looping reader read %d files, %d versions of train.bin; failed rounds: %d\n",
			len(reads), len(seen["train.bin"]), strings.Count(podLogs(ctx, reader), "testkit: round"))
	})

	It("shows a node that mounts the Dataset later the tree the other node shows, until a sync", func(ctx SpecContext) {
		viewPrefix := namespace + "-view/"
		before := putObjects(ctx, namespace, nodes[0], bucket, []string{viewPrefix + "a.bin", viewPrefix + "b.bin"}, 70000, 20)
		trimPrefix(before, viewPrefix)
		ds := minioDataset(namespace, "view", pool, "s3://"+bucket+"/"+viewPrefix)
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)

		By("holding the Dataset mounted on " + nodes[0])
		holder := claimPod(namespace, nodes[0], "view", "hold", "--wait-for", "/data/never", "/data/a.bin")
		Expect(k8sClient.Create(ctx, holder)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, holder))).To(Succeed()) })
		Eventually(func() string { return podLogs(ctx, holder) }).WithContext(ctx).WithTimeout(2 * minute).Should(ContainSubstring("holding /data/a.bin open"))

		By("adding c.bin to the bucket, without a sync: " + nodes[1] + " mounts the Dataset and shows " + nodes[0] + "'s tree")
		added := putObjects(ctx, namespace, nodes[0], bucket, []string{viewPrefix + "c.bin"}, 5000, 21)
		trimPrefix(added, viewPrefix)
		Expect(sumClaim(ctx, namespace, nodes[1], "view")).To(Equal(contents(before)), "one tree on every node")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
		Expect(ds.Status.Files).To(BeEquivalentTo(2), "the status counts the tree the mounts show")

		By("a sync showing c.bin on both nodes, and in the status")
		out, err := kubectl("-n", namespace, "annotate", "dataset", "view", datav1alpha1.AnnotationSyncRequested+"=view", "--overwrite")
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		waitSynced(ctx, namespace, "view", "view")
		for _, node := range nodes {
			Expect(sumClaim(ctx, namespace, node, "view")).To(Equal(contents(append(before, added...))), "read on %s after the sync", node)
		}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Files).To(BeEquivalentTo(3))
		}).WithContext(ctx).WithTimeout(minute).Should(Succeed())
	})
})

// waitSynced waits until the Dataset's last sync answered request and reached every mount,
// and returns the Dataset.
func waitSynced(ctx context.Context, namespace, name, request string) *datav1alpha1.Dataset {
	GinkgoHelper()
	ds := &datav1alpha1.Dataset{}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ds)).To(Succeed())
		c := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionSynced)
		g.Expect(c).NotTo(BeNil(), "no sync yet")
		g.Expect(ds.Status.Sync).NotTo(BeNil(), "%s: %s", c.Reason, c.Message)
		g.Expect(ds.Status.Sync.Request).To(Equal(request), "%s: %s", c.Reason, c.Message)
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
	}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the sync %q of Dataset %s", request, name)
	return ds
}

// trimPrefix names objects by their key below prefix, as a Dataset's mount shows them.
func trimPrefix(objs []object, prefix string) {
	for i := range objs {
		objs[i].Key = strings.TrimPrefix(objs[i].Key, prefix)
	}
}

// filterKey returns the objects of objs named key.
func filterKey(objs []object, key string) []object {
	var out []object
	for _, o := range objs {
		if o.Key == key {
			out = append(out, o)
		}
	}
	return out
}
