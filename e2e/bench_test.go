//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/dfsperf"
)

// The read benchmark of docs/benchmarks.md, run by `make bench-e2e`: one node reads the same
// files four ways, side by side in one run.
var _ = Describe("Reading a Dataset through its claim", Ordered, Label("bench"), func() {
	const (
		bucket   = "e2e-bench"
		files    = 4
		fileSize = 32 << 20
	)
	var (
		namespace string
		node      string
		pool      string
		keys      []string
	)

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-bench-")

		// The cache node without MinIO, so that a cold read and a direct read both cross the
		// pod network.
		minioNode := runningPodNode(ctx, minioNamespace, "app.kubernetes.io/name=minio")
		for _, n := range cacheNodes(ctx) {
			if n != minioNode {
				node = n
			}
		}
		Expect(node).NotTo(BeEmpty())

		// Files of four blocks each: every read goes through the worker's block lookup (passthrough
		// applies only to one-block files).
		pool = memoryPool(ctx, "bench", "8Mi")

		for i := range files {
			keys = append(keys, fmt.Sprintf("%s/part-%d.bin", namespace, i))
		}
		putObjects(ctx, namespace, minioNode, bucket, keys, fileSize, 7)
		ds := minioDataset(namespace, "bench", pool, "s3://"+bucket+"/"+namespace+"/")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("reads cold and hot through the mount, next to tmpfs on the same node and MinIO direct", func(ctx SpecContext) {
		total := int64(files * fileSize)
		throughput := func(what string, o object) float64 {
			Expect(o.Bytes).To(Equal(total), "%s read %d bytes", what, o.Bytes)
			mbps := float64(o.Bytes) / 1e6 / o.Seconds
			GinkgoWriter.Printf("%-40s %8.1f MB/s (%d bytes in %.3f s)\n", what, mbps, o.Bytes, o.Seconds)
			AddReportEntry(what, fmt.Sprintf("%.1f MB/s", mbps))
			return mbps
		}

		cold := one(runPod(ctx, claimPod(namespace, node, "bench", "sum", "--summary", "/data")))
		throughput("cold, through the mount (from MinIO)", cold)

		// The same files copied into a tmpfs of the pod: what reading memory costs on this node.
		inTmpfs := func() *corev1.Pod {
			return withTmpfsCopy(claimPod(namespace, node, "bench", "sum", "--summary", "/scratch"), "/scratch")
		}
		// Hot reads and tmpfs alternate, three rounds, each a new pod: a round reads 128 MiB in a
		// tenth of a second, so one round alone says little.
		var hot, tmpfs []float64
		for round := 1; round <= 3; round++ {
			hot = append(hot, throughput(fmt.Sprintf("hot, through the mount, round %d", round),
				one(runPod(ctx, claimPod(namespace, node, "bench", "sum", "--summary", "/data")))))
			tmpfs = append(tmpfs, throughput(fmt.Sprintf("tmpfs in the pod, same node, round %d", round), one(runPod(ctx, inTmpfs()))))
		}
		// What the hot read cost before the worker kept a Dataset mounted between pods: every
		// byte through the worker, from its MEM tier, none from the page cache.
		dropped := throughput("hot, through the mount, pages dropped",
			one(runPod(ctx, claimPod(namespace, node, "bench", "sum", "--summary", "--uncached", "/data"))))
		slices.Sort(hot)
		slices.Sort(tmpfs)
		GinkgoWriter.Printf("hot through the mount, median of 3: %.1f MB/s; tmpfs: %.1f MB/s; ratio %.2f (pages dropped: %.2f)\n",
			hot[1], tmpfs[1], hot[1]/tmpfs[1], dropped/tmpfs[1])
		AddReportEntry("hot / tmpfs (medians)", fmt.Sprintf("%.2f", hot[1]/tmpfs[1]))

		direct := one(runPod(ctx, testkitPod(namespace, node, "s3", "get", "--summary", "--endpoint", minioEndpoint,
			"--bucket", bucket, "--key", strings.Join(keys, ","))))
		throughput("MinIO direct (minio-go), same node", direct)
	})

	It("reads hot on the node the scheduling hints choose, next to the node that holds nothing", func(ctx SpecContext) {
		total := int64(files * fileSize)
		throughput := func(what string, o object) {
			Expect(o.Bytes).To(Equal(total), "%s read %d bytes", what, o.Bytes)
			mbps := float64(o.Bytes) / 1e6 / o.Seconds
			GinkgoWriter.Printf("%-40s %8.1f MB/s (%d bytes in %.3f s)\n", what, mbps, o.Bytes, o.Seconds)
			AddReportEntry(what, fmt.Sprintf("%.1f MB/s", mbps))
		}
		ds := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: namespace}}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Nodes).To(HaveExactElements(HaveField("Node", node)))
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the status to say %s holds the Dataset", node)

		// Uncached: every byte comes through the worker, not the page cache of earlier reads.
		hinted := claimPod(namespace, "", "bench", "sum", "--summary", "--uncached", "/data")
		read := one(runPod(ctx, hinted))
		Expect(hinted.Spec.NodeName).To(Equal(node), "the hints placed the reader away from its data")
		throughput("hot, on the node the hints chose", read)

		var other string
		for _, n := range cacheNodes(ctx) {
			if n != node {
				other = n
			}
		}
		remote := one(runPod(ctx, claimPod(namespace, other, "bench", "sum", "--summary", "--uncached", "/data")))
		throughput("the other node (blocks from the holder)", remote)
	})
})

var _ = Describe("strata-bench, DFS-Perf's workloads through a pod's claims", Ordered, Label("bench", "dfsperf"), func() {
	It("runs every workload through a writable claim, reading a Dataset's files, and prints what each measured", func(ctx SpecContext) {
		namespace := testNamespace(ctx, "e2e-dfsperf-")
		DeferCleanup(func() { dumpOnFailure(namespace) })
		minioNode := runningPodNode(ctx, minioNamespace, "app.kubernetes.io/name=minio")
		node := cacheNodes(ctx)[0]
		pool := memoryPool(ctx, "dfsperf", "")
		var keys []string
		for i := range 4 {
			keys = append(keys, fmt.Sprintf("%s/in-%d.bin", namespace, i))
		}
		putObjects(ctx, namespace, minioNode, "e2e-dfsperf", keys, 8<<20, 3)
		ds := minioDataset(namespace, "input", pool, "s3://e2e-dfsperf/"+namespace+"/")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)

		By("a writable claim of a Strata StorageClass of the same pool")
		writableClaim(ctx, namespace, pool, "out")

		By("reading the Dataset once, so that both runs read it hot")
		Expect(sumClaim(ctx, namespace, node, "input")).To(HaveLen(len(keys)))

		By("strata-bench all, from the testkit image, on " + node + ": through the claims, then in a tmpfs of the pod")
		// What the workloads write stays until the end (in the MEM tier, where it has no other
		// copy): sizes that fit in the pool's 256 MiB beside the input.
		bench := func(pod *corev1.Pod, dir, readDir string) []dfsperf.Result {
			pod.Spec.Containers[0].Command = []string{"/strata-bench"}
			pod.Spec.Containers[0].Args = []string{"--dir", dir, "--read-dir", readDir, "--threads", "2", "--files", "8",
				"--size", "1048576", "--io-size", "262144", "--rounds", "3", "--json", "-", "all"}
			Expect(k8sClient.Create(ctx, pod)).To(Succeed())
			waitSucceeded(ctx, pod)
			logs := podLogs(ctx, pod)
			GinkgoWriter.Println(logs)
			// The progress lines (standard error), the table, then the JSON array.
			start := strings.Index(logs, "\n[")
			Expect(start).To(BeNumerically(">=", 0), "no JSON in the output:\n%s", logs)
			var results []dfsperf.Result
			Expect(json.Unmarshal([]byte(logs[start:]), &results)).To(Succeed())
			Expect(results).To(HaveLen(len(dfsperf.Workloads)))
			return results
		}
		// Through Strata: the input Dataset's claim at /data, the writable claim at /out.
		strata := bench(copyPod(namespace, node, "input", "out", "/out"), "/out", "/data")
		// The baseline: the same pod's tmpfs, the input copied into it first.
		tmpfs := bench(withTmpfsCopy(claimPod(namespace, node, "input"), "/scratch/in"), "/scratch", "/scratch/in")
		byName := map[string]dfsperf.Result{}
		for i, w := range dfsperf.Workloads {
			r, base := strata[i], tmpfs[i]
			Expect(r.Workload).To(Equal(w.Name))
			Expect(r.Ops).To(BeNumerically(">", 0), "%s made no operation", w.Name)
			line := fmt.Sprintf("%.0f ops/s, %.1f MB/s, p50 %.0f µs, p99 %.0f µs; tmpfs %.0f ops/s, %.1f MB/s, p50 %.0f µs; ratio %.2f",
				r.OpsPerSec, r.MBPerSec, r.P50Micros, r.P99Micros, base.OpsPerSec, base.MBPerSec, base.P50Micros, r.OpsPerSec/base.OpsPerSec)
			GinkgoWriter.Printf("%-10s %s\n", w.Name, line)
			AddReportEntry("strata-bench "+w.Name, line)
			byName[r.Workload] = r
		}
		Expect(byName["seq-read"].Bytes).To(BeEquivalentTo(4*8<<20), "seq-read read the Dataset's four files whole")
	})
})

// withTmpfsCopy makes pod, a claimPod, read memory instead of its claim: an init container
// copies the claim's files (/data) to dst in a tmpfs mounted at /scratch, and the pod's
// container mounts that tmpfs alone.
func withTmpfsCopy(pod *corev1.Pod, dst string) *corev1.Pod {
	pod.Spec.InitContainers = []corev1.Container{{
		Name: "copy", Image: testkitImage, ImagePullPolicy: corev1.PullNever, Args: []string{"copy", "/data", dst},
		VolumeMounts: append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: "/scratch"}),
	}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory},
	}})
	return pod
}

func one(objs []object) object {
	GinkgoHelper()
	Expect(objs).To(HaveLen(1))
	return objs[0]
}

// The time from `kubectl apply` of a TierPool, a CachePolicy and a preloaded Dataset to a pod's
// first read through the Dataset's claim, recorded in docs/benchmarks.md.
var _ = Describe("A Dataset applied with its pool and policy", Ordered, Label("bench"), func() {
	const bucket = "e2e-first-read"

	It("is read by a pod created with it, and is all cached once preloaded", func(ctx SpecContext) {
		namespace := testNamespace(ctx, "e2e-first-read-")
		node := cacheNodes(ctx)[0]
		var keys []string
		for i := range 64 {
			keys = append(keys, fmt.Sprintf("%s/shard-%02d.bin", namespace, i))
		}
		putObjects(ctx, namespace, node, bucket, keys, 1<<20, 11)

		By("applying a TierPool, a CachePolicy, a Dataset with preload and a pod that reads it, at once")
		start := time.Now()
		pool := memoryPool(ctx, "first", "")
		policy := &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "lru", Namespace: namespace},
			Spec:       datav1alpha1.CachePolicySpec{Eviction: datav1alpha1.EvictionSpec{Policy: datav1alpha1.EvictLRU}},
		}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		ds := minioDataset(namespace, "shards", pool, "s3://"+bucket+"/"+namespace+"/")
		ds.Spec.CachePolicyName, ds.Spec.Preload = "lru", true
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		reader := claimPod(namespace, "", "shards", "sum", "--summary", "/data")
		Expect(k8sClient.Create(ctx, reader)).To(Succeed())

		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(reader), reader)).To(Succeed())
			g.Expect(reader.Status.Phase).NotTo(Equal(corev1.PodFailed), "the reader failed: %s", podLogs(ctx, reader))
			g.Expect(reader.Status.Phase).To(Equal(corev1.PodSucceeded))
		}).WithContext(ctx).WithTimeout(5*minute).Should(Succeed(), "waiting for the pod to read the Dataset")
		firstRead := time.Since(start)
		Expect(one(runLogs(ctx, reader)).Bytes).To(BeEquivalentTo(64 << 20))

		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(ds.Status.Conditions, "Preloaded")).To(BeTrue())
			g.Expect(ds.Status.CachedPercentage).To(Equal("100%"))
		}).WithContext(ctx).WithTimeout(5*minute).Should(Succeed(), "waiting for the preload")
		preloaded := time.Since(start)

		GinkgoWriter.Printf("apply to a pod's read of 64 MiB through the claim: %.1f s; to 100%% cached by the preload: %.1f s\n",
			firstRead.Seconds(), preloaded.Seconds())
		AddReportEntry("apply to first read", firstRead.String())
		AddReportEntry("apply to preloaded", preloaded.String())
	})

	It("is read within seconds when applied on a pool that runs already", func(ctx SpecContext) {
		namespace := testNamespace(ctx, "e2e-first-byte-")
		node := cacheNodes(ctx)[0]
		putObjects(ctx, namespace, node, bucket, []string{namespace + "/single/one.bin", namespace + "/warm/one.bin"}, 1<<20, 13)
		pool := memoryPool(ctx, "running", "")
		// The pool runs once a Dataset on it is mounted somewhere: a first one, of another
		// object, read once.
		warm := minioDataset(namespace, "warm", pool, "s3://"+bucket+"/"+namespace+"/warm/")
		Expect(k8sClient.Create(ctx, warm)).To(Succeed())
		waitReady(ctx, warm)
		runPod(ctx, claimPod(namespace, "", "warm", "sum", "--summary", "/data"))

		By("applying a Dataset and a pod that reads it, at once, on that pool")
		start := time.Now()
		ds := minioDataset(namespace, "single", pool, "s3://"+bucket+"/"+namespace+"/single/")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		read := one(runPod(ctx, claimPod(namespace, "", "single", "sum", "--summary", "/data")))
		Expect(read.Bytes).To(BeEquivalentTo(1 << 20))
		// Kind's nodes are containers of this host: the pod's clock is this one.
		firstRead := read.FirstRead.Sub(start)
		Expect(firstRead).To(BeNumerically(">", 0), "the pod read before the Dataset was applied")

		GinkgoWriter.Printf("apply of a Dataset on a running pool to a pod's first file (1 MiB) read: %.1f s\n", firstRead.Seconds())
		AddReportEntry("apply on a running pool to first read", firstRead.String())
	})
})
