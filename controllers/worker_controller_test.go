package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/tierstore"
)

// testWorkerSpec is what the suite's operator deploys as the workers of every pool.
var testWorkerSpec = WorkerSpec{
	Namespace:       testMasterSpec.Namespace,
	Image:           "strata-cache/worker:test",
	ImagePullPolicy: corev1.PullIfNotPresent,
	MasterAddresses: testMasterSpec.Addresses(),
	TLS:             testMasterSpec.TLS,
}

var _ = Describe("The worker reconciler", func() {
	var (
		pool     *datav1alpha1.TierPool
		selector map[string]string
		key      client.ObjectKey
	)

	BeforeEach(func() {
		selector = map[string]string{testLabel: fmt.Sprintf("workers-%d", specID.Add(1))}
		pool = createWorkerPool(selector)
		key = client.ObjectKey{Namespace: testWorkerSpec.Namespace, Name: WorkerName(pool.Name)}
	})

	getDaemonSet := func(g Gomega) *appsv1.DaemonSet {
		ds := &appsv1.DaemonSet{}
		g.Expect(k8sClient.Get(ctx, key, ds)).To(Succeed())
		return ds
	}
	getConfigMap := func(g Gomega) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{}
		g.Expect(k8sClient.Get(ctx, key, cm)).To(Succeed())
		return cm
	}

	It("writes the pool's tiers into a ConfigMap the worker can read", func() {
		Eventually(func(g Gomega) {
			cm := getConfigMap(g)
			g.Expect(metav1.IsControlledBy(cm, pool)).To(BeTrue(), "the TierPool controls the ConfigMap")
			g.Expect(cm.Labels).To(HaveKeyWithValue("app.kubernetes.io/instance", pool.Name))
			var tiers []datav1alpha1.Tier
			// What cmd/worker does with the file.
			g.Expect(yaml.UnmarshalStrict([]byte(cm.Data[WorkerTiersKey]), &tiers)).To(Succeed())
			g.Expect(tiers).To(HaveLen(2))
			g.Expect(tiers[0].Name).To(Equal("mem"))
			g.Expect(tiers[0].Medium).To(Equal(datav1alpha1.MediumMemory))
			g.Expect(tiers[0].Quota.String()).To(Equal("2Gi"))
			g.Expect(tiers[1].Paths).To(Equal([]string{"/mnt/strata/nvme0", "/mnt/strata/nvme1"}))
			g.Expect(tiers[1].Watermarks).To(Equal(datav1alpha1.Watermarks{High: 0.95, Low: 0.8}))
		}).Should(Succeed(), "awaiting ConfigMap %s with the pool's two tiers", key)
	})

	It("keeps the CachePolicies of the pool's Datasets in its policies file, live, without rolling the workers", func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "policies-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		cp := &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "pins", Namespace: ns.Name},
			Spec:       datav1alpha1.CachePolicySpec{PinnedPaths: []string{"labels/**"}},
		}
		Expect(k8sClient.Create(ctx, cp)).To(Succeed())
		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "pinned", Namespace: ns.Name},
			Spec: datav1alpha1.DatasetSpec{
				Source:       &datav1alpha1.DatasetSource{URI: "s3://bucket/prefix/"},
				TierPoolName: pool.Name, CachePolicyName: "pins",
			},
		}
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		master := datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID))
		policies := func(g Gomega) *policy.Set {
			set, err := policy.Parse([]byte(getConfigMap(g).Data[policy.FileName]))
			g.Expect(err).NotTo(HaveOccurred(), "what cmd/worker does with the file")
			return set
		}
		Eventually(func(g Gomega) {
			set := policies(g)
			g.Expect(set.Pinned(master, "labels/2024/a.txt", 0, 0)).To(BeTrue())
			g.Expect(set.Pinned(master, "images/a.jpg", 0, 0)).To(BeFalse())
		}).Should(Succeed(), "waiting for the pool's policies file to pin labels/**")
		// The reconciler writes the ConfigMap before the DaemonSet: the file can be seen first.
		var rolled *appsv1.DaemonSet
		Eventually(func(g Gomega) {
			rolled = getDaemonSet(g)
			g.Expect(rolled.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--policies=/etc/strata/" + policy.FileName))
		}).Should(Succeed(), "waiting for the pool's DaemonSet to give its workers the policies file")

		// A worker pod of the pool, as the DaemonSet would make it (envtest runs no kubelet).
		workerPod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: key.Name + "-", Namespace: key.Namespace, Labels: workerLabels(pool.Name)},
			Spec:       corev1.PodSpec{NodeName: "a-node", Containers: []corev1.Container{{Name: "worker", Image: testWorkerSpec.Image}}},
		}
		Expect(k8sClient.Create(ctx, workerPod)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, workerPod))).To(Succeed()) })
		markedWith := func(g Gomega) (string, string) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(workerPod), workerPod)).To(Succeed())
			sum := sha256.Sum256([]byte(getConfigMap(g).Data[policy.FileName]))
			return workerPod.Annotations[PoliciesHashAnnotation], hex.EncodeToString(sum[:8])
		}

		By("following a change of the CachePolicy, and marking the worker pods so that their kubelets refresh the file at once")
		setPinned := func(paths ...string) {
			// The CachePolicy reconciler writes its status meanwhile: read, change, retry.
			Eventually(func(g Gomega) {
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cp), cp)).To(Succeed())
				cp.Spec.PinnedPaths = paths
				g.Expect(k8sClient.Update(ctx, cp)).To(Succeed())
			}).Should(Succeed())
		}
		setPinned("images/*.jpg")
		Eventually(func(g Gomega) {
			set := policies(g)
			g.Expect(set.Pinned(master, "images/a.jpg", 0, 0)).To(BeTrue())
			g.Expect(set.Pinned(master, "labels/2024/a.txt", 0, 0)).To(BeFalse())
		}).Should(Succeed(), "waiting for the pool's policies file to follow the CachePolicy")
		Expect(getDaemonSet(Default).Spec.Template).To(Equal(rolled.Spec.Template), "the workers apply policies live: their pods are not rolled")
		Eventually(func(g Gomega) {
			marked, current := markedWith(g)
			g.Expect(marked).To(Equal(current), "the pod carries the hash of the policies file it should now see")
		}).Should(Succeed(), "waiting for the worker pod to be marked with the new policies file's hash")
		firstMark, _ := markedWith(Default)

		By("carrying its eviction policy, its share of the tiers and its promotion threshold")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cp), cp)).To(Succeed())
			cp.Spec.Eviction = datav1alpha1.EvictionSpec{Policy: datav1alpha1.EvictLRFU, Lambda: ptr.To(0.25),
				Watermarks: &datav1alpha1.Watermarks{High: 0.5, Low: 0.3}}
			cp.Spec.Promotion.AccessThreshold = 1
			g.Expect(k8sClient.Update(ctx, cp)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(policies(g).Rules()).To(HaveKeyWithValue(master, tierstore.DatasetRules{
				Eviction: eviction.Config{Kind: eviction.LRFU, Lambda: 0.25}, High: 0.5, Low: 0.3, PromotionThreshold: 1}))
		}).Should(Succeed(), "waiting for the pool's policies file to carry the rules")
		Eventually(func(g Gomega) {
			marked, current := markedWith(g)
			g.Expect(marked).To(And(Equal(current), Not(Equal(firstMark))), "a later change marks the pod again")
		}).Should(Succeed(), "waiting for the worker pod to be marked with the changed file's hash")

		By("carrying its replication, and the rack of every node, following the nodes' labels")
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "racked-", Labels: map[string]string{datav1alpha1.DefaultRackLabel: "r7"}}}
		Expect(k8sClient.Create(ctx, node)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, node))).To(Succeed()) })
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cp), cp)).To(Succeed())
			cp.Spec.Replication = datav1alpha1.ReplicationSpec{Count: 2, Scope: datav1alpha1.ReplicateSameRack}
			g.Expect(k8sClient.Update(ctx, cp)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			set := policies(g)
			r, ok := set.Replication(master)
			g.Expect(ok).To(BeTrue())
			g.Expect(r).To(Equal(policy.Replication{Count: 2, ScopeLabel: datav1alpha1.DefaultRackLabel, Selective: true,
				BandwidthBytes: 200 << 20}), "the defaults: selective, 200Mi a second")
			rack, _ := set.NodeLabel(node.Name, datav1alpha1.DefaultRackLabel)
			g.Expect(rack).To(Equal("r7"))
		}).Should(Succeed(), "waiting for the pool's policies file to carry the replication")
		node.Labels[datav1alpha1.DefaultRackLabel] = "r8"
		Expect(k8sClient.Update(ctx, node)).To(Succeed())
		Eventually(func(g Gomega) {
			rack, _ := policies(g).NodeLabel(node.Name, datav1alpha1.DefaultRackLabel)
			g.Expect(rack).To(Equal("r8"))
		}).Should(Succeed(), "waiting for the pool's policies file to follow the node to its new rack")

		By("leaving out a Dataset whose CachePolicy has a bad pattern, which the Dataset's status names")
		setPinned("images/[a-")
		Eventually(func(g Gomega) {
			g.Expect(policies(g).Datasets()).To(BeZero())
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			c := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(ReasonCachePolicyInvalid))
			g.Expect(c.Message).To(ContainSubstring(`spec.pinnedPaths[0]: path pattern "images/[a-"`))
		}).Should(Succeed())
	})

	It("gives the MRD Datasets of the pool the stages to their next read by a Lineage", func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "mrd-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		Expect(k8sClient.Create(ctx, &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "dag", Namespace: ns.Name},
			Spec:       datav1alpha1.CachePolicySpec{Eviction: datav1alpha1.EvictionSpec{Policy: datav1alpha1.EvictMRD}},
		})).To(Succeed())
		raw := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "raw", Namespace: ns.Name}, Spec: datav1alpha1.DatasetSpec{
			Source: &datav1alpha1.DatasetSource{URI: "s3://bucket/raw/"}, TierPoolName: pool.Name, CachePolicyName: "dag"}}
		features := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "features", Namespace: ns.Name}, Spec: datav1alpha1.DatasetSpec{
			Lineage: &datav1alpha1.LineageReference{Name: "extract"}, TierPoolName: pool.Name, CachePolicyName: "dag"}}
		model := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "model", Namespace: ns.Name}, Spec: datav1alpha1.DatasetSpec{
			Lineage: &datav1alpha1.LineageReference{Name: "train"}, TierPoolName: pool.Name, CachePolicyName: "dag"}}
		for _, ds := range []*datav1alpha1.Dataset{raw, features, model} {
			Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		}
		Expect(k8sClient.Create(ctx, newLineage(ns.Name, "extract", []string{"raw"}, []string{"features"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(ns.Name, "train", []string{"features"}, []string{"model"}))).To(Succeed())
		master := func(ds *datav1alpha1.Dataset) string {
			return datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID))
		}
		mrd := func(next int) tierstore.DatasetRules {
			// The API's default promotion threshold comes with the policy.
			return tierstore.DatasetRules{Eviction: eviction.Config{Kind: eviction.MRD}, NextUse: next, PromotionThreshold: 3}
		}
		Eventually(func(g Gomega) {
			set, err := policy.Parse([]byte(getConfigMap(g).Data[policy.FileName]))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(set.Rules()).To(And(
				HaveKeyWithValue(master(raw), mrd(0)),
				HaveKeyWithValue(master(features), mrd(1)),
				HaveKeyWithValue(master(model), mrd(tierstore.NoNextUse)),
			), "extract reads raw first, train features a stage later, nothing reads model")
		}).Should(Succeed(), "waiting for the pool's policies file to carry the next uses")
	})

	It("runs the workers as a DaemonSet on the pool's nodes, owned by the pool", func() {
		Eventually(func(g Gomega) {
			ds := getDaemonSet(g)
			g.Expect(metav1.IsControlledBy(ds, pool)).To(BeTrue(), "the TierPool controls the DaemonSet")
			g.Expect(ds.Labels).To(Equal(map[string]string{
				"app.kubernetes.io/name":       "strata-worker",
				"app.kubernetes.io/instance":   pool.Name,
				"app.kubernetes.io/component":  "worker",
				"app.kubernetes.io/part-of":    "strata",
				"app.kubernetes.io/managed-by": "strata-operator",
			}))
			g.Expect(ds.Spec.Selector.MatchLabels).To(Equal(map[string]string{
				"app.kubernetes.io/name": "strata-worker", "app.kubernetes.io/instance": pool.Name,
			}))
			g.Expect(ds.Spec.UpdateStrategy.Type).To(Equal(appsv1.RollingUpdateDaemonSetStrategyType))
			g.Expect(ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntValue()).To(Equal(1))

			pod := ds.Spec.Template.Spec
			g.Expect(pod.NodeSelector).To(Equal(selector))
			g.Expect(pod.Tolerations).To(Equal(pool.Spec.Tolerations))
			g.Expect(pod.ServiceAccountName).To(Equal(WorkerServiceAccountName))
			g.Expect(pod.AutomountServiceAccountToken).To(HaveValue(BeFalse()))
			g.Expect(pod.TerminationGracePeriodSeconds).To(HaveValue(BeEquivalentTo(30)))
			g.Expect(pod.PriorityClassName).To(BeEmpty(), "system-node-critical is refused outside kube-system")

			g.Expect(pod.Containers).To(HaveLen(1))
			worker := pod.Containers[0]
			g.Expect(worker.Name).To(Equal("worker"))
			g.Expect(worker.Image).To(Equal(testWorkerSpec.Image))
			g.Expect(worker.ImagePullPolicy).To(Equal(corev1.PullIfNotPresent))
			g.Expect(worker.SecurityContext.Privileged).To(HaveValue(BeTrue()))
			g.Expect(worker.Ports).To(ConsistOf(
				And(HaveField("Name", "data"), HaveField("ContainerPort", BeEquivalentTo(7100))),
				And(HaveField("Name", "metrics"), HaveField("ContainerPort", BeEquivalentTo(8080))),
			))
			g.Expect(worker.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
			g.Expect(worker.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
			g.Expect(worker.StartupProbe.HTTPGet.Path).To(Equal("/healthz"))
			g.Expect(worker.StartupProbe.FailureThreshold*worker.StartupProbe.PeriodSeconds).To(BeNumerically(">=", 30*60),
				"a worker verifying a big tier at start gets half an hour")
		}).Should(Succeed(), "awaiting DaemonSet %s", key)
	})

	It("passes the worker its flags and the environment they refer to", func() {
		Eventually(func(g Gomega) {
			worker := getDaemonSet(g).Spec.Template.Spec.Containers[0]
			g.Expect(worker.Args).To(Equal([]string{
				"--pool=" + pool.Name,
				"--worker-id=" + pool.Name + "/$(NODE_NAME)",
				"--node-name=$(NODE_NAME)",
				"--master=" + strings.Join(testMasterSpec.Addresses(), ","),
				"--tiers=/etc/strata/tiers.yaml",
				"--policies=/etc/strata/policies.json",
				"--checkpoints-url=" + testWorkerSpec.TLS.CheckpointsURL(pool.Name),
				"--index-dir=/var/lib/strata-worker/index",
				"--listings-dir=/var/lib/strata-worker/listings",
				"--data-addr=:7100",
				"--advertise-addr=$(POD_IP):7100",
				"--metrics-addr=:8080",
				"--mount-socket=/run/strata/" + pool.Name + "/mount.sock",
				"--fd-store-socket=/run/strata/fdstore/fdstore.sock",
				"--mounts-dir=/var/lib/strata-worker/" + pool.Name + "/mounts",
				"--block-size=67108864",
				"--ca-file=/var/run/strata/identity/ca.crt",
				"--issuer=" + testMasterSpec.TLS.IssuerURL,
				"--token-file=/var/run/strata/identity/token",
				"--file-source-roots=/srv/datasets",
			}))
			// The token the worker proves itself with is for the issuer alone.
			volumes := getDaemonSet(g).Spec.Template.Spec.Volumes
			g.Expect(volumes).To(ContainElement(HaveField("VolumeSource.Projected.Sources", ContainElement(
				HaveField("ServiceAccountToken.Audience", "issuer.strata.dev")))))
			g.Expect(worker.Env).To(ConsistOf(
				fieldEnvMatcher("NODE_NAME", "spec.nodeName"),
				fieldEnvMatcher("POD_IP", "status.podIP"),
				fieldEnvMatcher("POD_NAMESPACE", "metadata.namespace"),
			))
		}).Should(Succeed(), "awaiting the worker container of DaemonSet %s", key)
	})

	It("gives the worker the pool's resources, with the MEM tier's quota added to the memory limit", func() {
		Eventually(func(g Gomega) {
			resources := getDaemonSet(g).Spec.Template.Spec.Containers[0].Resources
			g.Expect(resources.Requests.Cpu().String()).To(Equal("200m"))
			g.Expect(resources.Requests.Memory().String()).To(Equal("256Mi"))
			g.Expect(resources.Limits.Memory().String()).To(Equal("3Gi"), "1Gi of spec.workerResources + 2Gi of tmpfs")
		}).Should(Succeed(), "awaiting the resources of DaemonSet %s", key)
	})

	It("mounts every tier path from the host at the same path, MEM paths with Bidirectional propagation", func() {
		Eventually(func(g Gomega) {
			pod := getDaemonSet(g).Spec.Template.Spec
			volumeOfHostPath := map[string]string{}
			for _, v := range pod.Volumes {
				g.Expect(validation.IsDNS1123Label(v.Name)).To(BeEmpty(), "volume names are DNS labels")
				if v.HostPath != nil {
					want := corev1.HostPathDirectoryOrCreate
					if v.HostPath.Path == "/srv/datasets" {
						want = corev1.HostPathDirectory // a source root is the administrator's, never created
					}
					g.Expect(v.HostPath.Type).To(HaveValue(Equal(want)), "volume %s", v.Name)
					volumeOfHostPath[v.HostPath.Path] = v.Name
				}
			}
			g.Expect(volumeOfHostPath).To(HaveLen(9), "three tier paths, the index, the kept listings, the socket, fd store and mounts directories, a source root")
			mountAt := map[string]corev1.VolumeMount{}
			for _, m := range pod.Containers[0].VolumeMounts {
				mountAt[m.MountPath] = m
			}
			for _, path := range []string{"/mnt/strata/mem", "/mnt/strata/nvme0", "/mnt/strata/nvme1"} {
				g.Expect(mountAt).To(HaveKeyWithValue(path, HaveField("Name", volumeOfHostPath[path])),
					"host path %s is mounted at the same path", path)
			}
			g.Expect(mountAt["/mnt/strata/mem"].MountPropagation).To(HaveValue(Equal(corev1.MountPropagationBidirectional)),
				"the worker's tmpfs must live on the host")
			g.Expect(mountAt["/mnt/strata/nvme0"].MountPropagation).To(BeNil())
			g.Expect(mountAt["/mnt/strata/nvme1"].MountPropagation).To(BeNil())

			index := "/var/lib/strata-worker/" + pool.Name + "/index"
			g.Expect(mountAt).To(HaveKeyWithValue("/var/lib/strata-worker/index", HaveField("Name", volumeOfHostPath[index])),
				"the block index survives the pod on the host")
			listings := "/var/lib/strata-worker/" + pool.Name + "/listings"
			g.Expect(mountAt).To(HaveKeyWithValue("/var/lib/strata-worker/listings", HaveField("Name", volumeOfHostPath[listings])),
				"the kept listings survive the pod on the host, for mounts while a source is down")
			socket := "/run/strata/" + pool.Name
			g.Expect(mountAt).To(HaveKeyWithValue(socket, HaveField("Name", volumeOfHostPath[socket])))
			g.Expect(mountAt).To(HaveKeyWithValue("/run/strata/fdstore", HaveField("Name", volumeOfHostPath["/run/strata/fdstore"])),
				"the CSI node plugin's file descriptor store, which keeps the worker's mounts up across its restarts")
			g.Expect(mountAt).To(HaveKeyWithValue("/etc/strata", And(HaveField("Name", "tiers"), HaveField("ReadOnly", BeTrue()))))
			mountsDir := "/var/lib/strata-worker/" + pool.Name + "/mounts"
			g.Expect(mountAt).To(HaveKeyWithValue(mountsDir, And(HaveField("Name", volumeOfHostPath[mountsDir]),
				HaveField("MountPropagation", HaveValue(Equal(corev1.MountPropagationBidirectional))))),
				"the worker's FUSE mounts must reach the host, where the CSI node plugin binds them into pods")
			g.Expect(mountAt).To(HaveKeyWithValue("/srv/datasets", HaveField("ReadOnly", BeTrue())),
				"file:// sources are read, never written")
			g.Expect(pod.Volumes).To(ContainElement(And(
				HaveField("Name", "tiers"),
				HaveField("VolumeSource.ConfigMap.LocalObjectReference.Name", WorkerName(pool.Name)),
			)))
		}).Should(Succeed(), "awaiting the volumes of DaemonSet %s", key)
	})

	It("records on the pool that it created the worker objects", func() {
		Eventually(func(g Gomega) []string {
			return poolEventMessages(g, pool, EventReasonCreated)
		}).Should(ContainElements(
			fmt.Sprintf("created ConfigMap %s", key),
			fmt.Sprintf("created DaemonSet %s", key),
		), "awaiting Created Events on TierPool %s", pool.Name)
	})

	It("updates the ConfigMap and rolls the pods when the pool's tiers change", func() {
		var hash string
		Eventually(func(g Gomega) {
			hash = getDaemonSet(g).Spec.Template.Annotations[TiersHashAnnotation]
			g.Expect(hash).NotTo(BeEmpty())
		}).Should(Succeed(), "awaiting DaemonSet %s with a tiers hash", key)

		patchPool(pool, func(p *datav1alpha1.TierPool) {
			p.Spec.Tiers = append(p.Spec.Tiers, datav1alpha1.Tier{
				Name: "hdd", Medium: datav1alpha1.MediumHDD, Paths: []string{"/mnt/strata/hdd"},
				Quota: resource.MustParse("100Gi"),
			})
		})
		Eventually(func(g Gomega) {
			g.Expect(getConfigMap(g).Data[WorkerTiersKey]).To(ContainSubstring("/mnt/strata/hdd"))
			ds := getDaemonSet(g)
			g.Expect(ds.Spec.Template.Annotations).To(HaveKeyWithValue(TiersHashAnnotation, Not(Equal(hash))))
			g.Expect(ds.Spec.Template.Spec.Containers[0].VolumeMounts).To(ContainElement(HaveField("MountPath", "/mnt/strata/hdd")))
		}).Should(Succeed(), "awaiting the new tier in ConfigMap and DaemonSet %s, and a new tiers hash", key)
		Eventually(func(g Gomega) []string {
			return poolEventMessages(g, pool, EventReasonUpdated)
		}).Should(ContainElement(fmt.Sprintf("updated DaemonSet %s to match the TierPool", key)),
			"awaiting an Updated Event on TierPool %s", pool.Name)
	})

	It("recreates the DaemonSet and the ConfigMap when someone deletes them", func() {
		var dsUID, cmUID string
		Eventually(func(g Gomega) {
			dsUID = string(getDaemonSet(g).UID)
			cmUID = string(getConfigMap(g).UID)
		}).Should(Succeed(), "awaiting the worker objects %s", key)

		Expect(k8sClient.Delete(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}})).To(Succeed())
		Expect(k8sClient.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}})).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(string(getDaemonSet(g).UID)).NotTo(Equal(dsUID))
			g.Expect(string(getConfigMap(g).UID)).NotTo(Equal(cmUID))
		}).Should(Succeed(), "awaiting a new DaemonSet and a new ConfigMap %s", key)
	})

	It("puts back what someone changed by hand, but keeps the restart time of `kubectl rollout restart`", func() {
		const restartedAt = "kubectl.kubernetes.io/restartedAt"
		Eventually(func(g Gomega) {
			ds := getDaemonSet(g)
			worker := &ds.Spec.Template.Spec.Containers[0]
			worker.Image = "someone/else:latest"
			worker.Args = []string{"--pool=another"}
			ds.Spec.Template.Spec.NodeSelector = nil
			ds.Spec.Template.Annotations[restartedAt] = "2026-01-01T00:00:00Z"
			g.Expect(k8sClient.Update(ctx, ds)).To(Succeed())
		}).Should(Succeed(), "editing DaemonSet %s by hand", key)

		Eventually(func(g Gomega) {
			ds := getDaemonSet(g)
			worker := ds.Spec.Template.Spec.Containers[0]
			g.Expect(worker.Image).To(Equal(testWorkerSpec.Image))
			g.Expect(worker.Args).To(ContainElement("--pool=" + pool.Name))
			g.Expect(ds.Spec.Template.Spec.NodeSelector).To(Equal(selector))
			g.Expect(ds.Spec.Template.Annotations).To(HaveKeyWithValue(restartedAt, "2026-01-01T00:00:00Z"))
		}).Should(Succeed(), "awaiting the operator to restore DaemonSet %s", key)
	})

	It("writes nothing to a DaemonSet that already matches the pool", func() {
		var stored *appsv1.DaemonSet
		Eventually(func(g Gomega) { stored = getDaemonSet(g) }).Should(Succeed(), "awaiting DaemonSet %s", key)
		current := &datav1alpha1.TierPool{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pool), current)).To(Succeed())
		tiers, err := tiersFile(current)
		Expect(err).NotTo(HaveOccurred())

		mutated := stored.DeepCopy()
		mutateDaemonSet(mutated, testWorkerSpec.daemonSet(current, tiers))
		// Every field the API server defaults is in the desired DaemonSet, or each reconcile
		// would send an update.
		Expect(toYAML(mutated)).To(Equal(toYAML(stored)))
	})

	It("shows how many workers are ready in the pool's status, and what to look at when some are not", func() {
		createNode(selector)
		createNode(selector)
		setWorkerStatus := func(desired, ready int32) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				ds := getDaemonSet(g)
				// envtest runs no DaemonSet controller: the test writes what it would.
				ds.Status.DesiredNumberScheduled = desired
				ds.Status.CurrentNumberScheduled = desired
				ds.Status.UpdatedNumberScheduled = desired
				ds.Status.NumberReady = ready
				ds.Status.NumberAvailable = ready
				ds.Status.NumberUnavailable = desired - ready
				g.Expect(k8sClient.Status().Update(ctx, ds)).To(Succeed())
			}).Should(Succeed(), "writing the status of DaemonSet %s: %d of %d ready", key, ready, desired)
		}

		setWorkerStatus(2, 1)
		Eventually(func(g Gomega) {
			p := getPool(g, pool.Name)
			g.Expect(p.Status.Nodes).To(BeEquivalentTo(2))
			g.Expect(p.Status.ReadyWorkers).To(BeEquivalentTo(1))
			ready := readyCondition(g, p)
			g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(ready.Reason).To(Equal(ReasonWorkersNotReady))
			g.Expect(ready.Message).To(Equal(fmt.Sprintf(
				"1 of 2 worker(s) ready: see `kubectl -n strata-system get pods -l "+
					"app.kubernetes.io/name=strata-worker,app.kubernetes.io/instance=%s`", pool.Name)))
		}).Should(Succeed(), "awaiting readyWorkers = 1 and Ready=False/WorkersNotReady saying 1 of 2")

		setWorkerStatus(2, 2)
		Eventually(func(g Gomega) {
			p := getPool(g, pool.Name)
			g.Expect(p.Status.ReadyWorkers).To(BeEquivalentTo(2))
			ready := readyCondition(g, p)
			g.Expect(ready.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(ready.Reason).To(Equal(ReasonWorkersReady))
			g.Expect(ready.Message).To(Equal("2 of 2 worker(s) ready"))
		}).Should(Succeed(), "awaiting readyWorkers = 2 and Ready=True/WorkersReady")
	})
})

var _ = Describe("The volumes of a pool's tier paths", func() {
	It("names a volume after its tier, or after the tier's position when the name does not fit a DNS label", func() {
		Expect(tierVolumeName(0, "mem", 0)).To(Equal("tier-mem-0"))
		long := strings.Repeat("n", 60)
		Expect(tierVolumeName(3, long, 15)).To(Equal("tier3-15"))
	})

	It("mounts a path two tiers share once, with Bidirectional propagation when one of them is MEM", func() {
		volumes, mounts := tierVolumes([]datav1alpha1.Tier{
			{Name: "mem", Medium: datav1alpha1.MediumMemory, Paths: []string{"/mnt/a"}},
			{Name: "ssd", Medium: datav1alpha1.MediumSSD, Paths: []string{"/mnt/b", "/mnt/a"}},
		})
		Expect(volumes).To(HaveLen(2))
		Expect(mounts).To(ConsistOf(
			And(HaveField("MountPath", "/mnt/a"), HaveField("Name", "tier-mem-0"),
				HaveField("MountPropagation", HaveValue(Equal(corev1.MountPropagationBidirectional)))),
			And(HaveField("MountPath", "/mnt/b"), HaveField("Name", "tier-ssd-0"), HaveField("MountPropagation", BeNil())),
		))
	})
})

// createWorkerPool creates a TierPool with a MEM and an NVMe tier, a toleration and worker
// resources, and deletes it when the spec ends.
func createWorkerPool(selector map[string]string) *datav1alpha1.TierPool {
	GinkgoHelper()
	pool := &datav1alpha1.TierPool{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "strata-test-"},
		Spec: datav1alpha1.TierPoolSpec{
			NodeSelector: selector,
			Tolerations: []corev1.Toleration{{
				Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "cache", Effect: corev1.TaintEffectNoSchedule,
			}},
			Tiers: []datav1alpha1.Tier{
				memTier("2Gi"),
				{
					Name: "nvme", Medium: datav1alpha1.MediumNVMe, Paths: []string{"/mnt/strata/nvme0", "/mnt/strata/nvme1"},
					Quota: resource.MustParse("20Gi"), Watermarks: datav1alpha1.Watermarks{High: 0.95, Low: 0.8},
				},
			},
			BlockSize:       resource.MustParse("64Mi"),
			FileSourceRoots: []string{"/srv/datasets"},
			WorkerResources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{
					corev1.ResourceCPU:    resource.MustParse("200m"),
					corev1.ResourceMemory: resource.MustParse("256Mi"),
				},
				Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
			},
		},
	}
	Expect(k8sClient.Create(ctx, pool)).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pool))).To(Succeed())
	})
	return pool
}

// poolEventMessages lists the messages of the Events with the given reason on a pool; those of
// a cluster-scoped object go to the namespace "default".
func poolEventMessages(g Gomega, pool *datav1alpha1.TierPool, reason string) []string {
	events := &corev1.EventList{}
	g.Expect(k8sClient.List(ctx, events, client.InNamespace(metav1.NamespaceDefault),
		client.MatchingFields{"involvedObject.name": pool.Name})).To(Succeed())
	var messages []string
	for _, e := range events.Items {
		if e.Reason == reason && e.InvolvedObject.UID == pool.UID {
			messages = append(messages, e.Message)
		}
	}
	return messages
}

func fieldEnvMatcher(name, fieldPath string) OmegaMatcher {
	return And(HaveField("Name", name), HaveField("ValueFrom.FieldRef.FieldPath", fieldPath))
}

func toYAML(obj any) string {
	GinkgoHelper()
	raw, err := yaml.Marshal(obj)
	Expect(err).NotTo(HaveOccurred())
	return string(raw)
}
