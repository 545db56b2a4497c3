//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// object is one line of testkit's output, as `s3 put` and `sum` print it.
type object struct {
	Key     string  `json:"key"`
	Bytes   int64   `json:"bytes"`
	SHA256  string  `json:"sha256"`
	ETag    string  `json:"etag,omitempty"`
	Seconds float64 `json:"seconds"`
	// FirstRead is when `testkit sum --summary` had read its first file whole.
	FirstRead time.Time `json:"firstRead"`
}

var _ = Describe("Datasets mounted through the CSI driver", Ordered, Label("smoke", "csi"), func() {
	var (
		namespace string
		pool      string
		nodes     []string
		written   []object
	)
	const bucket = "e2e-csi"

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-csi-")
		nodes = cacheNodes(ctx)

		// A small block size, so that the large file spans several blocks.
		pool = memoryPool(ctx, "csi", "4Mi")

		By("writing nested folders, a 21 MiB file, a thousand small files and names with spaces and accents to MinIO")
		prefix := namespace + "/"
		var small []string
		for i := range 1000 {
			small = append(small, fmt.Sprintf("%ssmall/%03d/part-%d.txt", prefix, i%10, i))
		}
		written = append(written, putObjects(ctx, namespace, nodes[0], bucket, []string{prefix + "big/train.bin"}, 21<<20, 1)...)
		written = append(written, putObjects(ctx, namespace, nodes[0], bucket, small, 3000, 2)...)
		written = append(written, putObjects(ctx, namespace, nodes[0], bucket,
			[]string{prefix + "données/été 2024.csv", prefix + "with space/a b c.json"}, 70000, 3)...)
		for i := range written {
			written[i].Key = strings.TrimPrefix(written[i].Key, prefix)
		}

		ds := minioDataset(namespace, "corpus", pool, "s3://"+bucket+"/"+prefix)
		ds.Spec.Preload = true
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("makes the Dataset Ready once the driver and the pool's workers run", func(ctx SpecContext) {
		waitReady(ctx, &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "corpus", Namespace: namespace}})
	})

	It("preloads the Dataset: all of it is cached before any pod reads it", func(ctx SpecContext) {
		Eventually(func(g Gomega) {
			var ds datav1alpha1.Dataset
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "corpus"}, &ds)).To(Succeed())
			c := meta.FindStatusCondition(ds.Status.Conditions, "Preloaded")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).NotTo(Equal("PreloadFailed"), "%s", c.Message)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
			g.Expect(ds.Status.Phase).To(Equal(datav1alpha1.DatasetReady))
			g.Expect(ds.Status.CachedPercentage).To(Equal("100%"), "cached %d of %d bytes", ds.Status.CachedBytes, ds.Status.TotalBytes)
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for the preload of Dataset corpus")
	})

	It("serves every byte, name and size of the source to pods on both nodes", func(ctx SpecContext) {
		for _, node := range nodes {
			By("reading the Dataset through its claim on " + node)
			read := sumClaim(ctx, namespace, node, "corpus")
			Expect(read).To(Equal(contents(written)), "what a pod on %s read differs from what was written", node)
		}

		By("showing in the Dataset's status that the workers now hold all of it")
		var total int64
		for _, o := range written {
			total += o.Bytes
		}
		Eventually(func(g Gomega) {
			var ds datav1alpha1.Dataset
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "corpus"}, &ds)).To(Succeed())
			g.Expect(ds.Status.Files).To(BeEquivalentTo(len(written)))
			g.Expect(ds.Status.TotalBytes).To(Equal(total))
			g.Expect(ds.Status.CachedPercentage).To(Equal("100%"), "cached %d of %d bytes", ds.Status.CachedBytes, total)
			g.Expect(ds.Status.Tiers).To(ContainElement(HaveField("Tier", "mem")))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the Dataset's status to show it cached")
	})

	It("serves a Dataset whose source is a claim of its namespace, through the claim server Strata runs there", func(ctx SpecContext) {
		By("copying the corpus into a claim bound to a host folder of " + nodes[0])
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-raw-" + namespace},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				ClaimRef:                      &corev1.ObjectReference{Namespace: namespace, Name: "raw"},
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
					Path: "/var/local/strata-e2e/" + namespace, Type: ptr.To(corev1.HostPathDirectoryOrCreate),
				}},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{nodes[0]}}},
				}}}},
			},
		}
		Expect(k8sClient.Create(ctx, pv)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pv))).To(Succeed()) })
		empty := ""
		Expect(k8sClient.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "raw", Namespace: namespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: pv.Spec.AccessModes, StorageClassName: &empty, VolumeName: pv.Name,
				Resources: corev1.VolumeResourceRequirements{Requests: pv.Spec.Capacity},
			},
		})).To(Succeed())
		copier := copyPod(namespace, nodes[0], "corpus", "raw", "/out/tree")
		Expect(k8sClient.Create(ctx, copier)).To(Succeed())
		waitSucceeded(ctx, copier)

		By("applying a Dataset of pvc://raw/tree and reading it on the other node, " + nodes[1])
		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "from-claim", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Source:       &datav1alpha1.DatasetSource{URI: "pvc://raw/tree"},
				TierPoolName: pool,
			},
		}
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)
		Expect(ds.Status.Files).To(BeEquivalentTo(len(written)), "the operator counted the claim's files through the claim server")
		Expect(sumClaim(ctx, namespace, nodes[1], "from-claim")).To(Equal(contents(written)))

		By("mounting the claim beside a folder of the bucket, each at a folder of one tree, through a claim server of the mount's own")
		bucketFolder := minioDataset(namespace, "unused", pool, "s3://"+bucket+"/"+namespace+"/données/").Spec.Source
		both := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "claim-and-bucket", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Mounts: []datav1alpha1.DatasetMount{
					{Path: "/claim", Source: datav1alpha1.DatasetSource{URI: "pvc://raw/tree"}},
					{Path: "/csv", Source: *bucketFolder},
				},
				TierPoolName: pool,
			},
		}
		Expect(k8sClient.Create(ctx, both)).To(Succeed())
		waitReady(ctx, both)
		var want []object
		for _, o := range written {
			if name, ok := strings.CutPrefix(o.Key, "données/"); ok {
				want = append(want, object{Key: "csv/" + name, Bytes: o.Bytes, SHA256: o.SHA256})
			}
			o.Key = "claim/" + o.Key
			want = append(want, o)
		}
		Expect(sumClaim(ctx, namespace, nodes[1], "claim-and-bucket")).To(Equal(contents(want)))
	})

	It("runs a pipeline of Lineages whose outputs live in memory, and serves them whole on the other node", func(ctx SpecContext) {
		By("applying the second step first: it waits for the first, which copies the corpus on " + nodes[0])
		steps := []struct{ name, input, output string }{
			{"copy-again", "corpus-copy", "corpus-copy-2"},
			{"copy", "corpus", "corpus-copy"},
		}
		for _, step := range steps {
			Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: step.output, Namespace: namespace},
				Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: step.name}, TierPoolName: pool},
			})).To(Succeed())
		}
		Expect(k8sClient.Create(ctx, copyLineage(namespace, "copy-again", "corpus-copy", "corpus-copy-2", nodes[0], true))).To(Succeed())
		waitLineage(ctx, namespace, "copy-again", "WaitingForInputs")
		Expect(k8sClient.Create(ctx, copyLineage(namespace, "copy", "corpus", "corpus-copy", nodes[0], true))).To(Succeed())
		waitLineage(ctx, namespace, "copy", "Written")
		waitLineage(ctx, namespace, "copy-again", "Written")

		By("reading both outputs on " + nodes[1] + ": every byte comes from the writer's memory tier")
		Expect(sumClaim(ctx, namespace, nodes[1], "corpus-copy")).To(Equal(contents(written)))
		Expect(sumClaim(ctx, namespace, nodes[1], "corpus-copy-2")).To(Equal(contents(written)))

		By("showing the outputs in memory, two uncheckpointed steps deep, in the status")
		Eventually(func(g Gomega) {
			var l datav1alpha1.Lineage
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "copy-again"}, &l)).To(Succeed())
			g.Expect(l.Status.Outputs).To(HaveExactElements(HaveField("State", datav1alpha1.OutputInMemory)))
			g.Expect(l.Status.UncheckpointedDepth).To(BeEquivalentTo(2))
			var ds datav1alpha1.Dataset
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "corpus-copy-2"}, &ds)).To(Succeed())
			g.Expect(ds.Status.Files).To(BeEquivalentTo(len(written)))
			g.Expect(ds.Status.CachedPercentage).To(Equal("100%"))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the status of the outputs")

		By("a pod that mounts an output read-only cannot write to it")
		intruder := claimPod(namespace, nodes[1], "corpus-copy", "copy", "/data/big", "/data/big-again")
		Expect(k8sClient.Create(ctx, intruder)).To(Succeed())
		waitFailedWith(ctx, intruder, "read-only file system")

		By("a second run of the step, mounting the output writable on " + nodes[0] + ", finds it complete")
		rerun := copyPod(namespace, nodes[0], "corpus", "corpus-copy", "/out/again")
		Expect(k8sClient.Create(ctx, rerun)).To(Succeed())
		waitFailedWith(ctx, rerun, "read-only file system")
		Expect(sumClaim(ctx, namespace, nodes[1], "corpus-copy")).To(Equal(contents(written)), "the output is as its Job wrote it")
	})

	It("provisions a writable volume for a claim of a Strata StorageClass, and deletes it with the claim", func(ctx SpecContext) {
		By("creating a StorageClass of pool " + pool + " and a claim of it")
		pvc := writableClaim(ctx, namespace, pool, "scratch")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)).To(Succeed())
			g.Expect(pvc.Status.Phase).To(Equal(corev1.ClaimBound))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the claim to be bound to a provisioned volume")

		By("writing the corpus into it on " + nodes[1] + " and reading it back on " + nodes[0])
		writer := copyPod(namespace, nodes[1], "corpus", "scratch", "/out")
		Expect(k8sClient.Create(ctx, writer)).To(Succeed())
		waitSucceeded(ctx, writer)
		Expect(sumClaim(ctx, namespace, nodes[0], "scratch")).To(Equal(contents(written)))

		By("deleting the claim once no pod uses it: its volume goes too")
		volume := pvc.Spec.VolumeName
		deletePodsUsing(ctx, namespace, "scratch") // finished pods still hold a claim
		Expect(k8sClient.Delete(ctx, pvc)).To(Succeed())
		Eventually(func(g Gomega) {
			err := k8sClient.Get(ctx, client.ObjectKey{Name: volume}, &corev1.PersistentVolume{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "volume %s: %v", volume, err)
		}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for the released volume to be deleted")
	})

	It("steers a pod that mounts a Dataset to the node that holds it", func(ctx SpecContext) {
		By("caching a second Dataset of the same objects on " + nodes[1] + " alone")
		ds := minioDataset(namespace, "hinted", pool, "s3://"+bucket+"/"+namespace+"/small/")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)
		Expect(sumClaim(ctx, namespace, nodes[1], "hinted")).To(HaveLen(1000))
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Nodes).To(HaveExactElements(HaveField("Node", nodes[1])))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the Dataset's status to say which node holds it")

		By("creating a pod that names no node: the operator's webhook makes it prefer " + nodes[1])
		reader := claimPod(namespace, "", "hinted", "sum", "--summary", "/data")
		runPod(ctx, reader)
		Expect(reader.Annotations).To(HaveKeyWithValue("data.strata.dev/preferred-nodes", nodes[1]+"=100"))
		Expect(reader.Spec.NodeName).To(Equal(nodes[1]), "the scheduler placed the pod away from the node that holds its data")
	})

	It("pins the paths a Dataset's CachePolicy names in its workers' tiers, and follows a change of them live", func(ctx SpecContext) {
		policy := &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "pin-first", Namespace: namespace},
			Spec:       datav1alpha1.CachePolicySpec{PinnedPaths: []string{"000/**"}},
		}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		ds := minioDataset(namespace, "pinned", pool, "s3://"+bucket+"/"+namespace+"/small/")
		ds.Spec.CachePolicyName = policy.Name
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)

		By("reading the Dataset on " + nodes[0] + ": the blocks of its 100 files under 000/ are pinned there")
		Expect(sumClaim(ctx, namespace, nodes[0], "pinned")).To(HaveLen(1000))
		pinnedBlocks := func(g Gomega) int {
			n, found := workerMetric(ctx, g, pool, nodes[0], "strata_worker_tier_pinned_blocks", `tier="mem"`)
			g.Expect(found).To(BeTrue(), "the worker exports strata_worker_tier_pinned_blocks")
			return int(n)
		}
		// The operator marks the worker's pod, so that its kubelet writes the new policies file
		// at once; the worker reads it every 10 s.
		Eventually(pinnedBlocks).WithContext(ctx).WithTimeout(3*minute).Should(Equal(100), "waiting for the worker to pin the blocks of 000/**")

		By("pinning 001/ too: the worker pins the blocks it already holds, its pod untouched")
		before := workerPod(ctx, pool, nodes[0])
		Eventually(func(g Gomega) {
			// The operator writes the policy's status meanwhile: read, change, retry.
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
			policy.Spec.PinnedPaths = []string{"000/**", "001/*.txt"}
			g.Expect(k8sClient.Update(ctx, policy)).To(Succeed())
		}).WithContext(ctx).Should(Succeed())
		Eventually(pinnedBlocks).WithContext(ctx).WithTimeout(3*minute).Should(Equal(200), "waiting for the worker to pin 001/ as well")
		Expect(workerPod(ctx, pool, nodes[0]).UID).To(Equal(before.UID), "a policy change is applied live, not by a new pod")
	})

	It("keeps a Dataset within the share of the memory tier its CachePolicy gives it, and follows a change live", func(ctx SpecContext) {
		// 4% of the pool's 256 MiB memory tier is about 10 MiB, two and a half of its 4 MiB blocks:
		// the 21 MiB file cannot stay whole in memory on its own node.
		policy := &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "small-share", Namespace: namespace},
			Spec: datav1alpha1.CachePolicySpec{Eviction: datav1alpha1.EvictionSpec{
				Policy: datav1alpha1.EvictLFU, Watermarks: &datav1alpha1.Watermarks{High: 0.04, Low: 0.02}}},
		}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		ds := minioDataset(namespace, "shared", pool, "s3://"+bucket+"/"+namespace+"/big/")
		ds.Spec.CachePolicyName = policy.Name
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)
		var big object
		for _, o := range written {
			if o.Key == "big/train.bin" {
				big = o
			}
		}
		readAndCount := func(g Gomega) *datav1alpha1.Dataset {
			// Past the page cache, which the node keeps between pods (the worker keeps an idle
			// mount): every read reaches the worker, which caches what its share allows.
			read := contents(runPod(ctx, claimPod(namespace, nodes[0], "shared", "sum", "--uncached", "/data")))
			g.Expect(read).To(HaveExactElements(HaveField("SHA256", big.SHA256)), "every byte is right, whatever stays cached")
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			return ds
		}

		By("reading it on " + nodes[0] + ": its cached bytes stay within its share")
		before := workerPod(ctx, pool, nodes[0])
		// The worker reads its new policies file within about 10 s (the operator makes the
		// kubelet write it at once), and the status follows the master every half minute: read
		// until both have.
		Eventually(func(g Gomega) {
			ds := readAndCount(g)
			g.Expect(ds.Status.CachedBytes).To(And(BeNumerically(">", 0), BeNumerically("<=", 11<<20)))
		}).WithContext(ctx).WithTimeout(4*minute).WithPolling(minute/6).Should(Succeed(), "waiting for the share to hold")

		By("lifting the share: reading it again keeps all of it in memory, the worker's pod untouched")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
			policy.Spec.Eviction.Watermarks = nil
			g.Expect(k8sClient.Update(ctx, policy)).To(Succeed())
		}).WithContext(ctx).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(readAndCount(g).Status.CachedPercentage).To(Equal("100%"))
		}).WithContext(ctx).WithTimeout(4*minute).WithPolling(minute/6).Should(Succeed(), "waiting for the lifted share to let all of it stay")
		Expect(workerPod(ctx, pool, nodes[0]).UID).To(Equal(before.UID), "a policy change is applied live, not by a new pod")
	})

	// readWhile streams the large file through the claim on node while disrupt upsets the
	// node's Strata (and waits for it to recover); the read must complete with the right
	// bytes, and a new pod must mount the Dataset afterwards.
	readWhile := func(ctx SpecContext, node, what string, disrupt func(ctx SpecContext)) {
		var big object
		for _, o := range written {
			if o.Key == "big/train.bin" {
				big = o
			}
		}
		// 21 MiB at 2 MiB/s: a read that lasts about ten seconds.
		// Uncached: the bytes must come through the worker, not the page cache of earlier reads.
		reader := claimPod(namespace, node, "corpus", "sum", "--rate", "2097152", "--uncached", "/data/big")
		Expect(k8sClient.Create(ctx, reader)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(reader), reader)).To(Succeed())
			g.Expect(reader.Status.Phase).To(Equal(corev1.PodRunning))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the reader to start")

		By(what + " on " + node + " while the reader streams")
		disrupt(ctx)

		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(reader), reader)).To(Succeed())
			g.Expect(reader.Status.Phase).NotTo(Equal(corev1.PodFailed), "the reader failed: %s", podLogs(ctx, reader))
			g.Expect(reader.Status.Phase).To(Equal(corev1.PodSucceeded))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the reader to finish")
		var got object
		Expect(json.Unmarshal([]byte(strings.TrimSpace(podLogs(ctx, reader))), &got)).To(Succeed())
		Expect(got.SHA256).To(Equal(big.SHA256), "the read that outlived it (%s) returned other bytes", what)

		By("mounting the Dataset in a new pod on " + node)
		Expect(sumClaim(ctx, namespace, node, "corpus")).To(Equal(contents(written)))
	}

	// replacing deletes the pod that current finds and waits for its DaemonSet's replacement.
	replacing := func(node string, current func(ctx context.Context) *corev1.Pod) func(ctx SpecContext) {
		return func(ctx SpecContext) {
			old := current(ctx)
			Expect(old).NotTo(BeNil(), "no pod to delete on %s", node)
			Expect(k8sClient.Delete(ctx, old)).To(Succeed())
			Eventually(func(g Gomega) {
				p := current(ctx)
				g.Expect(p).NotTo(BeNil())
				g.Expect(p.UID).NotTo(Equal(old.UID))
				g.Expect(podReady(p)).To(BeTrue())
			}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for a new pod on %s", node)
		}
	}

	It("keeps a pod reading while the node plugin is replaced, and mounts again with the new one", func(ctx SpecContext) {
		node := nodes[0]
		readWhile(ctx, node, "deleting the CSI node plugin's pod", replacing(node, func(ctx context.Context) *corev1.Pod { return csiNodePod(ctx, node) }))
	})

	It("keeps a pod reading while the worker that serves its mount is replaced", func(ctx SpecContext) {
		node := nodes[0]
		readWhile(ctx, node, "deleting the worker's pod", replacing(node, func(ctx context.Context) *corev1.Pod { return workerPod(ctx, pool, node) }))
		By("finding in the new worker's log that it took the mount over rather than mounting afresh")
		Expect(podLogs(ctx, workerPod(ctx, pool, node))).To(ContainSubstring("took over the mount of an earlier worker"))
	})

	It("keeps a pod reading while the worker that serves its mount is killed", func(ctx SpecContext) {
		node := nodes[0]
		readWhile(ctx, node, "killing the worker (SIGKILL)", func(ctx SpecContext) {
			before := workerPod(ctx, pool, node)
			Expect(before).NotTo(BeNil())
			restarts := before.Status.ContainerStatuses[0].RestartCount
			// A Kind node is a container named after the node; the worker is a process in it.
			out, err := exec.CommandContext(ctx, "docker", "exec", node, "pkill", "--signal", "KILL", "-f", "--", "--pool="+pool+" ").CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "killing the worker of pool %s on %s: %s", pool, node, out)
			Eventually(func(g Gomega) {
				p := workerPod(ctx, pool, node)
				g.Expect(p).NotTo(BeNil())
				g.Expect(p.UID).To(Equal(before.UID), "the kubelet restarts the container in the same pod")
				g.Expect(p.Status.ContainerStatuses[0].RestartCount).To(BeNumerically(">", restarts))
				g.Expect(podReady(p)).To(BeTrue())
			}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the worker on %s to restart", node)
		})
		By("finding in the restarted worker's log that it took the mount over")
		Expect(podLogs(ctx, workerPod(ctx, pool, node))).To(ContainSubstring("took over the mount of an earlier worker"))
	})

	It("keeps a step writing its output while the worker that serves the output is killed", func(ctx SpecContext) {
		node := nodes[0]
		var big object
		for _, o := range written {
			if o.Key == "big/train.bin" {
				big = o
			}
		}
		By("starting a step on " + node + " that writes the large file into its output at 2 MiB/s")
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "slow-copy", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "slow-copy"}, TierPoolName: pool},
		})).To(Succeed())
		step := copyLineage(namespace, "slow-copy", "corpus", "slow-copy", node, true)
		step.Spec.Template.Spec.Template.Spec.Containers[0].Args = []string{"copy", "--rate", "2097152", "--progress", "4194304", "/data/big", "/out/big"}
		Expect(k8sClient.Create(ctx, step)).To(Succeed())
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(namespace))).To(Succeed())
			var running *corev1.Pod
			for i, p := range pods.Items {
				if strings.HasPrefix(p.Name, "slow-copy-") && p.Status.Phase == corev1.PodRunning {
					running = &pods.Items[i]
				}
			}
			g.Expect(running).NotTo(BeNil(), "the step's pod runs")
			// 4 MiB in, of a file of more: it is part written when the worker dies.
			g.Expect(podLogs(ctx, running)).To(ContainSubstring("copied 4194304 bytes"))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the step to have written 4 MiB")

		By("killing the worker (SIGKILL) on " + node + " while the file is written")
		out, err := exec.CommandContext(ctx, "docker", "exec", node, "pkill", "--signal", "KILL", "-f", "--", "--pool="+pool+" ").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "killing the worker of pool %s on %s: %s", pool, node, out)

		By("the step finishes without a retry, and the other node reads every byte it wrote")
		waitLineage(ctx, namespace, "slow-copy", "Written")
		var jobs batchv1.JobList
		Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace), client.MatchingLabels{"data.strata.dev/lineage": "slow-copy"})).To(Succeed())
		Expect(jobs.Items).To(HaveExactElements(HaveField("Status.Failed", BeZero())), "one Job, whose pod never failed")
		got := sumClaim(ctx, namespace, nodes[1], "slow-copy")
		Expect(got).To(HaveExactElements(HaveField("SHA256", big.SHA256)), "the output holds the large file, whole")
		Expect(podLogs(ctx, workerPod(ctx, pool, node))).To(MatchRegexp(`took over the mount of an earlier worker.*"output":\s*true`), "the restarted worker took the output mount over")
	})

	It("refuses a pod of another namespace that names the Dataset's volume", func(ctx SpecContext) {
		other := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-csi-other-"}}
		Expect(k8sClient.Create(ctx, other)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(k8sClient.Delete(ctx, other)).To(Succeed()) })
		var ds datav1alpha1.Dataset
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "corpus"}, &ds)).To(Succeed())
		var pv corev1.PersistentVolume
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "strata-" + string(ds.UID)}, &pv)).To(Succeed())

		// An inline CSI volume is not allowed for this driver, so the only way in is a PV: a
		// second PV with the same handle and attributes, claimed from another namespace, is what
		// a tenant who guessed them would try.
		thief := pv.DeepCopy()
		thief.ObjectMeta = metav1.ObjectMeta{Name: "strata-stolen-" + other.Name}
		thief.Spec.ClaimRef = &corev1.ObjectReference{Namespace: other.Name, Name: "stolen"}
		Expect(k8sClient.Create(ctx, thief)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, thief))).To(Succeed()) })
		empty := ""
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "stolen", Namespace: other.Name},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: pv.Spec.AccessModes, StorageClassName: &empty, VolumeName: thief.Name,
				Resources: corev1.VolumeResourceRequirements{Requests: pv.Spec.Capacity},
			},
		}
		Expect(k8sClient.Create(ctx, pvc)).To(Succeed())
		pod := claimPod(other.Name, nodes[0], "stolen", "sum", "/data")
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		Eventually(func(g Gomega) {
			events, err := clientset.CoreV1().Events(other.Name).List(ctx, metav1.ListOptions{
				FieldSelector: "involvedObject.name=" + pod.Name,
			})
			g.Expect(err).NotTo(HaveOccurred())
			var messages []string
			for _, e := range events.Items {
				messages = append(messages, e.Message)
			}
			g.Expect(strings.Join(messages, "\n")).To(ContainSubstring("PermissionDenied"))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the mount to be refused")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		Expect(pod.Status.Phase).To(Equal(corev1.PodPending), "the pod must never start with another namespace's data")
	})
})

// csiNodePod returns the node plugin's live pod on node, or nil.
func csiNodePod(ctx context.Context, node string) *corev1.Pod {
	var pods corev1.PodList
	Expect(k8sClient.List(ctx, &pods, client.InNamespace(strataNamespace),
		client.MatchingLabels{"app.kubernetes.io/component": "csi-node"})).To(Succeed())
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			return p
		}
	}
	return nil
}

// minioDataset is a Dataset of the objects under uri in the suite's MinIO, read with the
// credentials copyMinioCredentials put in its namespace.
func minioDataset(namespace, name, pool, uri string) *datav1alpha1.Dataset {
	return &datav1alpha1.Dataset{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: datav1alpha1.DatasetSpec{
			Source: &datav1alpha1.DatasetSource{
				URI: uri, Endpoint: minioEndpoint, SecretRef: &datav1alpha1.SecretReference{Name: "minio-credentials"},
			},
			TierPoolName: pool,
		},
	}
}

// waitReady waits until the Dataset is Ready, and leaves its latest state in ds.
func waitReady(ctx context.Context, ds *datav1alpha1.Dataset) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
		c := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionReady)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
	}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for Dataset %s to be Ready", ds.Name)
}

// putObjects writes keys of size bytes each to bucket from a testkit pod on node.
func putObjects(ctx context.Context, namespace, node, bucket string, keys []string, size int64, seed int) []object {
	return runPod(ctx, testkitPod(namespace, node, "s3", "put", "--endpoint", minioEndpoint, "--bucket", bucket,
		"--key", strings.Join(keys, ","), "--size", fmt.Sprint(size), "--seed", fmt.Sprint(seed)))
}

// sumClaim reads every file of a claim in a pod on node and returns what testkit sum printed.
func sumClaim(ctx context.Context, namespace, node, claim string) []object {
	pod := claimPod(namespace, node, claim, "sum", "/data")
	return contents(runPod(ctx, pod))
}

// claimPod is a testkit pod on node with claim mounted read-only at /data.
func claimPod(namespace, node, claim string, args ...string) *corev1.Pod {
	pod := testkitPod(namespace, node, args...)
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: true}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true},
	}}}
	return pod
}

// writableClaim creates a StorageClass of pool (gone when the spec ends) and a ReadWriteMany
// claim of it, name, in namespace: a writable volume the CSI driver provisions.
func writableClaim(ctx context.Context, namespace, pool, name string) *corev1.PersistentVolumeClaim {
	GinkgoHelper()
	class := &storagev1.StorageClass{
		ObjectMeta:    metav1.ObjectMeta{Name: "strata-" + namespace},
		Provisioner:   "csi.strata.dev",
		Parameters:    map[string]string{"tierPool": pool},
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
	}
	Expect(k8sClient.Create(ctx, class)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, class))).To(Succeed()) })
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: &class.Name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	Expect(k8sClient.Create(ctx, pvc)).To(Succeed())
	return pvc
}

// waitFailedWith waits for pod to fail, and for its logs to say why.
func waitFailedWith(ctx context.Context, pod *corev1.Pod, why string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		g.Expect(pod.Status.Phase).To(Equal(corev1.PodFailed))
	}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for pod %s to fail", pod.Name)
	Expect(podLogs(ctx, pod)).To(ContainSubstring(why))
}

// copyPod is a testkit pod on node that copies the claim from, mounted read-only at /data, to
// dst, a folder of the claim to, mounted writable at /out.
func copyPod(namespace, node, from, to, dst string) *corev1.Pod {
	pod := claimPod(namespace, node, from, "copy", "/data", dst)
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "out", MountPath: "/out"})
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "out", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: to},
	}})
	return pod
}

// copyLineage is a Lineage whose Job copies the Dataset input into its output on node: only
// there if required, there if it can otherwise.
func copyLineage(namespace, name, input, output, node string, required bool) *datav1alpha1.Lineage {
	pod := copyPod(namespace, node, input, output, "/out")
	// A Job's pods are placed by the scheduler: name the node by affinity, not nodeName.
	pod.Spec.NodeName = ""
	if required {
		pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	} else {
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100, Preference: corev1.NodeSelectorTerm{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}},
		}}
	}
	return &datav1alpha1.Lineage{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: datav1alpha1.LineageSpec{
			Inputs: []string{input}, Outputs: []string{output},
			Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template:     corev1.PodTemplateSpec{Spec: pod.Spec},
			}},
		},
	}
}

// copiedOutput writes a small pipeline in namespace: two objects of size bytes that a pod on
// nodes[1] puts into bucket, read as Dataset "raw" of pool and copied by Lineage "step"
// (preferably on nodes[0]) into Dataset "out", checkpointed to checkpoint when it is given. It
// returns, once the Lineage wrote it, what the output's files hold (their contents).
func copiedOutput(ctx context.Context, namespace, pool, bucket string, nodes []string, size int64, seed int, checkpoint *datav1alpha1.CheckpointTarget) []object {
	GinkgoHelper()
	prefix := namespace + "/raw/"
	written := putObjects(ctx, namespace, nodes[1], bucket, []string{prefix + "big.bin", prefix + "dir/a.txt"}, size, seed)
	for i := range written {
		written[i].Key = strings.TrimPrefix(written[i].Key, prefix)
	}
	raw := minioDataset(namespace, "raw", pool, "s3://"+bucket+"/"+prefix)
	Expect(k8sClient.Create(ctx, raw)).To(Succeed())
	waitReady(ctx, raw)
	Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
		ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: namespace},
		Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "step"}, TierPoolName: pool, Checkpoint: checkpoint},
	})).To(Succeed())
	Expect(k8sClient.Create(ctx, copyLineage(namespace, "step", "raw", "out", nodes[0], false))).To(Succeed())
	waitLineage(ctx, namespace, "step", "Written")
	return contents(written)
}

// waitLineage waits until the Lineage's Ready condition has reason.
func waitLineage(ctx context.Context, namespace, name, reason string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var l datav1alpha1.Lineage
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &l)).To(Succeed())
		c := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionReady)
		g.Expect(c).NotTo(BeNil())
		if c.Reason == "JobFailed" || c.Reason == "Cycle" || c.Reason == "InputNotFound" || c.Reason == "OutputNotDeclared" {
			StopTrying(fmt.Sprintf("Lineage %s: %s: %s", name, c.Reason, c.Message)).Now()
		}
		g.Expect(c.Reason).To(Equal(reason), "%s", c.Message)
	}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for Lineage %s to be %s", name, reason)
}

// waitRecomputed waits until the Lineage has made n recomputations and has nothing lost; a
// Lineage that gives up stops the wait at once.
func waitRecomputed(ctx context.Context, namespace, name string, n int) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var l datav1alpha1.Lineage
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &l)).To(Succeed())
		c := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionRecomputing)
		g.Expect(c).NotTo(BeNil())
		if c.Reason == "RecomputationLimit" || c.Reason == "RecomputationFailed" {
			StopTrying(fmt.Sprintf("Lineage %s: %s: %s", name, c.Reason, c.Message)).Now()
		}
		g.Expect(l.Status.Recomputations).To(BeEquivalentTo(n))
		g.Expect(c.Reason).To(Equal("NothingLost"), "%s", c.Message)
	}).WithContext(ctx).WithTimeout(10*minute).Should(Succeed(), "waiting for %s to be recomputed", name)
}

// deletePodsUsing deletes the pods of namespace that mount claim, and waits until they are gone.
func deletePodsUsing(ctx context.Context, namespace, claim string) {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(k8sClient.List(ctx, &pods, client.InNamespace(namespace))).To(Succeed())
	for i := range pods.Items {
		pod := &pods.Items[i]
		for _, v := range pod.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
				Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pod))).To(Succeed())
				Eventually(func() bool {
					return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}))
				}).WithContext(ctx).WithTimeout(2*minute).Should(BeTrue(), "waiting for pod %s to go", pod.Name)
				break
			}
		}
	}
}

// runPod creates pod, waits for it to succeed and decodes the JSON lines it printed.
func runPod(ctx context.Context, pod *corev1.Pod) []object {
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	waitSucceeded(ctx, pod)
	return runLogs(ctx, pod)
}

// waitSucceeded waits until a testkit pod has succeeded, failing with its logs if it failed.
func waitSucceeded(ctx context.Context, pod *corev1.Pod) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		if pod.Status.Phase == corev1.PodFailed {
			StopTrying(fmt.Sprintf("testkit %v failed: %s", pod.Spec.Containers[0].Args, podLogs(ctx, pod))).Now()
		}
		g.Expect(pod.Status.Phase).To(Equal(corev1.PodSucceeded))
	}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for testkit %v on %s", pod.Spec.Containers[0].Args, pod.Spec.NodeName)
}

// runLogs decodes the JSON lines a finished testkit pod printed (none for an empty listing).
func runLogs(ctx context.Context, pod *corev1.Pod) []object {
	var out []object
	for _, line := range strings.Split(strings.TrimSpace(podLogs(ctx, pod)), "\n") {
		if line == "" || strings.HasPrefix(line, "testkit: ") {
			continue // a waiting reader's progress, on standard error (logs hold both streams)
		}
		var o object
		Expect(json.Unmarshal([]byte(line), &o)).To(Succeed(), "testkit output line %q", line)
		out = append(out, o)
	}
	return out
}

// contents is what objs hold, comparable between a write and a read: sorted by key, without
// the time each took.
func contents(objs []object) []object {
	out := append([]object(nil), objs...)
	for i := range out {
		// What a reader of the files can see: not how long a write took, nor the version.
		out[i].Seconds, out[i].ETag = 0, ""
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
