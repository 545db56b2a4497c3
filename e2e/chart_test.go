//go:build e2e

package e2e

import (
	"os/exec"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

var (
	helmPath = envOr("HELM", "helm")
	// imageTag is the tag of the images this run installs: E2E_IMAGE_TAG (the Makefile's
	// VERSION), or else the tag of the release installed (deployedImageTag).
	imageTag    = envOr("E2E_IMAGE_TAG", "")
	releaseName = "strata"
)

// helm runs the Helm CLI against the e2e cluster and fails the spec, with Helm's output, on error.
func helm(args ...string) {
	args = append([]string{"--kube-context", kubeContext, "--namespace", strataNamespace}, args...)
	out, err := exec.Command(helmPath, args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "helm %v:\n%s", args, out)
}

// installStrata installs or upgrades the release as hack/kind/strata-values.yaml and this run's
// images say, with values on top, and waits until it is ready.
func installStrata(values ...string) {
	GinkgoHelper()
	helm(append([]string{"upgrade", "--install", releaseName, "../charts/strata", "--values", "../hack/kind/strata-values.yaml",
		"--set", "image.tag=" + imageTag, "--wait", "--timeout", "5m"}, values...)...)
}

var _ = Describe("The Helm chart", Ordered, Label("chart"), func() {
	var namespace string

	BeforeAll(func(ctx SpecContext) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-chart-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
		DeferCleanup(func(ctx SpecContext) { Expect(k8sClient.Delete(ctx, ns)).To(Succeed()) })
	})
	AfterEach(func() { dumpOnFailure(namespace) })

	It("removes everything it installed on helm uninstall, but the CRDs and the user's Datasets", func(ctx SpecContext) {
		dataset := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: "s3://bucket/prefix"}},
		}
		Expect(k8sClient.Create(ctx, dataset)).To(Succeed())
		// A Lineage's pod whose attempt is not settled, deleted: it waits for the operator.
		waiting := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "unsettled", Namespace: namespace,
				Labels: map[string]string{"data.strata.dev/lineage": "step"}, Finalizers: []string{"data.strata.dev/attempt"}},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"strata-e2e": "nowhere"}, // never runs
				Containers:   []corev1.Container{{Name: "step", Image: "example.com/step:1"}},
			},
		}
		Expect(k8sClient.Create(ctx, waiting)).To(Succeed())
		Expect(k8sClient.Delete(ctx, waiting)).To(Succeed())

		helm("uninstall", releaseName, "--wait", "--timeout", "3m")
		// Reinstalled whatever happens next, so that the specs that follow find Strata running.
		DeferCleanup(func() { installStrata() })

		released := client.MatchingLabels{"app.kubernetes.io/instance": releaseName, "app.kubernetes.io/managed-by": "Helm"}
		inRelease := client.InNamespace(strataNamespace)
		for name, list := range map[string]client.ObjectList{
			"Deployments":         &appsv1.DeploymentList{},
			"DaemonSets":          &appsv1.DaemonSetList{},
			"CSIDrivers":          &storagev1.CSIDriverList{},
			"ServiceAccounts":     &corev1.ServiceAccountList{},
			"Services":            &corev1.ServiceList{},
			"Roles":               &rbacv1.RoleList{},
			"RoleBindings":        &rbacv1.RoleBindingList{},
			"ClusterRoles":        &rbacv1.ClusterRoleList{},
			"ClusterRoleBindings": &rbacv1.ClusterRoleBindingList{},
			"PriorityClasses":     &schedulingv1.PriorityClassList{},
			"Secrets":             &corev1.SecretList{},
			"MutatingWebhooks":    &admissionregistrationv1.MutatingWebhookConfigurationList{},
		} {
			Expect(k8sClient.List(ctx, list, released, inRelease)).To(Succeed(), "listing %s", name)
			Expect(list).To(HaveField("Items", BeEmpty()), "%s of the release are left after helm uninstall", name)
		}

		// The operator's Deployment owns the master it created, so the garbage collector removes it.
		Eventually(func(g Gomega) {
			var sets appsv1.StatefulSetList
			g.Expect(k8sClient.List(ctx, &sets, inRelease, client.MatchingLabels{"app.kubernetes.io/part-of": "strata"})).To(Succeed())
			g.Expect(sets.Items).To(BeEmpty())
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the master StatefulSet to be garbage-collected")

		// The pre-delete hook let it go: it is not left Terminating.
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(waiting), &corev1.Pod{}))
		}).WithContext(ctx).WithTimeout(minute).Should(BeTrue(), "the deleted pod of a Lineage is gone once Strata is uninstalled")

		// Helm never deletes CRDs: deleting them would delete every user's Datasets.
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(dataset), dataset)).To(Succeed())
	})
})
