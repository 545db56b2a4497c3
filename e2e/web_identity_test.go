//go:build e2e

package e2e

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/miniotest"
)

var _ = Describe("A Dataset read as a role", Label("smoke", "webidentity"), func() {
	It("lists and reads a bucket with a ServiceAccount's token that the under-store trades for a role, byte for byte on both nodes", func(ctx SpecContext) {
		namespace := testNamespace(ctx, "e2e-role-")
		DeferCleanup(func() { dumpOnFailure(namespace) })
		nodes := cacheNodes(ctx)
		pool := memoryPool(ctx, "role", "4Mi")

		By("running a MinIO that trusts the cluster's ServiceAccount tokens, as AWS STS trusts an IRSA cluster's issuer")
		const audience = "strata-e2e-sts"
		endpoint := stsMinio(ctx, namespace, audience)

		By("writing two objects to a bucket of it")
		keys := []string{"bert/weights.bin", "bert/vocab/en.txt"}
		want := runPod(ctx, testkitPod(namespace, nodes[0], "s3", "put", "--endpoint", endpoint, "--bucket", "models",
			"--key", keys[0]+","+keys[1], "--size", fmt.Sprint(5<<20+11), "--seed", "7"))
		for i := range want {
			want[i].Key = want[i].Key[len("bert/"):]
		}

		By("a Dataset that names a ServiceAccount and the role; no Secret of keys anywhere")
		Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "model-reader", Namespace: namespace}})).To(Succeed())
		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "bert", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Source: &datav1alpha1.DatasetSource{URI: "s3://models/bert/", Endpoint: endpoint, WebIdentity: &datav1alpha1.WebIdentity{
					RoleARN: miniotest.OpenIDRoleARN(audience), ServiceAccountName: "model-reader", Audience: audience,
				}},
				TierPoolName: pool,
			},
		}
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)
		Expect(ds.Status.Files).To(BeEquivalentTo(2))

		for _, node := range nodes {
			Expect(sumClaim(ctx, namespace, node, "bert")).To(Equal(contents(want)), "read on %s", node)
		}
	})
})

// stsMinio runs a MinIO in namespace that gives the readwrite policy to tokens of the cluster's
// ServiceAccount issuer for audience, and returns its endpoint. It reads the issuer's discovery
// document and keys from the API server, as AWS does from a cluster's public issuer, so the
// spec lets anonymous callers read those two documents while it runs (kubeadm lets only
// ServiceAccounts) and trusts the cluster's CA.
func stsMinio(ctx context.Context, namespace, audience string) string {
	GinkgoHelper()
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: namespace + "-issuer-discovery"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:service-account-issuer-discovery"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "system:unauthenticated"}},
	}
	Expect(k8sClient.Create(ctx, binding)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, binding))).To(Succeed()) })

	labels := map[string]string{"app.kubernetes.io/name": "sts-minio"}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "sts-minio", Namespace: namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name:            "minio",
						Image:           minioImage,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"server", "/data", "--address", ":9000", "--console-address", ":9001"},
						Env: []corev1.EnvVar{
							secretEnv("MINIO_ROOT_USER", "minio-credentials", "accessKeyID"),
							secretEnv("MINIO_ROOT_PASSWORD", "minio-credentials", "secretAccessKey"),
							{Name: "HOME", Value: "/tmp"},
							{Name: "MINIO_BROWSER", Value: "off"},
							{Name: "MINIO_IDENTITY_OPENID_CONFIG_URL", Value: "https://kubernetes.default.svc/.well-known/openid-configuration"},
							{Name: "MINIO_IDENTITY_OPENID_CLIENT_ID", Value: audience},
							{Name: "MINIO_IDENTITY_OPENID_ROLE_POLICY", Value: "readwrite"},
							// The API server's certificate is of the cluster's CA, which every pod is given.
							{Name: "SSL_CERT_FILE", Value: "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"},
						},
						Ports: []corev1.ContainerPort{{Name: "s3", ContainerPort: 9000}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
							Path: "/minio/health/ready", Port: intstr.FromString("s3"),
						}}, PeriodSeconds: 2},
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](10001), AllowPrivilegeEscalation: ptr.To(false),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "tmp", MountPath: "/tmp"}},
					}},
					Volumes: []corev1.Volume{
						{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				},
			},
		},
	}
	Expect(k8sClient.Create(ctx, deploy)).To(Succeed())
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sts-minio", Namespace: namespace},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "s3", Port: 9000, TargetPort: intstr.FromString("s3")}}},
	}
	Expect(k8sClient.Create(ctx, svc)).To(Succeed())
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(deploy), deploy)).To(Succeed())
		g.Expect(deploy.Status.ReadyReplicas).To(BeEquivalentTo(1))
	}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for MinIO with the cluster's issuer to be ready")
	return fmt.Sprintf("http://sts-minio.%s.svc:9000", namespace)
}
