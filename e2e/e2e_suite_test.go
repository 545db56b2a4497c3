//go:build e2e

// Package e2e holds the end-to-end suites. They run against the Kind cluster that
// `make e2e` (or `make e2e-smoke`) brings up with hack/kind/up.sh, with Strata installed by its
// Helm chart and MinIO deployed as the under-store; see the Makefile for the order.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// Settings of the run, from the environment the Makefile sets.
var (
	kubeContext     = envOr("E2E_KUBE_CONTEXT", "kind-strata")
	strataNamespace = envOr("E2E_STRATA_NAMESPACE", "strata-system")
	kubectlPath     = envOr("KUBECTL", "kubectl")
	testkitImage    = envOr("E2E_TESTKIT_IMAGE", "strata-cache/testkit:e2e")
	minioImage      = envOr("E2E_MINIO_IMAGE", "strata-cache/minio:e2e")
)

var (
	restConfig *rest.Config
	k8sClient  client.Client
	clientset  *kubernetes.Clientset
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Strata end-to-end suite")
}

var _ = BeforeSuite(func() {
	// The API server's warnings (a deprecated field of a manifest) go to the spec's output.
	log.SetLogger(GinkgoLogr)
	var err error
	restConfig, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(),
		&clientcmd.ConfigOverrides{CurrentContext: kubeContext},
	).ClientConfig()
	Expect(err).NotTo(HaveOccurred(), "loading kubeconfig context %s: is the cluster up (make kind-up)?", kubeContext)

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(datav1alpha1.AddToScheme(scheme)).To(Succeed())
	k8sClient, err = client.New(restConfig, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	clientset, err = kubernetes.NewForConfig(restConfig)
	Expect(err).NotTo(HaveOccurred())
	if imageTag == "" {
		imageTag = deployedImageTag()
	}
})

// deployedImageTag is the tag of the images of the release installed, for a run on a cluster
// `make deploy` set up (its images are tagged with the tree they were built from).
func deployedImageTag() string {
	dep := &appsv1.Deployment{}
	err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: strataNamespace, Name: releaseName + "-operator"}, dep)
	Expect(err).NotTo(HaveOccurred(), "E2E_IMAGE_TAG is not set, and no Strata is installed in %s to take it from: "+
		"set it to the tag of the images loaded into the cluster (make deploy prints it)", strataNamespace)
	image := dep.Spec.Template.Spec.Containers[0].Image
	return image[strings.LastIndex(image, ":")+1:]
}

// dumpOnFailure prints what a person would look at first when a spec fails: events, pods,
// `kubectl describe` and the logs of Strata's namespace and of the spec's own namespace.
func dumpOnFailure(namespaces ...string) {
	if !CurrentSpecReport().Failed() {
		return
	}
	for _, ns := range append([]string{strataNamespace}, namespaces...) {
		for _, args := range [][]string{
			{"get", "events", "--sort-by=.lastTimestamp"},
			{"get", "pods", "-o", "wide"},
			{"describe", "pods"},
			{"logs", "--all-containers", "--prefix", "--tail=200", "-l", "app.kubernetes.io/part-of=strata"},
		} {
			cmdArgs := append([]string{"--context", kubeContext, "-n", ns}, args...)
			out, _ := exec.Command(kubectlPath, cmdArgs...).CombinedOutput()
			GinkgoWriter.Printf("\n--- kubectl %v\n%s", cmdArgs, out)
		}
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// uniqueName gives each spec its own objects, so a failed run leaves nothing that breaks the next.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000_000)
}

// minute keeps the deadlines of Eventually readable.
const minute = time.Minute
