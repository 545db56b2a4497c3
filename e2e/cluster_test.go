//go:build e2e

package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/samples"
)

const (
	minioNamespace = "minio"
	minioEndpoint  = "http://minio.minio.svc:9000"
	cacheNodeLabel = "strata.dev/cache"
)

var _ = Describe("The e2e cluster", Ordered, Label("smoke"), func() {
	var namespace string

	BeforeAll(func(ctx SpecContext) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-cluster-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
		DeferCleanup(func(ctx SpecContext) { Expect(k8sClient.Delete(ctx, ns)).To(Succeed()) })
	})
	AfterEach(func() { dumpOnFailure(namespace, minioNamespace) })

	It("has a control plane and two cache nodes, all Ready, labelled with their zone and rack", func(ctx SpecContext) {
		var nodes corev1.NodeList
		Expect(k8sClient.List(ctx, &nodes)).To(Succeed())
		Expect(nodes.Items).To(HaveLen(3))
		cacheNodes := 0
		for _, node := range nodes.Items {
			Expect(nodeReady(&node)).To(BeTrue(), "node %s is not Ready", node.Name)
			if node.Labels[cacheNodeLabel] == "true" {
				cacheNodes++
				Expect(node.Labels).To(HaveKey("topology.kubernetes.io/zone"), "cache node %s", node.Name)
				Expect(node.Labels).To(HaveKey("topology.strata.dev/rack"), "cache node %s", node.Name)
			}
		}
		Expect(cacheNodes).To(Equal(2))
	})

	It("runs the Strata operator, Ready", func(ctx SpecContext) {
		Eventually(func(g Gomega) {
			var deploy appsv1.Deployment
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: "strata-operator"}, &deploy)).To(Succeed())
			g.Expect(deploy.Status.ObservedGeneration).To(Equal(deploy.Generation))
			g.Expect(deploy.Status.AvailableReplicas).To(Equal(*deploy.Spec.Replicas))
		}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for deployment %s/strata-operator to be available", strataNamespace)
	})

	It("serves the five Strata kinds", func() {
		resources, err := clientset.Discovery().ServerResourcesForGroupVersion("data.strata.dev/v1alpha1")
		Expect(err).NotTo(HaveOccurred())
		var kinds []string
		for _, r := range resources.APIResources {
			if !strings.Contains(r.Name, "/") {
				kinds = append(kinds, r.Kind)
			}
		}
		Expect(kinds).To(ConsistOf("Dataset", "Lineage", "CachePolicy", "TierPool", "DataLoad"))
	})

	It("accepts every sample of config/samples", func(ctx SpecContext) {
		objs, err := samples.Load(filepath.Join("..", "config", "samples"))
		Expect(err).NotTo(HaveOccurred())
		for _, obj := range objs {
			if obj.GetKind() == "TierPool" {
				obj.SetName(namespace + "-" + obj.GetName())
			} else {
				obj.SetNamespace(namespace)
			}
			Expect(k8sClient.Create(ctx, obj)).To(Succeed(), "creating %s %s", obj.GetKind(), obj.GetName())
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed()) })
		}
	})

	It("lets a pod on one node read an object from the in-cluster MinIO on another node", func(ctx SpecContext) {
		minioNode := runningPodNode(ctx, minioNamespace, "app.kubernetes.io/name=minio")
		var nodes corev1.NodeList
		Expect(k8sClient.List(ctx, &nodes, client.MatchingLabels{cacheNodeLabel: "true"})).To(Succeed())
		readerNode := ""
		for _, n := range nodes.Items {
			if n.Name != minioNode {
				readerNode = n.Name
				break
			}
		}
		Expect(readerNode).NotTo(BeEmpty(), "no cache node other than MinIO's node %s", minioNode)

		copyMinioCredentials(ctx, namespace)
		key := uniqueName("object")
		written := runTestkit(ctx, namespace, minioNode, "s3", "put", "--endpoint", minioEndpoint,
			"--bucket", "e2e", "--key", key, "--size", "8388608", "--seed", "42")
		read := runTestkit(ctx, namespace, readerNode, "s3", "get", "--endpoint", minioEndpoint,
			"--bucket", "e2e", "--key", key)
		Expect(read.Bytes).To(Equal(int64(8 << 20)))
		Expect(read.SHA256).To(Equal(written.SHA256), "bytes read on %s differ from bytes written on %s", readerNode, minioNode)
	})
})

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// runningPodNode returns the node of the one running, ready pod that matches selector.
func runningPodNode(ctx context.Context, namespace, selector string) string {
	var node string
	Eventually(func(g Gomega) {
		pods, err := clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pods.Items).To(HaveLen(1))
		g.Expect(pods.Items[0].Status.Phase).To(Equal(corev1.PodRunning))
		node = pods.Items[0].Spec.NodeName
	}).WithContext(ctx).WithTimeout(3*minute).Should(Succeed(), "waiting for one running pod %s in %s", selector, namespace)
	return node
}

// copyMinioCredentials gives namespace the Secret a user would create for a Dataset: MinIO's
// credentials under the keys spec.source.secretRef documents.
func copyMinioCredentials(ctx context.Context, namespace string) {
	var root corev1.Secret
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: minioNamespace, Name: "minio-root"}, &root)).To(Succeed())
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "minio-credentials", Namespace: namespace},
		Data: map[string][]byte{
			"accessKeyID":     root.Data["MINIO_ROOT_USER"],
			"secretAccessKey": root.Data["MINIO_ROOT_PASSWORD"],
		},
	}
	Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, secret))).To(Succeed())
}

// testNamespace creates a namespace for a suite, with MinIO's credentials in it, deleted when
// the suite ends.
func testNamespace(ctx context.Context, prefix string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(k8sClient.Delete(ctx, ns)).To(Succeed()) })
	copyMinioCredentials(ctx, ns.Name)
	return ns.Name
}

// cacheNodes are the names of the cluster's two cache nodes.
func cacheNodes(ctx context.Context) []string {
	GinkgoHelper()
	var list corev1.NodeList
	Expect(k8sClient.List(ctx, &list, client.MatchingLabels{cacheNodeLabel: "true"})).To(Succeed())
	var nodes []string
	for _, n := range list.Items {
		nodes = append(nodes, n.Name)
	}
	Expect(nodes).To(HaveLen(2), "the e2e cluster has two cache nodes")
	return nodes
}

// memoryPool creates a TierPool of the cache nodes with one 256 MiB memory tier (the tmpfs
// hack/kind/up.sh mounts) and the given block size (empty: the API's default), deleted when the
// suite ends, and returns its name.
func memoryPool(ctx context.Context, prefix, blockSize string) string {
	GinkgoHelper()
	tp := &datav1alpha1.TierPool{
		ObjectMeta: metav1.ObjectMeta{Name: uniqueName(prefix)},
		Spec: datav1alpha1.TierPoolSpec{
			NodeSelector: map[string]string{cacheNodeLabel: "true"},
			Tiers: []datav1alpha1.Tier{
				{Name: "mem", Medium: datav1alpha1.MediumMemory, Paths: []string{"/mnt/strata/mem"}, Quota: resource.MustParse("256Mi")},
			},
		},
	}
	if blockSize != "" {
		tp.Spec.BlockSize = resource.MustParse(blockSize)
	}
	Expect(k8sClient.Create(ctx, tp)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, tp))).To(Succeed()) })
	return tp.Name
}

// runTestkit runs testkit with args in a pod on node, waits for it to succeed and decodes the
// one line it prints.
func runTestkit(ctx context.Context, namespace, node string, args ...string) object {
	objs := runPod(ctx, testkitPod(namespace, node, args...))
	Expect(objs).To(HaveLen(1), "testkit %v printed %d lines", args, len(objs))
	return objs[0]
}

// testkitPod is a pod that runs testkit with args on node, with MinIO's credentials in its
// environment (from the Secret copyMinioCredentials made).
func testkitPod(namespace, node string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "testkit-", Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:            "testkit",
				Image:           testkitImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            args,
				Env: []corev1.EnvVar{
					secretEnv("AWS_ACCESS_KEY_ID", "minio-credentials", "accessKeyID"),
					secretEnv("AWS_SECRET_ACCESS_KEY", "minio-credentials", "secretAccessKey"),
				},
			}},
		},
	}
}

func podLogs(ctx context.Context, pod *corev1.Pod) string {
	raw, err := clientset.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return "(no logs: " + err.Error() + ")"
	}
	return string(raw)
}

func secretEnv(name, secret, key string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key,
	}}}
}

// stopNode stops a Kind node's container with docker stop, as a node is lost, and returns what
// starts it again; the spec's cleanup starts it, if not yet, and waits until it is Ready.
func stopNode(ctx context.Context, node string) (start func(ctx context.Context)) {
	GinkgoHelper()
	By("stopping " + node + " with docker stop")
	out, err := exec.CommandContext(ctx, "docker", "stop", node).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "docker stop: %s", out)
	started := false
	start = func(ctx context.Context) {
		if started {
			return
		}
		out, err := exec.CommandContext(ctx, "docker", "start", node).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "docker start: %s", out)
		started = true
	}
	DeferCleanup(func(ctx SpecContext) {
		start(ctx)
		Eventually(func(g Gomega) {
			var n corev1.Node
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: node}, &n)).To(Succeed())
			g.Expect(nodeReady(&n)).To(BeTrue())
			// Strata's own pods there (workers, the CSI node plugin, a master) serve again, so
			// that the specs that follow find the node as it was.
			var pods corev1.PodList
			g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(strataNamespace), client.MatchingFields{"spec.nodeName": node})).To(Succeed())
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
					continue // going, or done: nothing the next specs use
				}
				g.Expect(podReady(p)).To(BeTrue(), "pod %s on %s", p.Name, node)
			}
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for %s and Strata's pods on it to be Ready again", node)
	})
	return start
}
