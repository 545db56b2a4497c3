package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

var _ = Describe("A Lineage's outputs, committed per attempt", func() {
	var namespace, pool string

	BeforeEach(func() {
		namespace, pool = servedTenant("attempts-")
	})

	// stepPod makes a pod as the Job controller makes one of the run Job's (there is none here).
	stepPod := func(job *batchv1.Job, name string) *corev1.Pod {
		GinkgoHelper()
		pod := &corev1.Pod{
			ObjectMeta: *job.Spec.Template.ObjectMeta.DeepCopy(),
			Spec:       *job.Spec.Template.Spec.DeepCopy(),
		}
		pod.Name, pod.Namespace = name, namespace
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		return pod
	}
	// endPod ends pod, and counts the Job's active pods again, as the Job controller does when
	// one of its pods ends (pods are not watched: the Job's status is what wakes the operator).
	endPod := func(job *batchv1.Job, pod *corev1.Pod, phase corev1.PodPhase, active int32) {
		GinkgoHelper()
		Eventually(func() error {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
				return err
			}
			pod.Status.Phase = phase
			return k8sClient.Status().Update(ctx, pod)
		}).Should(Succeed())
		Eventually(func() error {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
				return err
			}
			job.Status.Active = active
			return k8sClient.Status().Update(ctx, job)
		}).Should(Succeed())
	}
	finalizers := func(pod *corev1.Pod) func() []string {
		return func() []string {
			got := &corev1.Pod{}
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
				return []string{err.Error()}
			}
			return got.Finalizers
		}
	}

	It("publishes what the pod that succeeded wrote, discards the killed pod's, and only then says Written", func() {
		Expect(k8sClient.Create(ctx, &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "parts", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Lineage: &datav1alpha1.LineageReference{Name: "split"}, TierPoolName: pool},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, newLineage(namespace, "split", nil, []string{"parts"}))).To(Succeed())
		job := &batchv1.Job{}
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "split-run"}, job)
		}).Should(Succeed())
		Expect(job.Spec.Template.Labels).To(HaveKeyWithValue(lineageLabel, "split"), "the Job's pods are labelled as the Lineage's")
		Expect(job.Spec.Template.Finalizers).To(ContainElement(attemptFinalizer), "and held until what they wrote is settled")

		ds := &datav1alpha1.Dataset{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "parts"}, ds)).To(Succeed())
		name, root := datav1alpha1.MasterDatasetName(namespace, "parts", string(ds.UID)), datav1alpha1.MasterDatasetRoot(namespace, "parts", string(ds.UID))
		got, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
		Expect(err).NotTo(HaveOccurred(), "the master knows the output before the Job runs")
		Expect(got.GetRecovery().GetCommitPerAttempt()).To(BeTrue(), "and seals its files per attempt")

		By("the first pod writes two files and is killed; its retry writes one of them again and another")
		killed, retry := stepPod(job, "split-run-a"), stepPod(job, "split-run-b")
		seal := func(pod *corev1.Pod, file string) {
			GinkgoHelper()
			_, err := lineageMaster.CreateFile(ctx, &masterpb.CreateFileRequest{Path: root + "/" + file, Dataset: name,
				ClientToken: string(pod.UID) + file, Attempt: string(pod.UID)})
			Expect(err).NotTo(HaveOccurred())
		}
		seal(killed, "part-0")
		seal(killed, "killed-only")
		endPod(job, killed, corev1.PodFailed, 1)
		Eventually(finalizers(killed)).ShouldNot(ContainElement(attemptFinalizer), "the killed pod is let go once its files are discarded")
		_, err = lineageMaster.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/killed-only"})
		Expect(err).To(HaveOccurred(), "the killed pod's files are discarded")
		seal(retry, "part-0")
		seal(retry, "part-1")

		By("the Job succeeds before the pod is seen to: nothing is Written until the pod's files are published")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), job)).To(Succeed())
		job.Status.Active = 0
		Expect(k8sClient.Status().Update(ctx, job)).To(Succeed())
		finishJob(job, true)
		ready := func() string {
			l := &datav1alpha1.Lineage{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "split"}, l)).To(Succeed())
			if c := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionReady); c != nil {
				return c.Reason
			}
			return ""
		}
		Eventually(ready).Should(Equal(ReasonPublishing))
		Consistently(ready, "1s").Should(Equal(ReasonPublishing))
		got, err = lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
		Expect(err).NotTo(HaveOccurred())
		Expect(got.GetComplete()).To(BeFalse(), "the output is not closed before its files are published")
		Expect(finalizers(retry)()).To(ContainElement(attemptFinalizer))

		endPod(job, retry, corev1.PodSucceeded, 0)
		Eventually(ready, 20*time.Second).Should(Equal(ReasonWritten))
		for _, file := range []string{"part-0", "part-1"} {
			f, err := lineageMaster.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/" + file})
			Expect(err).NotTo(HaveOccurred())
			Expect(f.GetAttempt()).To(BeEmpty(), "%s is published", file)
			Expect(f.GetClientToken()).To(Equal(string(retry.UID)+file), "%s is the retry's", file)
		}
		Eventually(finalizers(retry)).ShouldNot(ContainElement(attemptFinalizer))
		Eventually(func() bool {
			got, err := lineageMaster.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
			return err == nil && got.GetComplete()
		}).Should(BeTrue(), "the output is closed once its files are published")
	})
})

var _ = Describe("Uninstalling Strata", func() {
	It("lets go every pod of a Lineage that waits for its attempt to be settled, and only that finalizer", func() {
		var pods []*corev1.Pod
		for i := range 2 {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "uninstall-"}}
			Expect(k8sClient.Create(ctx, ns)).To(Succeed())
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "step", Namespace: ns.Name, Labels: map[string]string{lineageLabel: "l"},
					Finalizers: []string{attemptFinalizer, "example.com/keep"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "step", Image: "example.com/step:1"}}},
			}
			if i == 1 {
				pod.Finalizers = []string{attemptFinalizer}
			}
			Expect(k8sClient.Create(ctx, pod)).To(Succeed())
			pods = append(pods, pod)
		}
		released, err := ReleaseAllAttemptPods(ctx, k8sClient)
		Expect(err).NotTo(HaveOccurred())
		Expect(released).To(BeNumerically(">=", 2), "and any left by other specs")
		for _, pod := range pods {
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
			Expect(pod.Finalizers).NotTo(ContainElement(attemptFinalizer))
		}
		Expect(pods[0].Finalizers).To(ConsistOf("example.com/keep"), "another's finalizer stays")
		pods[0].Finalizers = nil
		Expect(k8sClient.Update(ctx, pods[0])).To(Succeed())
	})
})
