package controllers

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/master/masterpb"
)

var _ = Describe("Checkpoint targets", func() {
	var (
		namespace string
		pool      *datav1alpha1.TierPool
	)

	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "checkpoints-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
		pool = createWorkerPool(map[string]string{testLabel: fmt.Sprintf("checkpoints-%d", specID.Add(1))})
		makeServable(pool.Name) // a Lineage runs once its outputs' claims are bound
	})

	keys := func(name, secretKey string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Data: map[string][]byte{"accessKeyID": []byte(miniotest.AccessKey), "secretAccessKey": []byte(secretKey)}}
		Expect(k8sClient.Create(ctx, s)).To(Succeed())
		return s
	}
	output := func(name, lineage, bucket, secret, policy string) *datav1alpha1.Dataset {
		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: lineage}, TierPoolName: pool.Name,
				CachePolicyName: policy},
		}
		if bucket != "" {
			ds.Spec.Checkpoint = &datav1alpha1.CheckpointTarget{URI: "s3://" + bucket + "/" + namespace + "/" + name,
				Endpoint: "http://" + s3.Endpoint, SecretRef: datav1alpha1.SecretReference{Name: secret}}
		}
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		return ds
	}
	// serve runs the operator's port for the checkpoint settings, as cmd/operator does.
	serve := func() string {
		GinkgoHelper()
		mux := http.NewServeMux()
		mux.Handle("GET "+CheckpointsPath, workerReconciler.CheckpointsHandler(GinkgoLogr))
		lis, err := tls.Listen("tcp", "127.0.0.1:0", testCA.Credentials(GinkgoT(), pki.Operator()).ServerConfigOptionalClient())
		Expect(err).NotTo(HaveOccurred())
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(lis) }()
		DeferCleanup(srv.Close)
		return "https://" + lis.Addr().String()
	}
	// get reads the settings of the pool from url as a client with creds would.
	get := func(url string, cfg *tls.Config) (int, []byte) {
		GinkgoHelper()
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := hc.Get(url + strings.Replace(CheckpointsPath, "{pool}", pool.Name, 1))
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		raw, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		return resp.StatusCode, raw
	}
	// settings are what a worker of the pool reads from the operator.
	settings := func(g Gomega) map[string]checkpoint.Dataset {
		code, raw := get(serve(), testCA.Credentials(GinkgoT(), pki.Worker(pool.Name, "node-a")).ClientConfig(pki.RoleOperator))
		g.Expect(code).To(Equal(http.StatusOK), "%s", raw)
		_, err := checkpoint.Parse(raw)
		g.Expect(err).NotTo(HaveOccurred(), "what cmd/worker does with the settings")
		var f checkpoint.File
		g.Expect(json.Unmarshal(raw, &f)).To(Succeed())
		out := map[string]checkpoint.Dataset{}
		for _, d := range f.Datasets {
			out[d.Name] = d
		}
		return out
	}
	masterName := func(ds *datav1alpha1.Dataset) string {
		return datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID))
	}

	It("serves the pool's workers, and no one else, where its outputs go, with their keys and their CachePolicy's settings", func() {
		secret := keys("bucket-keys", miniotest.SecretKey)
		Expect(k8sClient.Create(ctx, &datav1alpha1.CachePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: namespace},
			Spec: datav1alpha1.CachePolicySpec{Checkpoint: datav1alpha1.CheckpointSpec{
				Strategy: datav1alpha1.CheckpointInterval, Interval: &metav1.Duration{Duration: 300e9},
				BandwidthLimit: ptr.To(resource.MustParse("10Mi")), SyncWriteThreshold: ptr.To(resource.MustParse("1Gi")),
				TemporaryPathPatterns: []string{"**/_tmp/**"}, EdgeFraction: 0.5, HotReads: 2,
			}},
		})).To(Succeed())
		out := output("features", "extract", "datasets", "bucket-keys", "nightly")
		plain := output("scratch", "extract", "", "", "")
		Expect(k8sClient.Create(ctx, newLineage(namespace, "extract", nil, []string{"features", "scratch"}))).To(Succeed())

		var d checkpoint.Dataset
		Eventually(func(g Gomega) {
			all := settings(g)
			g.Expect(all).To(HaveKey(masterName(out)))
			g.Expect(all).NotTo(HaveKey(masterName(plain)), "an output without spec.checkpoint has nowhere to go")
			d = all[masterName(out)]
		}).Should(Succeed(), "waiting for the pool's checkpoint settings")
		Expect(d.Root).To(Equal(datav1alpha1.MasterDatasetRoot(namespace, "features", string(out.UID))))
		Expect(d.Target.URI).To(Equal("s3://datasets/" + namespace + "/features"))
		Expect(d.Target.Credentials).To(Equal(map[string]string{"accessKeyID": miniotest.AccessKey, "secretAccessKey": miniotest.SecretKey}))
		Expect(d.CachePolicy).To(Equal(namespace + "/nightly"))
		Expect(d.Strategy).To(Equal(datav1alpha1.CheckpointInterval))
		Expect(d.IntervalSeconds).To(BeEquivalentTo(300))
		Expect(d.BandwidthLimit).To(BeEquivalentTo(10 << 20))
		Expect(d.SyncWriteThreshold).To(BeEquivalentTo(1 << 30))
		Expect(d.TemporaryPaths).To(Equal([]string{"**/_tmp/**"}))
		Expect(d.Consumed).To(BeFalse(), "no Lineage reads it yet")

		ds := &appsv1.DaemonSet{}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: testWorkerSpec.Namespace, Name: WorkerName(pool.Name)}, ds)).To(Succeed())
		}).Should(Succeed())
		Expect(ds.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--checkpoints-url=" + testWorkerSpec.TLS.CheckpointsURL(pool.Name)))
		Expect(apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: testWorkerSpec.Namespace, Name: WorkerName(pool.Name)},
			&corev1.Secret{}))).To(BeTrue(), "no Secret pools the keys of the pool's outputs")

		By("refusing the settings to a worker of another pool, to the operator's own certificate and to a client without one")
		url := serve()
		for who, creds := range map[string]*pki.Credentials{
			"a worker of another pool": testCA.Credentials(GinkgoT(), pki.Worker("other", "node-a")),
			"the operator":             testCA.Credentials(GinkgoT(), pki.Operator()),
		} {
			code, body := get(url, creds.ClientConfig(pki.RoleOperator))
			Expect(code).To(Equal(http.StatusForbidden), "%s: %s", who, body)
			Expect(string(body)).To(ContainSubstring("only its workers may"))
		}
		code, body := get(url, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: testCA.CA.Pool()})
		Expect(code).To(Equal(http.StatusUnauthorized), "no certificate: %s", body)

		By("following the keys of the output's Secret")
		secret.Data["secretAccessKey"] = []byte("rotated")
		Expect(k8sClient.Update(ctx, secret)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(settings(g)[masterName(out)].Target.Credentials).To(HaveKeyWithValue("secretAccessKey", "rotated"))
		}).Should(Succeed(), "waiting for the settings to carry the new key")

		By("marking the output consumed once a Lineage that reads it runs: it is no longer the edge of the lineage graph")
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "model", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "train"}, TierPoolName: pool.Name},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "train", []string{"features"}, []string{"model"}))).To(Succeed())
		Consistently(func(g Gomega) { g.Expect(settings(g)[masterName(out)].Consumed).To(BeFalse()) }, "2s").Should(Succeed(),
			"train waits for extract: it has read nothing")
		job := &batchv1.Job{}
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "extract-run"}, job)
		}).Should(Succeed())
		finishJob(job, true)
		Eventually(func(g Gomega) { g.Expect(settings(g)[masterName(out)].Consumed).To(BeTrue()) }).Should(Succeed(),
			"waiting for the settings to say that train reads features")

		By("leaving out an output whose Secret goes")
		Expect(k8sClient.Delete(ctx, secret)).To(Succeed())
		Eventually(func(g Gomega) { g.Expect(settings(g)).NotTo(HaveKey(masterName(out))) }).Should(Succeed())
	})

	It("says in the output's status whether its target can be written, and what to fix when not", func() {
		condition := func(ds *datav1alpha1.Dataset, reason string) *metav1.Condition {
			GinkgoHelper()
			var c *metav1.Condition
			Eventually(func(g Gomega) {
				got := &datav1alpha1.Dataset{}
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), got)).To(Succeed())
				c = meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionCheckpointTargetReachable)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Reason).To(Equal(reason), "%s", c.Message)
			}).Should(Succeed(), "waiting for %s to be %s", ds.Name, reason)
			return c
		}
		Expect(k8sClient.Create(ctx, newLineage(namespace, "step", nil, []string{"good", "no-bucket", "no-secret", "bad-keys"}))).To(Succeed())
		keys("keys", miniotest.SecretKey)
		keys("wrong", "not-the-key")
		good := output("good", "step", "datasets", "keys", "")
		Expect(condition(good, ReasonCheckpointTargetReachable).Status).To(Equal(metav1.ConditionTrue))
		Expect(condition(output("no-bucket", "step", "nowhere", "keys", ""), ReasonCheckpointTargetNotFound).Message).
			To(ContainSubstring("create the bucket"))
		Expect(condition(output("no-secret", "step", "datasets", "missing", ""), ReasonSecretNotFound).Message).
			To(ContainSubstring(`Secret "missing" of spec.checkpoint does not exist`))
		bad := output("bad-keys", "step", "datasets", "wrong", "")
		Expect(condition(bad, ReasonCheckpointAccessDenied).Message).To(ContainSubstring("listing and writing under s3://datasets/"))
		Eventually(func(g Gomega) {
			got := &datav1alpha1.Dataset{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(bad), got)).To(Succeed())
			ready := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionReady)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Reason).NotTo(Equal(ReasonCheckpointAccessDenied),
				"a target that fails keeps the output in memory alone: whether it can be mounted does not depend on it")
		}).Should(Succeed())
		Eventually(func() []string { return eventReasons(namespace, "bad-keys") }).Should(ContainElement(ReasonCheckpointAccessDenied))
	})

	It("does not recompute an output whose lost files are checkpointed: they are read back", func() {
		out := output("kept", "make", "datasets", "k", "")
		keys("k", miniotest.SecretKey)
		Expect(k8sClient.Create(ctx, newLineage(namespace, "make", nil, []string{"kept"}))).To(Succeed())
		job := &batchv1.Job{}
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "make-run"}, job)
		}).Should(Succeed())
		name, root := masterName(out), datav1alpha1.MasterDatasetRoot(namespace, "kept", string(out.UID))
		worker := "pool/" + namespace
		_, err := lineageMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: worker, Node: namespace})
		Expect(err).NotTo(HaveOccurred())
		for i, token := range []string{"t-0", "t-1"} {
			_, err = lineageMaster.SealFile(ctx, &masterpb.SealFileRequest{Path: fmt.Sprintf("%s/part-%d", root, i), Dataset: name, ClientToken: token,
				Blocks: []*masterpb.CommitBlockRequest{{BlockId: uint64(specID.Add(1)) << 32, Size: 100, Worker: worker, Tier: "mem"}}})
			Expect(err).NotTo(HaveOccurred())
		}
		finishJob(job, true)
		state := func() datav1alpha1.OutputState {
			l := &datav1alpha1.Lineage{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "make"}, l)).To(Succeed())
			return outputState(l, "kept")
		}
		Eventually(state).Should(Equal(datav1alpha1.OutputInMemory))

		By("one file checkpointed: the output is being checkpointed")
		_, err = lineageMaster.CheckpointFile(ctx, &masterpb.CheckpointFileRequest{Path: root + "/part-0", ClientToken: "t-0",
			State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: "s3://datasets/kept/part-0"})
		Expect(err).NotTo(HaveOccurred())
		Eventually(state).Should(Equal(datav1alpha1.OutputCheckpointing))

		By("both: checkpointed, and a lost worker loses nothing of it")
		_, err = lineageMaster.CheckpointFile(ctx, &masterpb.CheckpointFileRequest{Path: root + "/part-1", ClientToken: "t-1",
			State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: "s3://datasets/kept/part-1"})
		Expect(err).NotTo(HaveOccurred())
		Eventually(state).Should(Equal(datav1alpha1.OutputCheckpointed))
		_, err = lineageMaster.MarkWorkerLost(ctx, worker, "test: node gone")
		Expect(err).NotTo(HaveOccurred())
		Consistently(state, "3s").Should(Equal(datav1alpha1.OutputCheckpointed))
		var jobs batchv1.JobList
		Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace), client.MatchingLabels{lineageLabel: "make", recomputationLabel: "1"})).To(Succeed())
		Expect(jobs.Items).To(BeEmpty(), "nothing to recompute")
	})
})
