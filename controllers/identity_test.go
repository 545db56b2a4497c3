package controllers

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/strata-cache/strata/controllers/identity"
	"github.com/strata-cache/strata/internal/pki"
)

var _ = Describe("The certificate issuer's attester", func() {
	const system = "strata-system"
	attester := &identity.PodAttester{Namespace: system, Components: []identity.Component{
		identity.Worker(WorkerServiceAccountName), identity.Master(MasterServiceAccountName, "strata-master"),
		identity.CSINode("strata-csi-node"),
	}}

	// pod runs as sa in namespace with the component labels, scheduled on node-a at ip.
	pod := func(ctx context.Context, namespace, sa string, labels map[string]string, ip string) *corev1.Pod {
		GinkgoHelper()
		Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: namespace},
		}))).To(Succeed())
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "component-", Namespace: namespace, Labels: labels},
			Spec: corev1.PodSpec{
				ServiceAccountName: sa, NodeName: "node-a", Subdomain: "strata-master-peers",
				Containers: []corev1.Container{{Name: "c", Image: "strata-cache/worker:test"}},
			},
		}
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		Expect(k8sClient.Status().Update(ctx, p)).To(Succeed())
		return p
	}
	// token is what the kubelet projects into p: a token of its ServiceAccount bound to it.
	token := func(ctx context.Context, p *corev1.Pod, audience string) string {
		GinkgoHelper()
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: p.Spec.ServiceAccountName, Namespace: p.Namespace}}
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences:      []string{audience},
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		}}
		Expect(k8sClient.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
		return tr.Status.Token
	}
	workerLabels := map[string]string{"app.kubernetes.io/name": "strata-worker", "app.kubernetes.io/instance": "fast"}

	BeforeEach(func(ctx SpecContext) {
		attester.Client = k8sClient
		Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: system}}))).To(Succeed())
	})

	It("certifies a worker pod as its pool's worker on its node, at its IP", func(ctx SpecContext) {
		p := pod(ctx, system, WorkerServiceAccountName, workerLabels, "10.1.2.3")
		leaf, err := attester.Attest(ctx, token(ctx, p, identity.Audience))
		Expect(err).NotTo(HaveOccurred())
		Expect(leaf.Identity).To(Equal(pki.Worker("fast", "node-a")))
		Expect(leaf.IPs).To(HaveLen(1))
		Expect(leaf.IPs[0].String()).To(Equal("10.1.2.3"))
	})

	It("certifies a master pod for the names of its headless Service", func(ctx SpecContext) {
		p := pod(ctx, system, MasterServiceAccountName, map[string]string{"app.kubernetes.io/name": "strata-master"}, "10.1.2.4")
		leaf, err := attester.Attest(ctx, token(ctx, p, identity.Audience))
		Expect(err).NotTo(HaveOccurred())
		Expect(leaf.Identity).To(Equal(pki.Master(p.Name)))
		Expect(leaf.DNSNames).To(ContainElement(p.Name + ".strata-master-peers." + system + ".svc.cluster.local"))
	})

	It("certifies a CSI node plugin pod as the plugin of its node", func(ctx SpecContext) {
		p := pod(ctx, system, "strata-csi-node", map[string]string{"app.kubernetes.io/component": "csi-node"}, "10.1.2.9")
		leaf, err := attester.Attest(ctx, token(ctx, p, identity.Audience))
		Expect(err).NotTo(HaveOccurred())
		Expect(leaf.Identity).To(Equal(pki.CSINode("node-a")))
	})

	It("refuses a token made for another audience, such as the API server's", func(ctx SpecContext) {
		p := pod(ctx, system, WorkerServiceAccountName, workerLabels, "10.1.2.5")
		_, err := attester.Attest(ctx, token(ctx, p, "https://kubernetes.default.svc"))
		Expect(err).To(MatchError(pki.ErrNotAttested))
	})

	It("refuses a pod of a tenant's namespace that copies the workers' labels and account name", func(ctx SpecContext) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tenant-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		p := pod(ctx, ns.Name, WorkerServiceAccountName, workerLabels, "10.1.2.6")
		_, err := attester.Attest(ctx, token(ctx, p, identity.Audience))
		Expect(err).To(MatchError(ContainSubstring("is not a ServiceAccount of namespace " + system)))
		Expect(err).To(MatchError(pki.ErrNotAttested))
	})

	It("refuses a pod of the release namespace that runs as another account", func(ctx SpecContext) {
		p := pod(ctx, system, "default", workerLabels, "10.1.2.7")
		_, err := attester.Attest(ctx, token(ctx, p, identity.Audience))
		Expect(err).To(MatchError(pki.ErrNotAttested))
	})

	It("refuses the token of a pod that is gone", func(ctx SpecContext) {
		p := pod(ctx, system, WorkerServiceAccountName, workerLabels, "10.1.2.8")
		tok := token(ctx, p, identity.Audience)
		Expect(k8sClient.Delete(ctx, p, client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{}))
		}).WithContext(ctx).Should(BeTrue(), "waiting for the pod to be gone")
		_, err := attester.Attest(ctx, tok)
		Expect(err).To(MatchError(pki.ErrNotAttested))
	})
})

var _ = Describe("Strata's CA", func() {
	var namespace string
	BeforeEach(func(ctx SpecContext) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ca-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
	})
	bundle := func(ctx context.Context) string {
		GinkgoHelper()
		cm := &corev1.ConfigMap{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "strata-ca-bundle"}, cm)).To(Succeed())
		return cm.Data[identity.BundleKey]
	}

	It("is made once, and every operator replica after the first reads the same one", func(ctx SpecContext) {
		first, err := identity.EnsureCA(ctx, k8sClient, namespace, "strata-ca", "strata-ca-bundle")
		Expect(err).NotTo(HaveOccurred())
		second, err := identity.EnsureCA(ctx, k8sClient, namespace, "strata-ca", "strata-ca-bundle")
		Expect(err).NotTo(HaveOccurred())
		Expect(second.CertPEM).To(Equal(first.CertPEM))
		Expect(bundle(ctx)).To(Equal(string(first.CertPEM)), "components trust the CA through the bundle")
	})

	It("comes from cert-manager when the chart says so: the operator waits for its Secret and makes none", func(ctx SpecContext) {
		type result struct {
			ca  *pki.CA
			err error
		}
		done := make(chan result, 1)
		waitCtx, cancel := context.WithCancel(ctx)
		DeferCleanup(cancel)
		go func() {
			ca, err := identity.WaitForCA(waitCtx, k8sClient, namespace, "strata-ca", "strata-ca-bundle", GinkgoLogr)
			done <- result{ca, err}
		}()
		Consistently(done, "1s").ShouldNot(Receive(), "the operator waits while there is no Secret")
		Expect(apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "strata-ca"}, &corev1.Secret{}))).
			To(BeTrue(), "the operator made no CA of its own")

		By("writing the Secret as cert-manager does for a Certificate with isCA and a PKCS#8 key")
		issued, err := pki.NewCA("issued by cert-manager", time.Now())
		Expect(err).NotTo(HaveOccurred())
		Expect(k8sClient.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "strata-ca", Namespace: namespace}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: issued.CertPEM, corev1.TLSPrivateKeyKey: issued.KeyPEM, "ca.crt": issued.CertPEM},
		})).To(Succeed())
		var got result
		Eventually(done).WithTimeout(30 * time.Second).Should(Receive(&got))
		Expect(got.err).NotTo(HaveOccurred())
		Expect(got.ca.CertPEM).To(Equal(issued.CertPEM))
		Expect(bundle(ctx)).To(Equal(string(issued.CertPEM)))
	})
})
