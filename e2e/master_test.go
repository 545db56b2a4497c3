//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/strata-cache/strata/internal/pki"
)

const masterName = "strata-master"

// masterAddresses are the replicas' gRPC addresses, as the operator's MasterSpec lists them.
func masterAddresses(replicas int) []string {
	addrs := make([]string, replicas)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("%s-%d.%s-peers.%s.svc:7001", masterName, i, masterName, strataNamespace)
	}
	return addrs
}

var _ = Describe("The master", Ordered, Label("smoke", "master"), func() {
	var namespace string

	BeforeAll(func(ctx SpecContext) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-master-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
		DeferCleanup(func(ctx SpecContext) { Expect(k8sClient.Delete(ctx, ns)).To(Succeed()) })
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	waitForReplicas := func(ctx context.Context, what string) {
		Eventually(func(g Gomega) {
			var sts appsv1.StatefulSet
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: masterName}, &sts)).To(Succeed())
			g.Expect(sts.Status.ReadyReplicas).To(Equal(int32(3)))
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), what)
	}

	It("runs as a StatefulSet of three ready replicas, deployed by the operator", func(ctx SpecContext) {
		waitForReplicas(ctx, "waiting for 3 ready master replicas")
	})

	It("loses no acknowledged write when the leader's pod is deleted while a client writes", func(ctx SpecContext) {
		// The soak speaks to the master as a worker would, with a certificate from Strata's CA.
		issueTestkitCertificate(ctx, namespace, pki.Worker("e2e-testkit", "soak"))
		pod := withTestkitTLS(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "soak-", Namespace: namespace},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "soak", Image: testkitImage, ImagePullPolicy: corev1.PullNever,
					Args: []string{"master", "soak", "--addrs", strings.Join(masterAddresses(3), ","),
						"--dataset", namespace, "--duration", "40s"},
				}},
			},
		})
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())

		var leader string
		Eventually(func(g Gomega) {
			var first struct{ Leader string }
			line, _, _ := strings.Cut(podLogs(ctx, pod), "\n")
			g.Expect(json.Unmarshal([]byte(line), &first)).To(Succeed(), "first line of the soak: %q", line)
			leader = first.Leader
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the soak's first acknowledged write")
		leaderPod, _, _ := strings.Cut(leader, ".")
		Expect(leaderPod).To(HavePrefix(masterName+"-"), "leader address %q", leader)

		By("deleting the leader's pod " + leaderPod + " while the client writes")
		Expect(k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: leaderPod, Namespace: strataNamespace}})).To(Succeed())

		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
			g.Expect(pod.Status.Phase).NotTo(Equal(corev1.PodFailed), "the soak failed: %s", podLogs(ctx, pod))
			g.Expect(pod.Status.Phase).To(Equal(corev1.PodSucceeded))
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for the soak to finish")

		lines := strings.Split(strings.TrimSpace(podLogs(ctx, pod)), "\n")
		var res struct {
			Acknowledged, Lost, Failed int
			LongestGapMillis           int64
		}
		Expect(json.Unmarshal([]byte(lines[len(lines)-1]), &res)).To(Succeed(), "soak output: %v", lines)
		AddReportEntry("master failover", res)
		GinkgoWriter.Printf("soak: %d acknowledged, %d lost, %d failed, longest gap %d ms\n",
			res.Acknowledged, res.Lost, res.Failed, res.LongestGapMillis)
		Expect(res.Acknowledged).To(BeNumerically(">", 0))
		Expect(res.Lost).To(BeZero(), "acknowledged writes were lost")

		// The replacement pod starts with an empty data directory (an emptyDir) and rejoins.
		waitForReplicas(ctx, "waiting for the replaced replica to rejoin")
	})
})
