package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

var _ = Describe("The Lineage reconciler", func() {
	var namespace, pool string

	BeforeEach(func() {
		namespace, pool = servedTenant("lineages-")
	})

	output := func(name, lineage string) {
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: lineage}, TierPoolName: pool},
		})).To(Succeed())
	}
	ready := func(name, reason string) metav1.Condition {
		GinkgoHelper()
		l := &datav1alpha1.Lineage{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		return awaitCondition(l, lineageConditions, datav1alpha1.ConditionReady, reason)
	}
	jobOf := func(lineage string) *batchv1.Job {
		job := &batchv1.Job{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: lineage + "-run"}, job)).To(Succeed())
		return job
	}
	noJob := func(lineage string) {
		GinkgoHelper()
		Consistently(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: lineage + "-run"}, &batchv1.Job{}))
		}, "2s").Should(BeTrue(), "Lineage %s must not run", lineage)
	}
	It("runs a pipeline in dependency order: a step runs once the step before has written its input", func() {
		output("raw", "extract")
		output("features", "featurize")
		Expect(k8sClient.Create(ctx, newLineage(namespace, "featurize", []string{"raw"}, []string{"features"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "extract", nil, []string{"raw"}))).To(Succeed())

		By("the first step runs at once; the second waits for its input")
		ready("extract", ReasonRunning)
		Expect(ready("featurize", ReasonWaitingForInputs).Message).To(ContainSubstring("raw"))
		noJob("featurize")
		job := jobOf("extract")
		Expect(job.Labels).To(HaveKeyWithValue(lineageLabel, "extract"))
		Expect(job.Spec.Template.Spec.Containers[0].Image).To(Equal("example.com/step:1"))

		By("once the first step's Job completes, its output is in memory and the second step runs")
		finishJob(job, true)
		ready("extract", ReasonWritten)
		ready("featurize", ReasonRunning)
		l := &datav1alpha1.Lineage{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "extract"}, l)).To(Succeed())
		Expect(l.Status.Outputs).To(HaveExactElements(And(HaveField("Name", "raw"), HaveField("State", datav1alpha1.OutputInMemory))))
		Expect(l.Status.UncheckpointedDepth).To(BeEquivalentTo(1))
		Expect(testutil.ToFloat64(lineageDepth.WithLabelValues(namespace, "extract"))).To(Equal(1.0), "the gauge says what the status says")
		Expect(meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionCheckpointed)).
			To(HaveField("Reason", ReasonNotCheckpointed))

		By("the second step's output deepens the uncheckpointed chain to two")
		finishJob(jobOf("featurize"), true)
		ready("featurize", ReasonWritten)
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "featurize"}, l)).To(Succeed())
			g.Expect(l.Status.UncheckpointedDepth).To(BeEquivalentTo(2))
			g.Expect(testutil.ToFloat64(lineageDepth.WithLabelValues(namespace, "featurize"))).To(Equal(2.0))
		}).Should(Succeed())

		By("a deleted Lineage's series goes with it")
		Expect(k8sClient.Delete(ctx, l)).To(Succeed())
		Eventually(func() []string { return depthSeries(namespace) }).ShouldNot(ContainElement("featurize"))
		Expect(depthSeries(namespace)).To(ContainElement("extract"))
	})

	It("runs a Lineage's Job only once its outputs' claims are bound, so that its pod is not put back by the scheduler", func() {
		ns := &corev1.Namespace{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: namespace}, ns)).To(Succeed())
		ns.Labels = map[string]string{unboundNamespaceLabel: "true"}
		Expect(k8sClient.Update(ctx, ns)).To(Succeed())
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "model", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "train"}, TierPoolName: pool},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "train", nil, []string{"model"}))).To(Succeed())

		// The Dataset may be looked at before its Lineage exists and say so for a moment; the
		// Lineage then waits on that until the Dataset's next look says what the claim waits for.
		train := &datav1alpha1.Lineage{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "train"}}
		awaitCondition(train, lineageConditions, datav1alpha1.ConditionReady, ReasonWaitingForOutputClaims, func(g Gomega) {
			cond := meta.FindStatusCondition(train.Status.Conditions, datav1alpha1.ConditionReady)
			g.Expect(cond.Message).To(And(
				ContainSubstring("output model (claim model is "), // Pending, or new if the binder has not seen it yet
				ContainSubstring("not yet bound to volume strata-"),
				ContainSubstring("before running the Job")))
		})
		noJob("train")

		By("binding the claim, as kube-controller-manager would")
		bindByHand(namespace, "model")
		ready("train", ReasonRunning)
		Expect(jobOf("train").Spec.Template.Labels).To(HaveKeyWithValue(lineageLabel, "train"))
	})

	It("ends a bad Lineage with a condition that says what to fix, and runs nothing", func() {
		By("an input that does not exist")
		output("out-a", "a")
		Expect(k8sClient.Create(ctx, newLineage(namespace, "a", []string{"nowhere"}, []string{"out-a"}))).To(Succeed())
		Expect(ready("a", ReasonInputNotFound).Message).To(ContainSubstring(`input Dataset "nowhere" does not exist`))
		noJob("a")

		By("an output that does not name the Lineage")
		Expect(k8sClient.Create(ctx, newLineage(namespace, "b", nil, []string{"undeclared"}))).To(Succeed())
		Expect(ready("b", ReasonOutputNotDeclared).Message).To(ContainSubstring("spec.lineage.name: b"))
		noJob("b")

		By("a cycle through two Lineages")
		output("x", "c1")
		output("y", "c2")
		Expect(k8sClient.Create(ctx, newLineage(namespace, "c1", []string{"y"}, []string{"x"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "c2", []string{"x"}, []string{"y"}))).To(Succeed())
		Expect(ready("c1", ReasonCycle).Message).To(ContainSubstring("c1 → c2 → c1"))
		Expect(ready("c2", ReasonCycle).Message).To(ContainSubstring("c2 → c1 → c2"))
		noJob("c1")
		noJob("c2")
	})

	It("reports a failed Job once and does not retry it", func() {
		output("out", "flaky")
		Expect(k8sClient.Create(ctx, newLineage(namespace, "flaky", nil, []string{"out"}))).To(Succeed())
		ready("flaky", ReasonRunning)
		job := jobOf("flaky")
		finishJob(job, false)
		Expect(ready("flaky", ReasonJobFailed).Message).To(ContainSubstring("backoff limit"))
		Eventually(func() []string { return eventReasons(namespace, "flaky") }).Should(ContainElement(ReasonJobFailed))
		Consistently(func() types.UID { return jobOf("flaky").UID }, "2s").Should(Equal(job.UID), "the failed Job is not recreated")
	})
})

var _ = Describe("Recomputation of lost outputs", func() {
	var namespace, pool string

	BeforeEach(func() {
		namespace, pool = servedTenant("recompute-")
	})

	lineageOf := func(name string) *datav1alpha1.Lineage {
		l := &datav1alpha1.Lineage{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l)).To(Succeed())
		return l
	}
	priorityClass := func(name string, value int32) {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, pc))).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pc))).To(Succeed()) })
	}

	// writeOn makes the master hold one file of the output Dataset name, on worker.
	writeOn := func(name, worker string) {
		GinkgoHelper()
		ds := &datav1alpha1.Dataset{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ds)).To(Succeed())
		master, root := datav1alpha1.MasterDatasetName(namespace, name, string(ds.UID)), datav1alpha1.MasterDatasetRoot(namespace, name, string(ds.UID))
		_, err := lineageMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: master, Root: root})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: worker, Node: namespace})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.CreateFile(ctx, &masterpb.CreateFileRequest{Path: root + "/part-0", Dataset: master})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.CommitBlock(ctx, &masterpb.CommitBlockRequest{
			BlockId: uint64(time.Now().UnixNano()), Path: root + "/part-0", Size: 100, Worker: worker, Tier: "mem"})
		Expect(err).NotTo(HaveOccurred())
	}
	recomputeJob := func(lineage string) *batchv1.Job {
		var jobs batchv1.JobList
		Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace), client.MatchingLabels{lineageLabel: lineage, recomputationLabel: "1"})).To(Succeed())
		if len(jobs.Items) == 0 {
			return nil
		}
		return &jobs.Items[0]
	}

	// lose declares worker lost at the master, as the operator does for a node gone.
	lose := func(worker string) {
		GinkgoHelper()
		_, err := lineageMaster.MarkWorkerLost(ctx, worker, "test: node gone")
		Expect(err).NotTo(HaveOccurred())
	}
	// runChain creates a chain of steps (name, input or "", output), each reading the output of
	// the one before, and runs each once with its output written on worker.
	runChain := func(worker string, chain ...[3]string) {
		GinkgoHelper()
		for _, step := range chain {
			Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: step[2], Namespace: namespace},
				Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: step[0]}, TierPoolName: pool},
			})).To(Succeed())
			var inputs []string
			if step[1] != "" {
				inputs = []string{step[1]}
			}
			Expect(k8sClient.Create(ctx, newLineage(namespace, step[0], inputs, []string{step[2]}))).To(Succeed())
		}
		for _, step := range chain {
			job := &batchv1.Job{}
			Eventually(func() error {
				return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: step[0] + "-run"}, job)
			}).Should(Succeed())
			writeOn(step[2], worker)
			finishJob(job, true)
			Eventually(func() datav1alpha1.OutputState { return outputState(lineageOf(step[0]), step[2]) }).
				Should(Equal(datav1alpha1.OutputInMemory))
		}
	}
	// waitingPod creates a pod of class that mounts the claim of dataset.
	waitingPod := func(name, class, dataset string) {
		GinkgoHelper()
		Expect(k8sClient.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: corev1.PodSpec{
				PriorityClassName: class,
				Containers:        []corev1.Container{{Name: "read", Image: "example.com/read:1"}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: dataset, ReadOnly: true}}}},
			},
		})).To(Succeed())
	}

	It("tells the master how long readers of a lost output wait, as the output's CachePolicy says", func() {
		policy := &datav1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Name: "patient", Namespace: namespace},
			Spec: datav1alpha1.CachePolicySpec{Recovery: datav1alpha1.RecoverySpec{ReadWait: &metav1.Duration{Duration: 45 * time.Second}}}}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "scores", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "score"}, TierPoolName: pool, CachePolicyName: "patient"},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "score", nil, []string{"scores"}))).To(Succeed())
		job := &batchv1.Job{}
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "score-run"}, job)
		}).Should(Succeed())
		writeOn("scores", "pool/"+namespace)
		finishJob(job, true)
		ds := &datav1alpha1.Dataset{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "scores"}, ds)).To(Succeed())
		waitSeconds := func() int64 {
			got, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: datav1alpha1.MasterDatasetName(namespace, "scores", string(ds.UID))})
			if err != nil || got.GetRecovery() == nil {
				return -1
			}
			return got.GetRecovery().GetWaitSeconds()
		}
		Eventually(waitSeconds).Should(BeEquivalentTo(45))

		By("a program with retries of its own sets 0s: its reads of a lost file fail at once")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
		policy.Spec.Recovery.ReadWait = &metav1.Duration{}
		Expect(k8sClient.Update(ctx, policy)).To(Succeed())
		Eventually(waitSeconds).Should(BeZero())
	})

	It("learns a step's run time from its runs, and predicts the next from its inputs' cache", func() {
		priorityClass(DefaultRecomputeClass, -100)
		// The input, an output written a moment ago: its size and cache come from the master
		// (its Dataset's status says nothing yet; here no reconciler ever writes it there).
		runChain("pool/"+namespace+"-a", [3]string{"extract", "", "raw"})
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "features", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "featurize"}, TierPoolName: pool},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "featurize", []string{"raw"}, []string{"features"}))).To(Succeed())

		By("the run Job notes what it reads and finds cached")
		job := &batchv1.Job{}
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "featurize-run"}, job)
		}).Should(Succeed())
		Expect(job.Annotations).To(And(HaveKeyWithValue(inputBytesAnnotation, "100"), HaveKeyWithValue(cachedBytesAnnotation, "100")))
		writeOn("features", "pool/"+namespace+"-b")
		finishJobAfter(job, 30*time.Second)
		Eventually(func(g Gomega) {
			st := lineageOf("featurize").Status.RunTime
			g.Expect(st).NotTo(BeNil())
			g.Expect(st.Runs).To(HaveExactElements(And(HaveField("Job", "featurize-run"), HaveField("Milliseconds", BeEquivalentTo(30000)),
				HaveField("InputBytes", BeEquivalentTo(100)), HaveField("CachedBytes", BeEquivalentTo(100)))))
			g.Expect(st.Predicted).To(Equal("30s"))
			g.Expect(st.CachedPercentage).To(Equal("100%"))
		}).Should(Succeed())

		By("its recomputation is predicted from that run, and the prediction's error is said once it ran")
		lose("pool/" + namespace + "-b")
		var recompute *batchv1.Job
		Eventually(func() *batchv1.Job { recompute = recomputeJob("featurize"); return recompute }).ShouldNot(BeNil())
		Expect(recompute.Annotations).To(HaveKeyWithValue(predictionAnnotation, "30000"))
		writeOn("features", "pool/"+namespace+"-c")
		finishJobAfter(recompute, 33*time.Second)
		Eventually(func(g Gomega) {
			st := lineageOf("featurize").Status.RunTime
			g.Expect(st.Runs).To(HaveLen(2))
			g.Expect(st.Runs[1]).To(And(HaveField("Milliseconds", BeEquivalentTo(33000)), HaveField("PredictedMilliseconds", BeEquivalentTo(30000))))
			g.Expect(st.LastError).To(Equal("+10%"))
			g.Expect(st.PredictedMilliseconds).To(BeNumerically("~", 31500, 100), "two runs of the same input: their mean")
		}).Should(Succeed())
	})

	It("recomputes a parent before its child when one loss takes both", func() {
		priorityClass(DefaultRecomputeClass, -100)
		runChain("pool/"+namespace, [3]string{"parent", "", "p-out"}, [3]string{"child", "p-out", "c-out"})
		lose("pool/" + namespace)

		By("the parent is recomputed; the child waits for it, however soon it sees its own loss")
		var parentJob *batchv1.Job
		Eventually(func() *batchv1.Job { parentJob = recomputeJob("parent"); return parentJob }).ShouldNot(BeNil())
		Eventually(func() string {
			c := meta.FindStatusCondition(lineageOf("child").Status.Conditions, datav1alpha1.ConditionRecomputing)
			if c == nil {
				return ""
			}
			return c.Reason
		}).Should(Equal(ReasonWaitingForLostInputs))
		Consistently(func() *batchv1.Job { return recomputeJob("child") }, "3s").Should(BeNil())

		By("once the parent's Job is done, the child is recomputed")
		finishJob(parentJob, true)
		Eventually(func() *batchv1.Job { return recomputeJob("child") }).ShouldNot(BeNil())
	})

	It("raises the recomputation of a lost ancestor to the class of a pod that waits for a lost descendant", func() {
		priorityClass(DefaultRecomputeClass, -100)
		urgent := "urgent-chain-" + namespace
		priorityClass(urgent, 1000)
		runChain("pool/"+namespace, [3]string{"a", "", "a-out"}, [3]string{"b", "a-out", "b-out"}, [3]string{"c", "b-out", "c-out"})
		lose("pool/" + namespace)

		By("a is recomputed at the lowest class, b and c wait for their inputs")
		Eventually(func(g Gomega) {
			l := lineageOf("a")
			g.Expect(l.Status.ActiveRecomputation).NotTo(BeNil())
			g.Expect(l.Status.ActiveRecomputation.PriorityClassName).To(Equal(DefaultRecomputeClass))
			g.Expect(outputState(lineageOf("c"), "c-out")).To(Equal(datav1alpha1.OutputLost))
		}).Should(Succeed())

		By("a pod of a higher class that reads c's output makes a's pending Job come back with that class")
		waitingPod("report", urgent, "c-out")
		Eventually(func(g Gomega) {
			l := lineageOf("a")
			g.Expect(l.Status.ActiveRecomputation).NotTo(BeNil())
			g.Expect(l.Status.ActiveRecomputation.PriorityClassName).To(Equal(urgent))
			job := &batchv1.Job{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: l.Status.ActiveRecomputation.JobName}, job)).To(Succeed())
			g.Expect(job.Spec.Template.Spec.PriorityClassName).To(Equal(urgent))
		}).WithTimeout(time.Minute).Should(Succeed())
		Eventually(func() []string { return eventReasons(namespace, "a") }).Should(ContainElement(ReasonPriorityInherited))
	})

	It("starts the recomputation of a lost ancestor at the class of a pod that waits for a lost descendant already", func() {
		priorityClass(DefaultRecomputeClass, -100)
		urgent := "urgent-waiting-" + namespace
		priorityClass(urgent, 1000)
		runChain("pool/"+namespace, [3]string{"a", "", "a-out"}, [3]string{"b", "a-out", "b-out"}, [3]string{"c", "b-out", "c-out"})
		waitingPod("report", urgent, "c-out")

		By("the node is lost while the pod waits: a's first Job has the pod's class, though b's and c's statuses may not say they lost anything yet")
		lose("pool/" + namespace)
		var first *datav1alpha1.RecomputationStatus
		Eventually(func() *datav1alpha1.RecomputationStatus {
			first = lineageOf("a").Status.ActiveRecomputation
			return first
		}).ShouldNot(BeNil())
		Expect(first.PriorityClassName).To(Equal(urgent), "made at the inherited class, not made at the lowest and raised later")
	})

	It("reruns the Job at the lowest priority, and at the priority of a pod that waits for the data", func() {
		priorityClass(DefaultRecomputeClass, -100)
		urgent := "urgent-" + namespace
		priorityClass(urgent, 1000)
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "scores", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "score"}, TierPoolName: pool},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "score", nil, []string{"scores"}))).To(Succeed())
		job := &batchv1.Job{}
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "score-run"}, job)
		}).Should(Succeed())

		By("the Job writes a file into a worker, and succeeds")
		ds := &datav1alpha1.Dataset{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "scores"}, ds)).To(Succeed())
		name := datav1alpha1.MasterDatasetName(namespace, "scores", string(ds.UID))
		root := datav1alpha1.MasterDatasetRoot(namespace, "scores", string(ds.UID))
		worker := "pool/" + namespace
		_, err := lineageMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: worker, Node: namespace})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.CreateFile(ctx, &masterpb.CreateFileRequest{Path: root + "/part-0", Dataset: name})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.CommitBlock(ctx, &masterpb.CommitBlockRequest{
			BlockId: uint64(time.Now().UnixNano()), Path: root + "/part-0", Size: 100, Worker: worker, Tier: "mem"})
		Expect(err).NotTo(HaveOccurred())
		finishJob(job, true)
		Eventually(func() datav1alpha1.OutputState { return outputState(lineageOf("score"), "scores") }).
			Should(Equal(datav1alpha1.OutputInMemory))
		completeAtMaster := func() bool {
			ds, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
			return err == nil && ds.GetComplete()
		}
		Eventually(completeAtMaster).Should(BeTrue(), "its writer finished: the output takes no more files")
		_, err = lineageMaster.CreateFile(ctx, &masterpb.CreateFileRequest{Path: root + "/late", Dataset: name})
		Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))
		readWait := func() *masterpb.DatasetRecovery {
			ds, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
			if err != nil {
				return nil
			}
			return ds.GetRecovery()
		}
		tenMinutes := &masterpb.DatasetRecovery{WaitSeconds: int64(datav1alpha1.DefaultRecoveryReadWait.Seconds()), CommitPerAttempt: true}
		Eventually(readWait).Should(Equal(tenMinutes), "readers of a lost file wait the default for it (no CachePolicy)")

		By("the node holding it is lost")
		_, err = lineageMaster.MarkWorkerLost(ctx, worker, "test: node gone")
		Expect(err).NotTo(HaveOccurred())

		By("the output is recomputed by a Job at the lowest class, and the master forgot the lost files")
		var first string
		Eventually(func(g Gomega) {
			l := lineageOf("score")
			g.Expect(outputState(l, "scores")).To(Equal(datav1alpha1.OutputRecomputing))
			g.Expect(l.Status.Recomputations).To(BeEquivalentTo(1))
			g.Expect(l.Status.ActiveRecomputation).NotTo(BeNil())
			g.Expect(l.Status.ActiveRecomputation.PriorityClassName).To(Equal(DefaultRecomputeClass))
			first = l.Status.ActiveRecomputation.JobName
		}).Should(Succeed())
		Expect(first).To(HavePrefix("score-recompute-1-"))
		recompute := &batchv1.Job{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: first}, recompute)).To(Succeed())
		Expect(recompute.Spec.Template.Spec.PriorityClassName).To(Equal(DefaultRecomputeClass))
		Expect(recompute.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms).
			To(HaveExactElements(HaveField("MatchExpressions", ContainElement(And(
				HaveField("Key", corev1.LabelHostname), HaveField("Operator", corev1.NodeSelectorOpNotIn),
				HaveField("Values", ContainElement(namespace)))))), // the suite's other lost workers too
				"the recomputation keeps off the node whose worker is lost")
		Expect(recompute.Spec.PodFailurePolicy.Rules[0].Action).To(Equal(batchv1.PodFailurePolicyActionFailJob),
			"a disrupted pod ends the recomputation, for a new one that lets go of what the pod wrote")
		_, err = lineageMaster.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/part-0"})
		Expect(status.Code(err)).To(Equal(codes.NotFound))
		Eventually(readWait).Should(Equal(tenMinutes), "said again once the master forgot the output: its readers wait on")

		By("a pod of a higher class that mounts the output makes the pending Job come back with that class")
		Expect(k8sClient.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "dashboard", Namespace: namespace},
			Spec: corev1.PodSpec{
				PriorityClassName: urgent,
				Containers:        []corev1.Container{{Name: "read", Image: "example.com/read:1"}},
				Volumes: []corev1.Volume{{Name: "scores", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "scores", ReadOnly: true}}}},
			},
		})).To(Succeed())
		var second string
		Eventually(func(g Gomega) {
			l := lineageOf("score")
			g.Expect(l.Status.ActiveRecomputation).NotTo(BeNil())
			g.Expect(l.Status.ActiveRecomputation.PriorityClassName).To(Equal(urgent))
			second = l.Status.ActiveRecomputation.JobName
			g.Expect(l.Status.Recomputations).To(BeEquivalentTo(1), "raising the priority is no new recomputation")
		}).WithTimeout(time.Minute).Should(Succeed())
		Expect(second).NotTo(Equal(first))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: second}, recompute)).To(Succeed())
		Expect(recompute.Spec.Template.Spec.PriorityClassName).To(Equal(urgent))
		Eventually(func() []string { return eventReasons(namespace, "score") }).Should(ContainElement(ReasonPriorityInherited))

		By("once it completes, the output is in memory again and nothing more is recomputed")
		finishJob(recompute, true)
		Eventually(func(g Gomega) {
			l := lineageOf("score")
			g.Expect(l.Status.ActiveRecomputation).To(BeNil())
			g.Expect(outputState(l, "scores")).To(Equal(datav1alpha1.OutputInMemory))
			g.Expect(meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionRecomputing)).To(HaveField("Reason", ReasonNothingLost))
		}).Should(Succeed())
		Eventually(completeAtMaster).Should(BeTrue(), "the recomputation finished: the output is closed again")
		Consistently(func() int32 { return lineageOf("score").Status.Recomputations }, "2s").Should(BeEquivalentTo(1))
	})

	It("recomputes an output the master forgot (its state lost), instead of showing it written and empty", func() {
		priorityClass(DefaultRecomputeClass, -100)
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "tables", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "tabulate"}, TierPoolName: pool},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "tabulate", nil, []string{"tables"}))).To(Succeed())
		job := &batchv1.Job{}
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "tabulate-run"}, job)
		}).Should(Succeed())

		By("the Job writes a file of 100 bytes, and succeeds")
		ds := &datav1alpha1.Dataset{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "tables"}, ds)).To(Succeed())
		name := datav1alpha1.MasterDatasetName(namespace, "tables", string(ds.UID))
		worker := "pool/" + namespace
		writeOn("tables", worker)
		finishJob(job, true)
		held := func(g Gomega) {
			st := outputStatus(lineageOf("tabulate"), "tables")
			g.Expect(st.State).To(Equal(datav1alpha1.OutputInMemory))
			g.Expect(st.Bytes).To(BeEquivalentTo(100))
			m, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(m.GetComplete()).To(BeTrue())
		}
		Eventually(held).Should(Succeed())

		By("the master forgets it while it is still to be restored from a backup: the output waits for the restore")
		lineageRestorePending.Store(true)
		DeferCleanup(lineageRestorePending.Store, false)
		_, err := lineageMaster.DeleteDataset(ctx, name)
		Expect(err).NotTo(HaveOccurred())
		Consistently(func(g Gomega) {
			l := lineageOf("tabulate")
			g.Expect(outputState(l, "tables")).To(Equal(datav1alpha1.OutputInMemory))
			g.Expect(l.Status.Recomputations).To(BeZero())
			_, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
			g.Expect(status.Code(err)).To(Equal(codes.NotFound), "not registered again as complete and empty")
		}, "3s").Should(Succeed())

		By("with no restore to wait for, the forgotten output is lost, said so, and recomputed")
		lineageRestorePending.Store(false)
		var recomputation string
		Eventually(func(g Gomega) {
			l := lineageOf("tabulate")
			g.Expect(outputState(l, "tables")).To(Equal(datav1alpha1.OutputRecomputing))
			g.Expect(l.Status.ActiveRecomputation).NotTo(BeNil())
			recomputation = l.Status.ActiveRecomputation.JobName
		}).Should(Succeed())
		Expect(eventMessages(namespace, "tabulate", ReasonOutputForgotten)).To(ConsistOf(
			And(ContainSubstring("no longer knows output tables (100 bytes"), ContainSubstring("master.persistence.size"))))
		m, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
		if status.Code(err) != codes.NotFound {
			Expect(err).NotTo(HaveOccurred())
			Expect(m.GetComplete()).To(BeFalse(), "left open for the recomputation to write, not complete and empty")
		}

		By("the recomputation writes it again: held once more")
		writeOn("tables", worker)
		recompute := &batchv1.Job{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: recomputation}, recompute)).To(Succeed())
		finishJob(recompute, true)
		Eventually(held).Should(Succeed())
		Expect(lineageOf("tabulate").Status.Recomputations).To(BeEquivalentTo(1))
	})
})

var _ = Describe("Recomputation of lost partitions", func() {
	var namespace, pool string

	BeforeEach(func() {
		namespace, pool = servedTenant("partitions-")
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: DefaultRecomputeClass}, Value: -100}
		Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, pc))).To(Succeed())
	})

	It("reruns only the completion indexes whose partitions were lost, each as a Job of its own", func() {
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "parts", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "split"}, TierPoolName: pool},
		})).To(Succeed())
		l := newLineage(namespace, "split", nil, []string{"parts"})
		l.Spec.Template.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
		l.Spec.Template.Spec.Completions, l.Spec.Template.Spec.Parallelism = ptr.To[int32](3), ptr.To[int32](3)
		l.Spec.Template.Spec.BackoffLimitPerIndex = ptr.To[int32](1)
		l.Spec.Partitions = []datav1alpha1.OutputPartition{
			{Index: 0, Output: "parts", Path: "part-0"}, {Index: 1, Output: "parts", Path: "part-1"}, {Index: 2, Output: "parts", Path: "part-2"},
		}
		Expect(k8sClient.Create(ctx, l)).To(Succeed())
		run := &batchv1.Job{}
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "split-run"}, run)
		}).Should(Succeed())

		By("index 0 and 2 write on one node, index 1 on another")
		ds := &datav1alpha1.Dataset{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "parts"}, ds)).To(Succeed())
		name, root := datav1alpha1.MasterDatasetName(namespace, "parts", string(ds.UID)), datav1alpha1.MasterDatasetRoot(namespace, "parts", string(ds.UID))
		_, err := lineageMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root})
		Expect(err).NotTo(HaveOccurred())
		lostWorker, keptWorker := "pool/"+namespace+"-a", "pool/"+namespace+"-b"
		for _, w := range []string{lostWorker, keptWorker} {
			_, err = lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: w, Node: w})
			Expect(err).NotTo(HaveOccurred())
		}
		files := map[string]string{"part-0": lostWorker, "part-1": keptWorker, "part-2/a": lostWorker, "part-2/b": lostWorker}
		for path, w := range files {
			_, err = lineageMaster.SealFile(ctx, &masterpb.SealFileRequest{Path: root + "/" + path, Dataset: name, ClientToken: path,
				Blocks: []*masterpb.CommitBlockRequest{{BlockId: uint64(specID.Add(1)) << 40, Size: 100, Worker: w, Tier: "mem"}}})
			Expect(err).NotTo(HaveOccurred())
		}
		finishJob(run, true)
		Eventually(func() bool {
			d, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
			return err == nil && d.GetComplete()
		}).Should(BeTrue())

		By("the node of index 0 and 2 is lost: two Jobs, one per lost index, rerun them")
		_, err = lineageMaster.MarkWorkerLost(ctx, lostWorker, "test: node gone")
		Expect(err).NotTo(HaveOccurred())
		var jobs batchv1.JobList
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace), client.MatchingLabels{recomputationLabel: "1"})).To(Succeed())
			g.Expect(jobs.Items).To(HaveLen(2))
			g.Expect(lineageOf(namespace, "split").Status.ActiveRecomputation).To(HaveField("Indexes", Equal([]int32{0, 2})))
		}).Should(Succeed())
		for _, job := range jobs.Items {
			index := job.Labels[completionIndexLabel]
			Expect(index).To(BeElementOf("0", "2"))
			Expect(*job.Spec.CompletionMode).To(Equal(batchv1.NonIndexedCompletion))
			Expect(*job.Spec.Completions).To(BeEquivalentTo(1))
			Expect(job.Spec.BackoffLimitPerIndex).To(BeNil(), "an Indexed Job's setting")
			Expect(job.Spec.Template.Annotations).To(HaveKeyWithValue(batchv1.JobCompletionIndexAnnotation, index))
			Expect(job.Spec.Template.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: "JOB_COMPLETION_INDEX", Value: index}))
			Expect(*job.Spec.Suspend).To(BeFalse(), "let run once the master let go of the partitions")
		}

		By("the master let go of the lost partitions' files, kept the other's, and takes new files")
		listed, err := lineageMaster.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: root, Recursive: true})
		Expect(err).NotTo(HaveOccurred())
		Expect(listed.GetEntries()).To(HaveExactElements(HaveField("Path", root+"/part-1")))
		d, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
		Expect(err).NotTo(HaveOccurred())
		Expect(d.GetComplete()).To(BeFalse())

		By("index 2's Job fails: its partition is lost still, and it alone is rerun")
		for i := range jobs.Items {
			job := &jobs.Items[i]
			finishJob(job, job.Labels[completionIndexLabel] == "0")
		}
		Eventually(func(g Gomega) {
			var second batchv1.JobList
			g.Expect(k8sClient.List(ctx, &second, client.InNamespace(namespace), client.MatchingLabels{recomputationLabel: "2"})).To(Succeed())
			g.Expect(second.Items).To(HaveExactElements(HaveField("Labels", HaveKeyWithValue(completionIndexLabel, "2"))))
		}).Should(Succeed())
	})

	It("reruns, for a Narrow Lineage, only the index of the lost output, without waiting for the inputs of the others", func() {
		lostWorker, keptWorker := "pool/"+namespace+"-a", "pool/"+namespace+"-b"
		for _, w := range []string{lostWorker, keptWorker} {
			_, err := lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: w, Node: w})
			Expect(err).NotTo(HaveOccurred())
		}
		// sealOn makes the master hold one file of output on worker.
		sealOn := func(output, worker string) {
			GinkgoHelper()
			ds := &datav1alpha1.Dataset{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: output}, ds)).To(Succeed())
			name, root := datav1alpha1.MasterDatasetName(namespace, output, string(ds.UID)), datav1alpha1.MasterDatasetRoot(namespace, output, string(ds.UID))
			_, err := lineageMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root})
			Expect(err).NotTo(HaveOccurred())
			_, err = lineageMaster.SealFile(ctx, &masterpb.SealFileRequest{Path: root + "/part-0", Dataset: name, ClientToken: output,
				Blocks: []*masterpb.CommitBlockRequest{{BlockId: uint64(specID.Add(1)) << 40, Size: 100, Worker: worker, Tier: "mem"}}})
			Expect(err).NotTo(HaveOccurred())
		}
		run := func(lineage string, outputs map[string]string) {
			GinkgoHelper()
			job := &batchv1.Job{}
			Eventually(func() error {
				return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: lineage + "-run"}, job)
			}).Should(Succeed())
			for output, worker := range outputs {
				sealOn(output, worker)
			}
			finishJob(job, true)
			for output := range outputs {
				Eventually(func() datav1alpha1.OutputState { return outputState(lineageOf(namespace, lineage), output) }).
					Should(Equal(datav1alpha1.OutputInMemory))
			}
		}
		for output, lineage := range map[string]string{"up-0": "u0", "up-1": "u1", "n-0": "pair", "n-1": "pair"} {
			Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: output, Namespace: namespace},
				Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: lineage}, TierPoolName: pool},
			})).To(Succeed())
		}
		Expect(k8sClient.Create(ctx, newLineage(namespace, "u0", nil, []string{"up-0"}))).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "u1", nil, []string{"up-1"}))).To(Succeed())
		pair := newLineage(namespace, "pair", []string{"up-0", "up-1"}, []string{"n-0", "n-1"})
		pair.Spec.Dependency = datav1alpha1.DependencyNarrow
		pair.Spec.Template.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
		pair.Spec.Template.Spec.Completions, pair.Spec.Template.Spec.Parallelism = ptr.To[int32](2), ptr.To[int32](2)
		Expect(k8sClient.Create(ctx, pair)).To(Succeed())

		By("up-0 and n-1 on one node, up-1 and n-0 on another")
		run("u0", map[string]string{"up-0": lostWorker})
		run("u1", map[string]string{"up-1": keptWorker})
		run("pair", map[string]string{"n-0": keptWorker, "n-1": lostWorker})

		By("the first node is lost: index 1 reruns at once, from up-1, while up-0 is still being recomputed")
		_, err := lineageMaster.MarkWorkerLost(ctx, lostWorker, "test: node gone")
		Expect(err).NotTo(HaveOccurred())
		var jobs batchv1.JobList
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace),
				client.MatchingLabels{lineageLabel: "pair", recomputationLabel: "1"})).To(Succeed())
			g.Expect(jobs.Items).To(HaveExactElements(HaveField("Labels", HaveKeyWithValue(completionIndexLabel, "1"))))
			l := lineageOf(namespace, "pair")
			g.Expect(l.Status.ActiveRecomputation).To(HaveField("Indexes", Equal([]int32{1})))
			g.Expect(outputState(l, "n-0")).To(Equal(datav1alpha1.OutputInMemory))
			g.Expect(outputState(l, "n-1")).To(Equal(datav1alpha1.OutputRecomputing))
		}).Should(Succeed())
		// Its own reconcile says so, which may come after pair's.
		Eventually(func() *datav1alpha1.RecomputationStatus { return lineageOf(namespace, "u0").Status.ActiveRecomputation }).
			ShouldNot(BeNil(), "up-0 is being recomputed meanwhile")

		By("the master let go of n-1 and kept n-0")
		for output, files := range map[string]int{"n-0": 1, "n-1": 0} {
			ds := &datav1alpha1.Dataset{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: output}, ds)).To(Succeed())
			listed, err := lineageMaster.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: datav1alpha1.MasterDatasetRoot(namespace, output, string(ds.UID)), Recursive: true})
			if status.Code(err) == codes.NotFound {
				listed, err = &masterpb.ListFilesResponse{}, nil
			}
			Expect(err).NotTo(HaveOccurred())
			Expect(listed.GetEntries()).To(HaveLen(files), "files of %s", output)
		}
	})
})

var _ = Describe("A recomputation whose pod is disrupted", func() {
	It("comes back as a new recomputation that does not count against spec.maxRecomputations", func() {
		namespace, pool := servedTenant("disrupted-")
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: DefaultRecomputeClass}, Value: -100}
		Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, pc))).To(Succeed())
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "once"}, TierPoolName: pool},
		})).To(Succeed())
		l := newLineage(namespace, "once", nil, []string{"out"})
		l.Spec.MaxRecomputations = 1
		Expect(k8sClient.Create(ctx, l)).To(Succeed())
		run := &batchv1.Job{}
		Eventually(func() error { return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "once-run"}, run) }).Should(Succeed())
		ds := &datav1alpha1.Dataset{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "out"}, ds)).To(Succeed())
		name, root := datav1alpha1.MasterDatasetName(namespace, "out", string(ds.UID)), datav1alpha1.MasterDatasetRoot(namespace, "out", string(ds.UID))
		worker := "pool/" + namespace
		_, err := lineageMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: worker, Node: namespace})
		Expect(err).NotTo(HaveOccurred())
		_, err = lineageMaster.SealFile(ctx, &masterpb.SealFileRequest{Path: root + "/part-0", Dataset: name, ClientToken: "t",
			Blocks: []*masterpb.CommitBlockRequest{{BlockId: uint64(specID.Add(1)) << 40, Size: 100, Worker: worker, Tier: "mem"}}})
		Expect(err).NotTo(HaveOccurred())
		finishJob(run, true)
		Eventually(func() datav1alpha1.OutputState { return outputState(lineageOf(namespace, "once"), "out") }).
			Should(Equal(datav1alpha1.OutputInMemory))
		_, err = lineageMaster.MarkWorkerLost(ctx, worker, "test: node gone")
		Expect(err).NotTo(HaveOccurred())

		recomputation := func(n string) *batchv1.Job {
			GinkgoHelper()
			var jobs batchv1.JobList
			Eventually(func(g Gomega) {
				g.Expect(k8sClient.List(ctx, &jobs, client.InNamespace(namespace), client.MatchingLabels{recomputationLabel: n})).To(Succeed())
				g.Expect(jobs.Items).To(HaveLen(1))
			}).Should(Succeed(), "waiting for recomputation %s", n)
			return &jobs.Items[0]
		}
		first := recomputation("1")
		By("its pod is preempted: the Job fails by the pod failure policy's disruption rule")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(first), first)).To(Succeed())
			now := metav1.Now()
			first.Status.StartTime, first.Status.Failed = &now, 1
			first.Status.Conditions = []batchv1.JobCondition{
				{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonPodFailurePolicy, LastTransitionTime: now},
				{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonPodFailurePolicy, LastTransitionTime: now,
					Message: "Pod " + namespace + "/x has condition DisruptionTarget matching FailJob rule at index 0"},
			}
			g.Expect(k8sClient.Status().Update(ctx, first)).To(Succeed())
		}).Should(Succeed())

		By("a second recomputation comes, though spec.maxRecomputations is 1")
		second := recomputation("2")
		Expect(second.Spec.Template.Spec.PriorityClassName).To(Equal(DefaultRecomputeClass))
		Eventually(func() string {
			c := meta.FindStatusCondition(lineageOf(namespace, "once").Status.Conditions, datav1alpha1.ConditionRecomputing)
			if c == nil {
				return ""
			}
			return c.Reason
		}).Should(Equal(ReasonRecomputing))

		By("a failure of its own program counts: the limit holds")
		Eventually(func(g Gomega) {
			// The reconciler let it run meanwhile: read, end, retry.
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(second), second)).To(Succeed())
			endJob(second, false)
			g.Expect(k8sClient.Status().Update(ctx, second)).To(Succeed())
		}).Should(Succeed())
		Eventually(func() string {
			c := meta.FindStatusCondition(lineageOf(namespace, "once").Status.Conditions, datav1alpha1.ConditionRecomputing)
			if c == nil {
				return ""
			}
			return c.Reason
		}).Should(Equal(ReasonRecomputationLimit))
		Expect(outputState(lineageOf(namespace, "once"), "out")).To(Equal(datav1alpha1.OutputLost), "what it was to write is missing")
		Eventually(func() string {
			ds, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
			if err != nil {
				return ""
			}
			return ds.GetRecovery().GetFailed()
		}).Should(ContainSubstring("Lineage once gave up recomputing it"), "readers of the lost file stop waiting for it")
	})
})

// lineageOf reads a Lineage.
func lineageOf(namespace, name string) *datav1alpha1.Lineage {
	GinkgoHelper()
	l := &datav1alpha1.Lineage{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l)).To(Succeed())
	return l
}

// finishJob ends a Job as the Job controller would, which envtest does not run.
// finishJob ends job as the Job controller would. The reconciler may change the Job meanwhile
// (it patches a recomputation's priority), so the status goes onto the Job as it is now.
func finishJob(job *batchv1.Job, succeeded bool) {
	GinkgoHelper()
	Eventually(func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return err
		}
		endJob(job, succeeded)
		return k8sClient.Status().Update(ctx, job)
	}).Should(Succeed())
}

// finishJobAfter ends job as the Job controller would once it succeeded after running for d.
func finishJobAfter(job *batchv1.Job, d time.Duration) {
	GinkgoHelper()
	Eventually(func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return err
		}
		endJob(job, true)
		job.Status.StartTime = &metav1.Time{Time: job.Status.CompletionTime.Add(-d)}
		return k8sClient.Status().Update(ctx, job)
	}).Should(Succeed())
}

// endJob sets the status the Job controller gives a Job that succeeded or failed.
func endJob(job *batchv1.Job, succeeded bool) {
	now := metav1.Now()
	job.Status.StartTime = &now
	if succeeded {
		job.Status.CompletionTime, job.Status.Succeeded = &now, 1
		job.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
		return
	}
	job.Status.Failed = 1
	job.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", LastTransitionTime: now},
		{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded",
			Message: "Job has reached the specified backoff limit", LastTransitionTime: now},
	}
}

// depthSeries are the Lineages of namespace that the uncheckpointed-depth gauge has a series of.
func depthSeries(namespace string) []string {
	families, err := lineageDepthRegistry.Gather()
	Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["namespace"] == namespace {
				out = append(out, labels["lineage"])
			}
		}
	}
	return out
}
