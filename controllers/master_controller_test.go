package controllers

import (
	"maps"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// testMasterSpec is the master the suite's operator deploys.
var testMasterSpec = MasterSpec{
	Namespace:       "strata-system",
	Name:            "strata-master",
	Image:           "strata-cache/master:test",
	ImagePullPolicy: corev1.PullIfNotPresent,
	Replicas:        3,
	Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	},
	Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}},
	TLS:         ComponentTLS{CABundle: "strata-ca-bundle", IssuerURL: "https://strata-issuer.strata-system.svc:9444"},
}

var _ = Describe("The master reconciler", func() {
	key := client.ObjectKey{Namespace: testMasterSpec.Namespace, Name: testMasterSpec.Name}

	getStatefulSet := func(g Gomega) *appsv1.StatefulSet {
		sts := &appsv1.StatefulSet{}
		g.Expect(k8sClient.Get(ctx, key, sts)).To(Succeed())
		return sts
	}

	It("deploys the master as a StatefulSet of three replicas that start together", func() {
		Eventually(func(g Gomega) {
			sts := getStatefulSet(g)
			g.Expect(sts.Spec.Replicas).To(HaveValue(Equal(int32(3))))
			g.Expect(sts.Spec.PodManagementPolicy).To(Equal(appsv1.ParallelPodManagement))
			g.Expect(sts.Spec.ServiceName).To(Equal("strata-master-peers"))
			container := sts.Spec.Template.Spec.Containers[0]
			g.Expect(container.Image).To(Equal("strata-cache/master:test"))
			g.Expect(container.Args).To(ContainElements("--statefulset", "--service=strata-master-peers", "--replicas=3"))
			g.Expect(sts.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Name", "data")),
				"without a storage size the data directory is an emptyDir")
		}).Should(Succeed(), "waiting for StatefulSet %s", key)
	})

	It("spreads the replicas one per node, strictly, over the nodes whose taints they tolerate", func() {
		Eventually(func(g Gomega) {
			pod := getStatefulSet(g).Spec.Template.Spec
			g.Expect(pod.Tolerations).To(Equal(testMasterSpec.Tolerations))
			g.Expect(pod.TopologySpreadConstraints).To(HaveExactElements(And(
				HaveField("MaxSkew", int32(1)),
				HaveField("TopologyKey", corev1.LabelHostname),
				HaveField("WhenUnsatisfiable", corev1.DoNotSchedule),
				HaveField("NodeTaintsPolicy", HaveValue(Equal(corev1.NodeInclusionPolicyHonor))),
			)))
		}).Should(Succeed(), "waiting for StatefulSet %s", key)
	})

	It("publishes replicas to their peers before they are ready, and serves clients on a second Service", func() {
		Eventually(func(g Gomega) {
			peers := &corev1.Service{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: "strata-master-peers"}, peers)).To(Succeed())
			g.Expect(peers.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))
			g.Expect(peers.Spec.PublishNotReadyAddresses).To(BeTrue())
			clients := &corev1.Service{}
			g.Expect(k8sClient.Get(ctx, key, clients)).To(Succeed())
			g.Expect(clients.Spec.Ports).To(ContainElement(HaveField("Port", int32(MasterGRPCPort))))
		}).Should(Succeed(), "waiting for the master's Services")
	})

	It("recreates the StatefulSet when someone deletes it", func() {
		var uid string
		Eventually(func(g Gomega) { uid = string(getStatefulSet(g).UID) }).Should(Succeed())
		Expect(k8sClient.Delete(ctx, &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}})).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(string(getStatefulSet(g).UID)).NotTo(Equal(uid))
		}).Should(Succeed(), "waiting for a new StatefulSet %s", key)
	})

	It("puts back a replica count or an image someone changed", func() {
		Eventually(func(g Gomega) {
			sts := getStatefulSet(g)
			sts.Spec.Replicas = ptr.To[int32](1)
			sts.Spec.Template.Spec.Containers[0].Image = "someone/else:latest"
			g.Expect(k8sClient.Update(ctx, sts)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			sts := getStatefulSet(g)
			g.Expect(sts.Spec.Replicas).To(HaveValue(Equal(int32(3))))
			g.Expect(sts.Spec.Template.Spec.Containers[0].Image).To(Equal("strata-cache/master:test"))
		}).Should(Succeed(), "waiting for the operator to restore StatefulSet %s", key)
	})

	It("replaces at once the replicas of a version that spoke no TLS, and leaves those that do", func() {
		replica := func(name string, args ...string) *corev1.Pod {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: key.Namespace, Labels: testMasterSpec.selector()},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "master", Image: "strata-cache/master:old", Args: args}}},
			}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			return p
		}
		old := []*corev1.Pod{replica("strata-master-0", "--statefulset"), replica("strata-master-1", "--statefulset")}
		current := replica("strata-master-2", "--statefulset", "--ca-file=/var/run/strata/identity/ca.crt")
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, current))).To(Succeed()) })

		By("changing the StatefulSet, as an upgrade of the operator does")
		Eventually(func(g Gomega) {
			sts := getStatefulSet(g)
			sts.Spec.Template.Spec.Containers[0].Image = "strata-cache/master:old"
			g.Expect(k8sClient.Update(ctx, sts)).To(Succeed())
		}).Should(Succeed())
		for _, p := range old {
			Eventually(func() bool {
				return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{}))
			}).Should(BeTrue(), "waiting for the plaintext replica %s to be replaced", p.Name)
		}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(current), &corev1.Pod{})).To(Succeed(), "a replica on TLS stays")
	})

	It("replaces a replica of an earlier revision that never started, so that a fixed rollout goes on, and leaves the others", func() {
		const oldRevision, newRevision = "strata-master-old", "strata-master-new"
		replica := func(name, revision string, status corev1.PodStatus) *corev1.Pod {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: key.Namespace, Labels: testMasterSpec.selector()},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "master", Image: "strata-cache/master:gone",
					Args: []string{"--ca-file=/var/run/strata/identity/ca.crt"}}}},
			}
			p.Labels = maps.Clone(p.Labels)
			p.Labels[appsv1.ControllerRevisionHashLabelKey] = revision
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			p.Status = status
			Expect(k8sClient.Status().Update(ctx, p)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, p))).To(Succeed()) })
			return p
		}
		waiting := func(reason string) corev1.PodStatus {
			return corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: "master",
				Image: "strata-cache/master:gone", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}}}
		}
		running := corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "master",
			Image: "strata-cache/master:test", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
		unscheduled := corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled,
			Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available"}}}

		serving := replica("strata-master-20", oldRevision, running)                       // not ready, or ready: its container runs
		creating := replica("strata-master-21", oldRevision, waiting("ContainerCreating")) // starting, as a rollout makes them
		updated := replica("strata-master-22", newRevision, waiting("ErrImagePull"))       // the new revision's: the user's to fix
		stalled := []*corev1.Pod{
			replica("strata-master-23", oldRevision, waiting("ImagePullBackOff")),
			replica("strata-master-24", oldRevision, waiting("CrashLoopBackOff")),
			replica("strata-master-25", oldRevision, unscheduled),
		}

		By("the StatefulSet controller having seen a new template, as a fixed `helm upgrade` makes")
		Eventually(func(g Gomega) {
			sts := getStatefulSet(g)
			sts.Status = appsv1.StatefulSetStatus{ObservedGeneration: sts.Generation, Replicas: 3,
				CurrentRevision: oldRevision, UpdateRevision: newRevision}
			g.Expect(k8sClient.Status().Update(ctx, sts)).To(Succeed())
		}).Should(Succeed())
		DeferCleanup(func() {
			Eventually(func(g Gomega) {
				sts := getStatefulSet(g)
				sts.Status = appsv1.StatefulSetStatus{}
				g.Expect(k8sClient.Status().Update(ctx, sts)).To(Succeed())
			}).Should(Succeed())
		})
		for _, p := range stalled {
			Eventually(func() bool {
				return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{}))
			}).Should(BeTrue(), "waiting for the stalled replica %s to be replaced", p.Name)
		}
		for _, p := range []*corev1.Pod{serving, creating, updated} {
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{})).To(Succeed(), "%s stays", p.Name)
		}
		Eventually(func(g Gomega) {
			var events corev1.EventList
			g.Expect(k8sClient.List(ctx, &events, client.InNamespace(key.Namespace))).To(Succeed())
			var said []string
			for _, e := range events.Items {
				if e.Reason == "ReplacedStalledReplica" && e.InvolvedObject.Name == key.Name {
					said = append(said, e.Message)
				}
			}
			g.Expect(said).To(ContainElement(And(ContainSubstring("deleted replica strata-master-23 of revision strata-master-old"),
				ContainSubstring("never started (master: ImagePullBackOff)"), ContainSubstring("at revision strata-master-new"))))
			g.Expect(said).To(ContainElement(ContainSubstring("never started (not scheduled: 0/3 nodes are available)")))
		}).Should(Succeed())
	})

	It("lists the replicas' addresses in ordinal order for clients", func() {
		Expect(testMasterSpec.Addresses()).To(Equal([]string{
			"strata-master-0.strata-master-peers.strata-system.svc:7001",
			"strata-master-1.strata-master-peers.strata-system.svc:7001",
			"strata-master-2.strata-master-peers.strata-system.svc:7001",
		}))
	})
})
