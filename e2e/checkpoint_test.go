//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// A pipeline whose outputs name a checkpoint target in MinIO: the worker of the node that wrote
// them checkpoints the newest in the background (Edge), never the temporary one, and when that
// node stops, the checkpointed output is read back from MinIO instead of recomputed.
var _ = Describe("A pipeline checkpointed to S3", Ordered, Label("lineage", "checkpoint"), func() {
	var (
		namespace, pool string
		nodes           []string
		written         []object
	)
	const bucket = "e2e-checkpoint"
	steps := []struct {
		name, input, output string
		temporary           bool
	}{
		{"step-a", "raw", "tmp-a", true},
		{"step-b", "tmp-a", "out-b", false},
		{"step-c", "out-b", "out-c", false},
	}
	prefix := func(output string) string { return namespace + "/" + output + "/" }
	// inMinIO is what MinIO holds under an output's checkpoint prefix, read by a pod on node.
	inMinIO := func(ctx context.Context, node, output string) []object {
		return contents(runPod(ctx, testkitPod(namespace, node, "s3", "get", "--endpoint", minioEndpoint, "--bucket", bucket,
			"--prefix", prefix(output))))
	}
	lineageOf := func(ctx context.Context, name string) *datav1alpha1.Lineage {
		l := &datav1alpha1.Lineage{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l)).To(Succeed())
		return l
	}

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-checkpoint-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "checkpoint", "4Mi")
		keys := []string{prefix("raw") + "big.bin", prefix("raw") + "dir/a.txt", prefix("raw") + "dir/b.txt"}
		written = putObjects(ctx, namespace, nodes[1], bucket, keys, 9<<20, 11)
		for i := range written {
			written[i].Key = strings.TrimPrefix(written[i].Key, prefix("raw"))
		}
		raw := minioDataset(namespace, "raw", pool, "s3://"+bucket+"/"+prefix("raw"))
		Expect(k8sClient.Create(ctx, raw)).To(Succeed())
		waitReady(ctx, raw)
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("checkpoints the newest output in the background, and never the temporary one", Label("smoke"), func(ctx SpecContext) {
		for _, s := range steps {
			Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: s.output, Namespace: namespace},
				Spec: datav1alpha1.DatasetSpec{
					Lineage: &datav1alpha1.LineageReference{Name: s.name}, TierPoolName: pool, Temporary: s.temporary,
					Checkpoint: &datav1alpha1.CheckpointTarget{URI: "s3://" + bucket + "/" + prefix(s.output), Endpoint: minioEndpoint,
						SecretRef: datav1alpha1.SecretReference{Name: "minio-credentials"}},
				},
			})).To(Succeed())
			Expect(k8sClient.Create(ctx, copyLineage(namespace, s.name, s.input, s.output, nodes[0], false))).To(Succeed())
		}
		for _, s := range steps {
			waitLineage(ctx, namespace, s.name, "Written")
		}

		By("the last output, the leaf of the lineage graph, reaches MinIO")
		Eventually(func(g Gomega) {
			l := &datav1alpha1.Lineage{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "step-c"}, l)).To(Succeed())
			g.Expect(l.Status.Outputs).To(HaveExactElements(HaveField("State", datav1alpha1.OutputCheckpointed)))
			g.Expect(meta.IsStatusConditionTrue(l.Status.Conditions, datav1alpha1.ConditionCheckpointed)).To(BeTrue())
			g.Expect(l.Status.UncheckpointedDepth).To(BeZero(), "a checkpointed leaf ends every chain")
			out := &datav1alpha1.Dataset{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "out-c"}, out)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(out.Status.Conditions, datav1alpha1.ConditionCheckpointTargetReachable)).To(BeTrue())
			g.Expect(out.Status.CheckpointedBytes).To(Equal(out.Status.TotalBytes))
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for out-c to be checkpointed")
		Expect(inMinIO(ctx, nodes[1], "out-c")).To(Equal(contents(written)), "out-c in MinIO, byte for byte, under its paths")

		By("the temporary output stays in memory alone")
		Expect(inMinIO(ctx, nodes[1], "tmp-a")).To(BeEmpty())
		Expect(stateOf(lineageOf(ctx, "step-a"), "tmp-a")).To(Equal(datav1alpha1.OutputInMemory))
	})

	It("reads the checkpointed output back when its node stops, and recomputes only what has no checkpoint", func(ctx SpecContext) {
		stopNode(ctx, nodes[0])

		By("the temporary output, in " + nodes[0] + "'s memory alone, is recomputed")
		waitRecomputed(ctx, namespace, "step-a", 1)

		By("a pod on " + nodes[1] + " reads the checkpointed output from MinIO, whole")
		reader := claimPod(namespace, nodes[1], "out-c", "sum", "--wait", "4m", "--expect-files", fmt.Sprint(len(written)), "/data")
		Expect(k8sClient.Create(ctx, reader)).To(Succeed())
		Expect(contents(runLogsWhenDone(ctx, reader))).To(Equal(contents(written)))

		By("and out-c is never recomputed: it was not lost")
		l := lineageOf(ctx, "step-c")
		Expect(l.Status.Recomputations).To(BeZero())
		Expect(stateOf(l, "out-c")).To(Equal(datav1alpha1.OutputCheckpointed))
	})
})

// stateOf is the state a Lineage's status gives one of its outputs.
func stateOf(l *datav1alpha1.Lineage, output string) datav1alpha1.OutputState {
	for _, o := range l.Status.Outputs {
		if o.Name == output {
			return o.State
		}
	}
	return ""
}

// An Indexed step writes one partition per completion index into an output checkpointed to
// MinIO, all on one node; one partition is temporary (never checkpointed). When that node
// stops, only the index whose partition has no checkpoint is rerun, as a Job of its own, and a
// pod reads the whole output: one partition from MinIO, the other recomputed.
var _ = Describe("An Indexed step that loses one of its partitions", Ordered, Label("lineage", "checkpoint", "partitions"), func() {
	var (
		namespace, pool string
		nodes           []string
		written         []object
	)
	const bucket = "e2e-partitions"

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-partitions-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "partitions", "1Mi")
		written = putObjects(ctx, namespace, nodes[1], bucket, []string{namespace + "/raw/a.bin", namespace + "/raw/b.bin"}, 3<<20, 21)
		for i := range written {
			written[i].Key = strings.TrimPrefix(written[i].Key, namespace+"/raw/")
		}
		raw := minioDataset(namespace, "raw", pool, "s3://"+bucket+"/"+namespace+"/raw/")
		Expect(k8sClient.Create(ctx, raw)).To(Succeed())
		waitReady(ctx, raw)
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("reruns only the index whose partition was lost with its node, and a pod reads the whole output", func(ctx SpecContext) {
		Expect(k8sClient.Create(ctx, &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "part-1-scratch", Namespace: namespace},
			Spec:       datav1alpha1.CachePolicySpec{Checkpoint: datav1alpha1.CheckpointSpec{TemporaryPathPatterns: []string{"part-1/**"}}},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "parts", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Lineage: &datav1alpha1.LineageReference{Name: "split"}, TierPoolName: pool, CachePolicyName: "part-1-scratch",
				Checkpoint: &datav1alpha1.CheckpointTarget{URI: "s3://" + bucket + "/" + namespace + "/parts/", Endpoint: minioEndpoint,
					SecretRef: datav1alpha1.SecretReference{Name: "minio-credentials"}},
			},
		})).To(Succeed())
		l := copyLineage(namespace, "split", "raw", "parts", nodes[0], false)
		spec := &l.Spec.Template.Spec
		spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
		spec.Completions, spec.Parallelism = ptr.To[int32](2), ptr.To[int32](1)
		// Each index copies the input into a partition of its own.
		spec.Template.Spec.Containers[0].Args = []string{"copy", "/data", "/out/part-$(JOB_COMPLETION_INDEX)"}
		l.Spec.Partitions = []datav1alpha1.OutputPartition{{Index: 0, Output: "parts", Path: "part-0"}, {Index: 1, Output: "parts", Path: "part-1"}}
		Expect(k8sClient.Create(ctx, l)).To(Succeed())
		waitLineage(ctx, namespace, "split", "Written")
		var want []object
		for _, part := range []string{"part-0", "part-1"} {
			for _, o := range written {
				o.Key = part + "/" + o.Key
				want = append(want, o)
			}
		}

		By("part-0 reaches MinIO; part-1, temporary, stays in " + nodes[0] + "'s memory alone")
		Eventually(func(g Gomega) {
			l := &datav1alpha1.Lineage{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "split"}, l)).To(Succeed())
			g.Expect(stateOf(l, "parts")).To(Equal(datav1alpha1.OutputCheckpointing))
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for part-0 to be checkpointed")

		stopNode(ctx, nodes[0])

		By("index 1 alone is rerun, by a Job of its own")
		waitRecomputed(ctx, namespace, "split", 1)
		var jobs batchv1.JobList
		Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace), client.HasLabels{"data.strata.dev/recomputation"})).To(Succeed())
		Expect(jobs.Items).To(HaveExactElements(HaveField("Labels", HaveKeyWithValue("data.strata.dev/completion-index", "1"))))

		By("a pod on " + nodes[1] + " reads both partitions: part-0 from MinIO, part-1 recomputed")
		reader := claimPod(namespace, nodes[1], "parts", "sum", "/data")
		Expect(contents(runPod(ctx, reader))).To(Equal(contents(want)))
	})
})
