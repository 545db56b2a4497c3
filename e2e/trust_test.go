//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/controllers"
	"github.com/strata-cache/strata/internal/pki"
)

// attempt is one line of `testkit attack`.
type attempt struct {
	Op    string `json:"op"`
	Code  string `json:"code"`
	Error string `json:"error"`
}

// The operations testkit attack tries, every one of which a tenant's pod must be refused.
var attackOps = []string{"read-block", "write-block", "list-files", "delete-dataset", "join", "mark-worker-lost", "register-worker"}

var _ = Describe("A tenant's cached data, against a pod of another namespace", Ordered, Label("smoke", "trust"), func() {
	var (
		tenant, attacker string
		pool             string
		nodes            []string
		written          []object
		target           []string
	)
	const bucket = "e2e-trust"

	BeforeAll(func(ctx SpecContext) {
		tenant = testNamespace(ctx, "e2e-tenant-")
		attacker = testNamespace(ctx, "e2e-attacker-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "trust", "4Mi")

		By("caching a tenant's 6 MiB object on " + nodes[0] + " by reading it through its claim")
		written = putObjects(ctx, tenant, nodes[0], bucket, []string{tenant + "/private.bin"}, 6<<20, 21)
		for i := range written {
			written[i].Key = strings.TrimPrefix(written[i].Key, tenant+"/")
		}
		ds := minioDataset(tenant, "private", pool, "s3://"+bucket+"/"+tenant+"/")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)
		Expect(sumClaim(ctx, tenant, nodes[0], "private")).To(Equal(contents(written)))

		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
		worker := workerPod(ctx, pool, nodes[0])
		Expect(worker).NotTo(BeNil())
		target = attackTarget(worker, pool, ds, "private.bin", written[0].ETag)
	})
	AfterEach(func() { dumpOnFailure(tenant, attacker) })

	It("refuses every call of a pod that holds no certificate", func(ctx SpecContext) {
		refusedAll(runAttack(ctx, testkitPod(attacker, nodes[1], append([]string{"attack"}, target...)...)), "a pod with no certificate:")
	})

	It("refuses every call of a pod whose certificate names a Strata component but is signed by another CA", func(ctx SpecContext) {
		var bundle corev1.ConfigMap
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: "strata-ca-bundle"}, &bundle)).To(Succeed())
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "strata-ca", Namespace: attacker}, Data: bundle.Data,
		})).To(Succeed())
		pod := testkitPod(attacker, nodes[1], append([]string{"attack", "--ca-file=/ca/ca.crt", "--forge", pki.Operator().String()}, target...)...)
		pod.Spec.Volumes = []corev1.Volume{{Name: "ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "strata-ca"},
		}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "ca", MountPath: "/ca"}}
		refusedAll(runAttack(ctx, pod), "a forged operator certificate:")
	})

	It("lets a worker's certificate read the block, but not act for another worker or as the operator", func(ctx SpecContext) {
		issueTestkitCertificate(ctx, attacker, pki.Worker("e2e-testkit", nodes[1]))
		got := runAttack(ctx, withTestkitTLS(testkitPod(attacker, nodes[1], append([]string{"attack"}, target...)...)))
		// The positive control: the block id is the tenant's, and a worker may read it.
		Expect(got["read-block"].Code).To(Equal("OK"), "a worker's certificate reads a peer's block: %+v", got["read-block"])
		for _, op := range []string{"delete-dataset", "join", "mark-worker-lost", "register-worker"} {
			Expect(got[op].Code).To(Equal("PermissionDenied"), "%s with another worker's certificate: %+v", op, got[op])
		}
	})

	It("still serves the tenant's pod every byte, from both nodes", func(ctx SpecContext) {
		for _, node := range nodes {
			Expect(sumClaim(ctx, tenant, node, "private")).To(Equal(contents(written)), "what the tenant read on %s", node)
		}
	})
})

// attackTarget are the flags of testkit attack against the Dataset ds, cached by worker (of
// pool): what the issue's attacker computed, the first block of file from the Dataset's UID,
// the file's name and its version (an ETag anyone who lists the bucket sees; empty for the
// releases before block ids had versions), on the worker that cached it.
func attackTarget(worker *corev1.Pod, pool string, ds *datav1alpha1.Dataset, file, etag string) []string {
	return []string{
		"--master", strings.Join(masterAddresses(3), ","),
		"--worker", pool + "/" + worker.Spec.NodeName,
		"--worker-addr", fmt.Sprintf("%s:%d", worker.Status.PodIP, controllers.WorkerDataPort),
		"--block", cache.BlockID(string(ds.UID), file, etag, 0),
		"--dataset", datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID)),
	}
}

// runAttack runs a testkit attack pod and returns how each attempt ended, by operation.
func runAttack(ctx context.Context, pod *corev1.Pod) map[string]attempt {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	waitSucceeded(ctx, pod)
	got := map[string]attempt{}
	for _, line := range strings.Split(strings.TrimSpace(podLogs(ctx, pod)), "\n") {
		var a attempt
		Expect(json.Unmarshal([]byte(line), &a)).To(Succeed(), "testkit attack printed %q", line)
		got[a.Op] = a
	}
	return got
}

// refusedAll checks that every operation of attackOps was tried and refused.
func refusedAll(got map[string]attempt, why string) {
	GinkgoHelper()
	Expect(got).To(HaveLen(len(attackOps)), "testkit attack tried every operation")
	for _, op := range attackOps {
		Expect(got[op].Code).NotTo(Equal("OK"), "%s %s got through: %+v", why, op, got[op])
	}
}
