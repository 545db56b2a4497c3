//go:build e2e

package e2e

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cli"
)

// A pipeline's output, checkpointed to MinIO; the master backed up to MinIO by `kubectl strata
// backup`; Strata uninstalled (the master's state goes with its pods) and installed afresh with
// the restore of the latest backup: a pod reads the output the old install wrote, and its
// Lineage is not run again (without the restore the new master would not know the output, and
// the operator would recompute it).
var _ = Describe("The master's backups", Ordered, Label("smoke", "backup"), func() {
	var (
		namespace, pool string
		nodes           []string
		written         []object
	)
	const bucket = "e2e-backup"
	backupValues := []string{
		"--set", "master.backup.uri=s3://" + bucket + "/master",
		"--set", "master.backup.endpoint=" + minioEndpoint,
		"--set", "master.backup.secretName=minio-credentials",
	}
	record := func(ctx SpecContext) func(Gomega) map[string]string {
		return func(g Gomega) map[string]string {
			cm := &corev1.ConfigMap{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: strataNamespace, Name: datav1alpha1.MasterBackupsConfigMap}, cm)).To(Succeed())
			return cm.Data
		}
	}

	BeforeAll(func(ctx SpecContext) {
		namespace = testNamespace(ctx, "e2e-backup-")
		nodes = cacheNodes(ctx)
		pool = memoryPool(ctx, "backup", "4Mi")
		written = copiedOutput(ctx, namespace, pool, bucket, nodes, 9<<20, 5, &datav1alpha1.CheckpointTarget{
			URI: "s3://" + bucket + "/" + namespace + "/out/", Endpoint: minioEndpoint, SecretRef: datav1alpha1.SecretReference{Name: "minio-credentials"}})
		Eventually(func(g Gomega) {
			l := &datav1alpha1.Lineage{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "step"}, l)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(l.Status.Conditions, datav1alpha1.ConditionCheckpointed)).To(BeTrue())
		}).WithContext(ctx).WithTimeout(4*minute).Should(Succeed(), "waiting for the output to be checkpointed")
		// The backups' keys, in Strata's namespace.
		copyMinioCredentials(ctx, strataNamespace)
	})
	AfterEach(func() { dumpOnFailure(namespace, strataNamespace) })

	It("restores a new install from the latest backup, and a pod reads the outputs the old one wrote", func(ctx SpecContext) {
		// Left as the other specs expect it, whatever happens: the release without backups.
		DeferCleanup(func() { installStrata() })
		installStrata(backupValues...)
		Eventually(record(ctx)).WithContext(ctx).WithTimeout(2*minute).Should(HaveKey(datav1alpha1.BackupKeyStore),
			"waiting for the operator to make the backups' record")

		By("kubectl strata backup")
		watching, err := client.NewWithWatch(restConfig, client.Options{Scheme: k8sClient.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		plugin := &cli.CLI{Client: watching, StrataNamespace: strataNamespace, Out: GinkgoWriter, Wait: 3 * minute}
		Expect(plugin.Backup(ctx)).To(Succeed())
		backup := record(ctx)(Default)[datav1alpha1.BackupKeyLast]
		Expect(backup).To(HavePrefix("strata-master-"))

		By("a new install, restored from the latest backup")
		helm("uninstall", releaseName, "--wait", "--timeout", "3m")
		Eventually(func(g Gomega) {
			var sets appsv1.StatefulSetList
			g.Expect(k8sClient.List(ctx, &sets, client.InNamespace(strataNamespace), client.MatchingLabels{"app.kubernetes.io/part-of": "strata"})).To(Succeed())
			g.Expect(sets.Items).To(BeEmpty())
			var pods corev1.PodList
			g.Expect(k8sClient.List(ctx, &pods, client.InNamespace(strataNamespace), client.MatchingLabels{"app.kubernetes.io/name": "strata-master"})).To(Succeed())
			g.Expect(pods.Items).To(BeEmpty())
		}).WithContext(ctx).WithTimeout(2*minute).Should(Succeed(), "waiting for the old install's master, and its state, to be gone")
		installStrata(append(backupValues, "--set", "master.backup.restoreFrom=latest")...)
		// "restored from <backup> at <time>", or "restored from <backup> (by an earlier attempt,
		// ...)" when an attempt whose answer was lost (the new group's leader changed before the
		// command committed) had restored it: either way the master holds the backup.
		Eventually(record(ctx)).WithContext(ctx).WithTimeout(3*minute).Should(
			HaveKeyWithValue(datav1alpha1.BackupKeyRestore, HavePrefix(fmt.Sprintf("restored from %s ", backup))),
			"waiting for the operator to restore the master")

		By("a pod reads the output, whole, from what the restored master knows")
		reader := claimPod(namespace, nodes[1], "out", "sum", "--wait", "4m", "--expect-files", fmt.Sprint(len(written)), "/data")
		Expect(k8sClient.Create(ctx, reader)).To(Succeed())
		Expect(contents(runLogsWhenDone(ctx, reader))).To(Equal(contents(written)))
		l := &datav1alpha1.Lineage{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "step"}, l)).To(Succeed())
		Expect(l.Status.Recomputations).To(BeZero(), "the restored master knew the output: nothing was recomputed")
	})
})
