//go:build e2e

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/strata-cache/strata/internal/pki"
)

// testkitTLSSecret holds the certificate the suite issues to testkit in a test namespace.
const testkitTLSSecret = "testkit-tls"

// issueTestkitCertificate issues, from Strata's CA (its Secret, which only cluster
// administrators read), a certificate for id into the Secret testkit-tls of namespace: testkit
// then speaks to the master and the workers as that component would.
func issueTestkitCertificate(ctx context.Context, namespace string, id pki.Identity) {
	GinkgoHelper()
	var caSecret corev1.Secret
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: "strata-ca"}, &caSecret)).To(Succeed())
	ca, err := pki.ParseCA(caSecret.Data[corev1.TLSCertKey], caSecret.Data[corev1.TLSPrivateKeyKey])
	Expect(err).NotTo(HaveOccurred())
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	cert, err := ca.Issue(key.Public(), pki.Leaf{Identity: id}, time.Now())
	Expect(err).NotTo(HaveOccurred())
	der, err := x509.MarshalPKCS8PrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: testkitTLSSecret, Namespace: namespace},
		Data: map[string][]byte{
			"ca.crt":  ca.CertPEM,
			"tls.crt": cert,
			"tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		},
	}
	Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, secret))).To(Succeed())
}

// withTestkitTLS mounts testkit-tls into a testkit pod and adds the flags that use it.
func withTestkitTLS(pod *corev1.Pod) *corev1.Pod {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: testkitTLSSecret},
	}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "tls", MountPath: "/tls", ReadOnly: true})
	c.Args = append(c.Args, "--ca-file=/tls/ca.crt", "--cert-file=/tls/tls.crt", "--key-file=/tls/tls.key")
	return pod
}

// trustedTestkit runs testkit on node as a worker of a pool of its own ("e2e-testkit"), and
// decodes the one line it prints.
func trustedTestkit(ctx context.Context, namespace, node string, args ...string) object {
	GinkgoHelper()
	issueTestkitCertificate(ctx, namespace, pki.Worker("e2e-testkit", node))
	objs := runPod(ctx, withTestkitTLS(testkitPod(namespace, node, args...)))
	Expect(objs).To(HaveLen(1), "testkit %v printed %d lines", args, len(objs))
	return objs[0]
}
