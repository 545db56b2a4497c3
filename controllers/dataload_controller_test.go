package controllers

import (
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

var _ = Describe("Loading files of a Dataset onto chosen nodes (DataLoad)", func() {
	var namespace, poolName string
	var nodeA, nodeB *syncingWorker

	BeforeEach(func() {
		namespace, poolName = newTenant("dataload-", "")
		makeServable(poolName)
		nodeA, nodeB = startSyncingWorker(poolName, "node-a"), startSyncingWorker(poolName, "node-b")
	})

	readyDataset := func(name string) *datav1alpha1.Dataset {
		GinkgoHelper()
		ds := s3DatasetOf(namespace, name, poolName, map[string]int{"train/a.bin": 1000, "train/b.bin": 2000, "test/c.bin": 500})
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Phase).To(Equal(datav1alpha1.DatasetReady))
		}).Should(Succeed())
		return ds
	}

	dataLoad := func(name string, spec datav1alpha1.DataLoadSpec) *datav1alpha1.DataLoad {
		GinkgoHelper()
		dl := &datav1alpha1.DataLoad{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: spec}
		Expect(k8sClient.Create(ctx, dl)).To(Succeed())
		return dl
	}

	// loaded waits for dl's Loaded condition to have reason, and returns it (dl as it is then).
	loaded := func(dl *datav1alpha1.DataLoad, reason string) metav1.Condition {
		GinkgoHelper()
		return awaitCondition(dl, dataLoadConditions, datav1alpha1.ConditionLoaded, reason)
	}

	jobsOf := func(dl *datav1alpha1.DataLoad, run int) []batchv1.Job {
		GinkgoHelper()
		list := &batchv1.JobList{}
		Expect(k8sClient.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{
			dataLoadLabel: dl.Name, dataLoadRunLabel: strconv.Itoa(run)})).To(Succeed())
		return list.Items
	}

	// onlyJob waits for run of dl to have one Job, and returns it.
	onlyJob := func(dl *datav1alpha1.DataLoad, run int) batchv1.Job {
		GinkgoHelper()
		var job batchv1.Job
		Eventually(func(g Gomega) {
			jobs := jobsOf(dl, run)
			g.Expect(jobs).To(HaveLen(1))
			job = jobs[0]
		}).Should(Succeed())
		return job
	}

	It("runs a Job on the chosen node, and says Loaded only once the node holds every selected byte", func() {
		ds := readyDataset("images")
		dl := dataLoad("train-on-b", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Paths: []string{"train/**"}, Nodes: []string{"node-b"}})

		job := onlyJob(dl, 1)
		pod := job.Spec.Template.Spec
		Expect(pod.Containers[0].Args).To(Equal([]string{"preload", "--path", "train/**", "/data"}))
		Expect(pod.Volumes[0].PersistentVolumeClaim.ClaimName).To(Equal(ds.Name))
		Expect(pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields).To(ConsistOf(
			corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-b"}}))
		Expect(metav1.IsControlledBy(&job, dl)).To(BeTrue())
		loaded(dl, datav1alpha1.ReasonLoading)
		Expect(dl.Status.Phase).To(Equal(datav1alpha1.DataLoadLoading))

		By("counting what the node's worker holds while the Job reads")
		nodeB.hold(&workerpb.SelectionHeld{Files: 2, Bytes: 3000, HeldFiles: 1, HeldBytes: 1000})
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(dl), dl)).To(Succeed())
			g.Expect(dl.Status.Progress).To(Equal("33%"))
			g.Expect(dl.Status.Nodes).To(ConsistOf(datav1alpha1.DataLoadNode{Node: "node-b", JobName: job.Name,
				Files: datav1alpha1.LoadCount{Done: 1, Total: 2}, Bytes: datav1alpha1.LoadCount{Done: 1000, Total: 3000}}))
		}).Should(Succeed())
		Expect(nodeB.selectionsAsked()).To(ContainElement([]string{"train/**"}))
		Expect(nodeA.selectionsAsked()).To(BeEmpty(), "only the node of the load is asked")

		By("not saying Loaded when the Job ends with part of the selection missing from the node")
		finishJob(&job, true)
		cond := loaded(dl, datav1alpha1.ReasonNotAllHeld)
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Message).To(ContainSubstring("node node-b lacks 2.0Ki, of 1 of the 2 files"))
		Expect(dl.Status.Phase).To(Equal(datav1alpha1.DataLoadIncomplete))
		Expect(dl.Status.Progress).To(Equal("33%"))

		By("saying Loaded once every selected byte is on the node")
		nodeB.hold(&workerpb.SelectionHeld{Files: 2, Bytes: 3000, HeldFiles: 2, HeldBytes: 3000})
		cond = loaded(dl, datav1alpha1.ReasonLoaded)
		Expect(cond.Status).To(Equal(metav1.ConditionTrue))
		Expect(dl.Status.Phase).To(Equal(datav1alpha1.DataLoadLoaded))
		Expect(dl.Status.Progress).To(Equal("100%"))
		Expect(dl.Status.Files).To(Equal(datav1alpha1.LoadCount{Done: 2, Total: 2}))
		Expect(dl.Status.LastLoadedTime).NotTo(BeNil())
		Expect(dl.Status.NextRunTime).To(BeNil(), "a load without a schedule runs once")

		By("going back to Incomplete when eviction takes part of it")
		nodeB.hold(&workerpb.SelectionHeld{Files: 2, Bytes: 3000, HeldFiles: 1, HeldBytes: 2000})
		loaded(dl, datav1alpha1.ReasonNotAllHeld)
		Expect(dl.Status.Runs).To(BeEquivalentTo(1), "no new run without a schedule or a new spec")

		By("starting a new run, the old Jobs gone, when the spec changes")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(dl), dl)).To(Succeed())
			dl.Spec.Nodes = []string{"node-a"}
			g.Expect(k8sClient.Update(ctx, dl)).To(Succeed())
		}).Should(Succeed())
		Eventually(func() []batchv1.Job { return jobsOf(dl, 2) }).Should(HaveLen(1))
		Eventually(func(g Gomega) {
			for _, j := range jobsOf(dl, 1) {
				g.Expect(j.DeletionTimestamp).NotTo(BeNil(), "the last run's Job is deleted")
			}
		}).Should(Succeed())
	})

	It("fails, saying what to fix, when its paths select no file", func() {
		ds := readyDataset("typo")
		dl := dataLoad("typo", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Paths: []string{"trian/**"}, Nodes: []string{"node-a"}})
		job := onlyJob(dl, 1)
		nodeA.hold(&workerpb.SelectionHeld{})
		finishJob(&job, true)
		cond := loaded(dl, datav1alpha1.ReasonNothingSelected)
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Message).To(And(ContainSubstring(`["trian/**"] select no file of Dataset typo`), ContainSubstring("fix the patterns")))
		Expect(dl.Status.Phase).To(Equal(datav1alpha1.DataLoadFailed))
	})

	It("spreads over spec.nodeCount nodes, those holding most of the Dataset first", func() {
		ds := readyDataset("spread")
		dl := dataLoad("two", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, NodeCount: ptr.To[int32](2), MetadataOnly: true})
		Eventually(func() []batchv1.Job { return jobsOf(dl, 1) }).Should(HaveLen(2))
		for _, j := range jobsOf(dl, 1) {
			Expect(j.Spec.Template.Spec.Containers[0].Args).To(Equal([]string{"preload", "--metadata-only", "/data"}))
		}

		By("counting the files the nodes show, for a metadata-only load")
		nodeA.hold(&workerpb.SelectionHeld{Files: 3, Bytes: 3500})
		nodeB.hold(&workerpb.SelectionHeld{Files: 3, Bytes: 3500})
		for _, j := range jobsOf(dl, 1) {
			finishJob(&j, true)
		}
		loaded(dl, datav1alpha1.ReasonLoaded)
		Expect(dl.Status.Files).To(Equal(datav1alpha1.LoadCount{Done: 6, Total: 6}))

		By("refusing more nodes than the pool has")
		three := dataLoad("three", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, NodeCount: ptr.To[int32](3)})
		cond := loaded(three, datav1alpha1.ReasonNoNodes)
		Expect(cond.Message).To(ContainSubstring("spec.nodeCount is 3, but TierPool %s has 2 live workers (on node-a, node-b)", poolName))
	})

	It("runs again when its schedule says, and says when", func() {
		ds := readyDataset("hourly")
		dl := dataLoad("hourly", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Nodes: []string{"node-a"}, Schedule: "0 * * * *"})
		Eventually(func() []batchv1.Job { return jobsOf(dl, 1) }).Should(HaveLen(1))
		nodeA.hold(&workerpb.SelectionHeld{Files: 3, Bytes: 3500, HeldFiles: 3, HeldBytes: 3500})
		job := jobsOf(dl, 1)[0]
		finishJob(&job, true)
		cond := loaded(dl, datav1alpha1.ReasonLoaded)
		Expect(dl.Status.NextRunTime).NotTo(BeNil())
		Expect(dl.Status.NextRunTime.Time).To(Equal(dl.Status.LastRunTime.Truncate(time.Hour).Add(time.Hour)))
		Expect(cond.Message).To(ContainSubstring("the next run is at"))

		By("starting run 2 once its time has come")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(dl), dl)).To(Succeed())
			dl.Status.NextRunTime = &metav1.Time{Time: time.Now().Add(-time.Second)}
			g.Expect(k8sClient.Status().Update(ctx, dl)).To(Succeed())
		}).Should(Succeed())
		Eventually(func() []batchv1.Job { return jobsOf(dl, 2) }).Should(HaveLen(1))
	})

	It("goes on with a run whose Jobs exist though the status it reads does not show it yet", func() {
		ds := readyDataset("stale")
		dl := dataLoad("stale", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Nodes: []string{"node-a"}})
		Eventually(func() []batchv1.Job { return jobsOf(dl, 1) }).Should(HaveLen(1))
		loaded(dl, datav1alpha1.ReasonLoading)

		By("a Job of run 2, as a reconcile whose status write was not seen yet made it")
		run1 := jobsOf(dl, 1)[0]
		run2 := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "stale-2-0", Namespace: namespace,
			Labels: map[string]string{dataLoadLabel: dl.Name, dataLoadRunLabel: "2"}, Annotations: run1.Annotations,
			OwnerReferences: run1.OwnerReferences}, Spec: run1.Spec}
		run2.Spec.Selector, run2.Spec.Template.Labels = nil, nil
		Expect(k8sClient.Create(ctx, run2)).To(Succeed())
		nodeA.hold(&workerpb.SelectionHeld{Files: 3, Bytes: 3500, HeldFiles: 3, HeldBytes: 3500})
		finishJob(run2, true)
		loaded(dl, datav1alpha1.ReasonLoaded)
		Expect(dl.Status.Runs).To(BeEquivalentTo(2))
		Expect(dl.Status.Nodes).To(ConsistOf(HaveField("JobName", "stale-2-0")))
		Expect(jobsOf(dl, 3)).To(BeEmpty(), "no run started again")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(run2), run2)).To(Succeed())
		Expect(run2.DeletionTimestamp).To(BeNil(), "the run's Job is kept")
	})

	It("says what to fix when it cannot load", func() {
		By("a Dataset that does not exist, until it does")
		dl := dataLoad("early", datav1alpha1.DataLoadSpec{DatasetName: "later", Nodes: []string{"node-a"}})
		cond := loaded(dl, datav1alpha1.ReasonDatasetNotFound)
		Expect(cond.Message).To(ContainSubstring(`no Dataset "later" in namespace ` + namespace))
		Expect(dl.Status.Phase).To(Equal(datav1alpha1.DataLoadPending))
		readyDataset("later")
		loaded(dl, datav1alpha1.ReasonLoading)

		By("a node that runs no worker of the pool")
		ds := readyDataset("images")
		cond = loaded(dataLoad("nowhere", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Nodes: []string{"node-z"}}), datav1alpha1.ReasonNoNodes)
		Expect(cond.Message).To(Equal("node node-z runs no live worker of TierPool " + poolName + ", the Dataset's (nodes that do: node-a, node-b)"))

		By("a pattern or a schedule that does not parse")
		cond = loaded(dataLoad("bad-path", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Paths: []string{"train/../x"}}), datav1alpha1.ReasonInvalidSpec)
		Expect(cond.Message).To(ContainSubstring("spec.paths[0]"))
		cond = loaded(dataLoad("bad-cron", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Schedule: "every hour"}), datav1alpha1.ReasonInvalidSpec)
		Expect(cond.Message).To(ContainSubstring(`spec.schedule "every hour" is not a cron expression`))

		By("a Lineage's output")
		out := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "model", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{TierPoolName: poolName, Lineage: &datav1alpha1.LineageReference{Name: "train"}}}
		Expect(k8sClient.Create(ctx, out)).To(Succeed())
		cond = loaded(dataLoad("output", datav1alpha1.DataLoadSpec{DatasetName: out.Name}), datav1alpha1.ReasonNotLoadable)
		Expect(cond.Message).To(ContainSubstring("is a Lineage's output"))

		By("nodes and nodeCount both given, refused by the API server")
		err := k8sClient.Create(ctx, &datav1alpha1.DataLoad{ObjectMeta: metav1.ObjectMeta{Name: "both", Namespace: namespace},
			Spec: datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Nodes: []string{"node-a"}, NodeCount: ptr.To[int32](1)}})
		Expect(err).To(MatchError(ContainSubstring("give nodes or nodeCount, not both")))

		By("a Job that fails")
		dl = dataLoad("failing", datav1alpha1.DataLoadSpec{DatasetName: ds.Name, Nodes: []string{"node-a"}})
		Eventually(func() []batchv1.Job { return jobsOf(dl, 1) }).Should(HaveLen(1))
		job := jobsOf(dl, 1)[0]
		finishJob(&job, false)
		cond = loaded(dl, datav1alpha1.ReasonLoadFailed)
		Expect(cond.Message).To(ContainSubstring("the Job " + job.Name + " on node node-a failed"))
		Expect(dl.Status.Phase).To(Equal(datav1alpha1.DataLoadFailed))
	})
})
