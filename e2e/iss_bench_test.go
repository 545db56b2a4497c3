//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// The ISS benchmark of docs/benchmarks.md (ISS §5: completion time of a pipeline with one
// failure): a chain of three copies, raw → out-a → out-b → out-c, whose first two steps write
// on one node; that node stops, and the third step runs on the other node, reading out-b. Run
// side by side in one run under three CachePolicies: no replication and no checkpoint (the lost
// outputs are recomputed), Edge checkpoints to MinIO (out-b is read back from it), and two
// copies (out-b is read from the copy on the other node). Each mode waits for its protection
// (checkpoint or copies) before the node stops, and reports that wait apart.
var _ = Describe("A pipeline's completion time when a node fails (ISS)", Ordered, Label("bench", "iss"), func() {
	const bucket = "e2e-iss"
	var (
		pool    string
		nodes   []string
		results []issResult
	)
	BeforeAll(func(ctx SpecContext) {
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "iss", "4Mi")
	})
	AfterAll(func() {
		var b strings.Builder
		fmt.Fprintf(&b, "%-13s %10s %10s %10s %10s %14s\n", "mode", "first run", "protect", "after stop", "total", "recomputations")
		for _, r := range results {
			fmt.Fprintf(&b, "%-13s %9.1fs %9.1fs %9.1fs %9.1fs %14d\n", r.Mode, r.FirstRun, r.Protect, r.AfterStop, r.FirstRun+r.AfterStop, r.Recomputations)
		}
		GinkgoWriter.Print(b.String())
		AddReportEntry("ISS completion time", b.String())
		if data, err := json.MarshalIndent(results, "", "  "); err == nil {
			_ = os.WriteFile(filepath.Join("..", "bin", "iss-bench.json"), data, 0o644)
		}
	})

	for _, mode := range []struct {
		name       string
		policy     datav1alpha1.CachePolicySpec
		checkpoint bool
	}{
		{name: "recomputation", policy: datav1alpha1.CachePolicySpec{Checkpoint: datav1alpha1.CheckpointSpec{Strategy: datav1alpha1.CheckpointNone}}},
		{name: "checkpoint", checkpoint: true, policy: datav1alpha1.CachePolicySpec{Checkpoint: datav1alpha1.CheckpointSpec{Strategy: datav1alpha1.CheckpointEdge}}},
		{name: "replication", policy: datav1alpha1.CachePolicySpec{
			Replication: datav1alpha1.ReplicationSpec{Count: 2, Scope: datav1alpha1.ReplicateAnyNode},
			Checkpoint:  datav1alpha1.CheckpointSpec{Strategy: datav1alpha1.CheckpointNone},
		}},
	} {
		It("runs the pipeline with "+mode.name+" and one node failure", func(ctx SpecContext) {
			namespace := testNamespace(ctx, "e2e-iss-")
			DeferCleanup(func() { dumpOnFailure(namespace) })
			written := chainInput(ctx, namespace, pool, nodes[1], bucket)
			Expect(k8sClient.Create(ctx, &datav1alpha1.CachePolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "iss", Namespace: namespace}, Spec: mode.policy})).To(Succeed())
			output := func(s struct{ name, input, output string }) *datav1alpha1.Dataset {
				ds := &datav1alpha1.Dataset{
					ObjectMeta: metav1.ObjectMeta{Name: s.output, Namespace: namespace},
					Spec: datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: s.name}, TierPoolName: pool,
						CachePolicyName: "iss"},
				}
				if mode.checkpoint {
					ds.Spec.Checkpoint = &datav1alpha1.CheckpointTarget{URI: "s3://" + bucket + "/checkpoints/" + namespace + "/" + s.output + "/",
						Endpoint: minioEndpoint, SecretRef: datav1alpha1.SecretReference{Name: "minio-credentials"}}
				}
				return ds
			}

			By("the first two steps, on " + nodes[0])
			start := time.Now()
			for _, s := range chainSteps[:2] {
				Expect(k8sClient.Create(ctx, output(s))).To(Succeed())
				Expect(k8sClient.Create(ctx, copyLineage(namespace, s.name, s.input, s.output, nodes[0], false))).To(Succeed())
			}
			for _, s := range chainSteps[:2] {
				waitLineage(ctx, namespace, s.name, "Written")
			}
			firstRun := time.Since(start)

			// Checkpoints: out-b, the leaf Edge writes first and what the third step reads (out-a
			// need not be: nothing reads it again). Copies: of both, made as they are written.
			By("waiting for the policy's protection")
			protected := time.Now()
			Eventually(func(g Gomega) {
				for _, s := range chainSteps[:2] {
					var l datav1alpha1.Lineage
					g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: s.name}, &l)).To(Succeed())
					switch {
					case mode.name == "checkpoint" && s.output == "out-b":
						g.Expect(l.Status.Outputs).To(HaveExactElements(HaveField("State", datav1alpha1.OutputCheckpointed)), "%s", s.output)
					case mode.name == "replication":
						g.Expect(l.Status.Outputs).To(HaveExactElements(HaveField("Replicas", BeEquivalentTo(2))), "%s", s.output)
					}
				}
			}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for the outputs to be protected")
			protect := time.Since(protected)

			stopped := time.Now()
			stopNode(ctx, nodes[0])
			By("the third step, on " + nodes[1] + ", reads out-b")
			c := chainSteps[2]
			Expect(k8sClient.Create(ctx, output(c))).To(Succeed())
			Expect(k8sClient.Create(ctx, copyLineage(namespace, c.name, c.input, c.output, nodes[1], true))).To(Succeed())
			waitLineage(ctx, namespace, c.name, "Written")
			afterStop := time.Since(stopped)
			Expect(sumClaim(ctx, namespace, nodes[1], c.output)).To(Equal(contents(written)), "out-c, byte for byte")

			recomputations := 0
			for _, s := range chainSteps[:2] {
				var l datav1alpha1.Lineage
				Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: s.name}, &l)).To(Succeed())
				recomputations += int(l.Status.Recomputations)
			}
			r := issResult{Mode: mode.name, FirstRun: firstRun.Seconds(), Protect: protect.Seconds(), AfterStop: afterStop.Seconds(), Recomputations: recomputations}
			GinkgoWriter.Printf("ISS %s: %+v\n", mode.name, r)
			results = append(results, r)
			if mode.name != "recomputation" {
				Expect(recomputations).To(BeZero(), "with %s nothing is recomputed", mode.name)
			}
		})
	}
})

// issResult is one mode of the ISS benchmark, in seconds.
type issResult struct {
	Mode           string  `json:"mode"`
	FirstRun       float64 `json:"firstRunSeconds"`
	Protect        float64 `json:"protectSeconds"`
	AfterStop      float64 `json:"afterStopSeconds"`
	Recomputations int     `json:"recomputations"`
}
