package controllers

import (
	"bytes"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cli"
	"github.com/strata-cache/strata/internal/humanize"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/master/masterpb"
)

var _ = Describe("The master's backups", func() {
	var (
		namespace string
		bucket    string
		now       time.Time
		events    *record.FakeRecorder
	)
	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "backups-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
		bucket = namespace
		s3.MakeBucket(GinkgoT(), bucket)
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "backup-keys", Namespace: namespace},
			Data: map[string][]byte{"accessKeyID": []byte(miniotest.AccessKey), "secretAccessKey": []byte(miniotest.SecretKey)}})).To(Succeed())
		now = time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
		events = record.NewFakeRecorder(20)
	})
	reconciler := func(master MasterBackups, mutate func(*MasterBackupSpec)) *MasterBackupReconciler {
		metrics, err := NewMasterBackupMetrics(prometheus.NewRegistry())
		Expect(err).NotTo(HaveOccurred())
		spec := MasterBackupSpec{Namespace: namespace, URI: "s3://" + bucket + "/backups", Endpoint: "http://" + s3.Endpoint, SecretName: "backup-keys"}
		if mutate != nil {
			mutate(&spec)
		}
		Expect(spec.Validate()).To(Succeed())
		return &MasterBackupReconciler{Client: k8sClient, APIReader: k8sClient, Recorder: events, Master: master, Spec: spec, Metrics: metrics,
			Now: func() time.Time { return now }}
	}
	record := func() *corev1.ConfigMap {
		GinkgoHelper()
		cm := &corev1.ConfigMap{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: datav1alpha1.MasterBackupsConfigMap}, cm)).To(Succeed())
		return cm
	}
	reconcile := func(r *MasterBackupReconciler) ctrl.Result {
		GinkgoHelper()
		res, err := r.Reconcile(ctx, ctrl.Request{})
		Expect(err).NotTo(HaveOccurred())
		return res
	}
	request := func(token string) {
		GinkgoHelper()
		cm := record()
		patch := client.MergeFrom(cm.DeepCopy())
		cm.Annotations = map[string]string{datav1alpha1.AnnotationBackupRequested: token}
		Expect(k8sClient.Patch(ctx, cm, patch)).To(Succeed())
	}
	backups := func() map[string]int64 {
		GinkgoHelper()
		store, err := understore.Open(ctx, understore.Source{URI: "s3://" + bucket + "/backups" + "/", Endpoint: "http://" + s3.Endpoint,
			Credentials: map[string]string{"accessKeyID": miniotest.AccessKey, "secretAccessKey": miniotest.SecretKey}})
		Expect(err).NotTo(HaveOccurred())
		out := map[string]int64{}
		for info, err := range store.List(ctx, "") {
			Expect(err).NotTo(HaveOccurred())
			out[info.Path] = info.Size
		}
		return out
	}
	nextEvent := func() string {
		GinkgoHelper()
		var e string
		Eventually(events.Events).Should(Receive(&e))
		return e
	}

	It("backs the master up on request and on schedule, records each, and says what to fix when it cannot", func() {
		for i := range 3 {
			p := fmt.Sprintf("/%s/part-%d", namespace, i)
			if i == 0 {
				_, err := backedUpMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: namespace + "/out", Root: "/" + namespace})
				Expect(err).NotTo(HaveOccurred())
			}
			_, err := backedUpMaster.CreateFile(ctx, &masterpb.CreateFileRequest{Path: p, Dataset: namespace + "/out", Written: true})
			Expect(err).NotTo(HaveOccurred())
		}
		r := reconciler(backedUpMaster, nil)
		Expect(reconcile(r)).To(Equal(ctrl.Result{}))
		Expect(record().Data).To(Equal(map[string]string{
			datav1alpha1.BackupKeyStore: r.Spec.URI, datav1alpha1.BackupKeySchedule: "on request only (kubectl strata backup)",
		}))
		Expect(reconcile(r)).To(Equal(ctrl.Result{}), "no schedule, no request: nothing to do")
		Expect(backups()).To(BeEmpty())

		By("a request, by kubectl strata backup")
		withWatch, err := client.NewWithWatch(testEnv.Config, client.Options{Scheme: k8sClient.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		out := &bytes.Buffer{}
		plugin := &cli.CLI{Client: withWatch, Namespace: "team", StrataNamespace: namespace, Out: out, Wait: 30 * time.Second}
		done := make(chan error, 1)
		go func() { done <- plugin.Backup(ctx) }()
		Eventually(func() map[string]string { return record().Annotations }).Should(HaveKey(datav1alpha1.AnnotationBackupRequested))
		Expect(reconcile(r)).To(Equal(ctrl.Result{}))
		Eventually(done).Should(Receive(BeNil()))
		name := "strata-master-20261130T020000Z.backup"
		Expect(out.String()).To(Equal("asked for a backup of the master to " + r.Spec.URI + "; waiting for it…\n" +
			"backed up: " + r.Spec.URI + "/" + name + ", " + humanize.Bytes(backups()[name]) + ", up to Raft index " + record().Data[datav1alpha1.BackupKeyLastIndex] + "\n"))
		Expect(backups()).To(HaveKey(name))
		data := record().Data
		Expect(data).To(HaveKeyWithValue(datav1alpha1.BackupKeyResult, datav1alpha1.BackupSucceeded))
		Expect(data).To(HaveKeyWithValue(datav1alpha1.BackupKeyLast, name))
		Expect(data).To(HaveKeyWithValue(datav1alpha1.BackupKeyHandled, record().Annotations[datav1alpha1.AnnotationBackupRequested]))
		Expect(data).To(HaveKeyWithValue(datav1alpha1.BackupKeyLastBytes, fmt.Sprint(backups()[name])))
		Expect(data[datav1alpha1.BackupKeyLastIndex]).NotTo(BeEmpty())
		Expect(nextEvent()).To(And(HavePrefix("Normal "+ReasonBackedUp), ContainSubstring(name)))
		Expect(testutil.ToFloat64(r.Metrics.Backups.WithLabelValues("succeeded"))).To(Equal(1.0))
		Expect(reconcile(r)).To(Equal(ctrl.Result{}), "a request is answered once")

		By("a schedule")
		r = reconciler(backedUpMaster, func(s *MasterBackupSpec) { s.Every = time.Hour })
		now = now.Add(10 * time.Minute)
		Expect(reconcile(r)).To(Equal(ctrl.Result{RequeueAfter: 50 * time.Minute}))
		now = now.Add(50 * time.Minute)
		Expect(reconcile(r)).To(Equal(ctrl.Result{RequeueAfter: time.Hour}))
		Expect(backups()).To(HaveLen(2))
		Expect(record().Data).To(HaveKeyWithValue(datav1alpha1.BackupKeyLast, "strata-master-20261130T030000Z.backup"))
		Expect(nextEvent()).To(HavePrefix("Normal " + ReasonBackedUp))

		By("keys that are not there: kubectl strata backup says so")
		r = reconciler(backedUpMaster, func(s *MasterBackupSpec) { s.Every, s.SecretName = time.Hour, "no-such-keys" })
		go func() { done <- plugin.Backup(ctx) }()
		Eventually(func() string { return record().Annotations[datav1alpha1.AnnotationBackupRequested] }).ShouldNot(Equal(data[datav1alpha1.BackupKeyHandled]))
		Expect(reconcile(r)).To(Equal(ctrl.Result{RequeueAfter: time.Minute}))
		Eventually(done).Should(Receive(MatchError(ContainSubstring("the backup failed: the Secret " + namespace + "/no-such-keys of the backups' keys does not exist"))))
		request("r2")
		Expect(reconcile(r)).To(Equal(ctrl.Result{RequeueAfter: time.Minute}))
		nextEvent()
		data = record().Data
		Expect(data).To(HaveKeyWithValue(datav1alpha1.BackupKeyResult, datav1alpha1.BackupFailed))
		Expect(data).To(HaveKeyWithValue(datav1alpha1.BackupKeyHandled, "r2"))
		Expect(data[datav1alpha1.BackupKeyFailure]).To(ContainSubstring("the Secret " + namespace + "/no-such-keys of the backups' keys does not exist: create it with accessKeyID and secretAccessKey"))
		Expect(data).To(HaveKeyWithValue(datav1alpha1.BackupKeyLast, "strata-master-20261130T030000Z.backup"), "the last good backup is still named")
		Expect(nextEvent()).To(HavePrefix("Warning " + ReasonBackupFailed))
		Expect(testutil.ToFloat64(r.Metrics.Backups.WithLabelValues("failed"))).To(Equal(2.0))
		By("a failed scheduled backup is tried again a minute later, not an hour")
		now = now.Add(30 * time.Second)
		Expect(reconcile(r)).To(Equal(ctrl.Result{RequeueAfter: 30 * time.Second}))
	})

	It("restores a new install's empty master from the latest backup once, and leaves a master in use alone", func() {
		_, err := backedUpMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: namespace + "/out", Root: "/" + namespace})
		Expect(err).NotTo(HaveOccurred())
		_, err = backedUpMaster.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/" + namespace + "/part-0", Dataset: namespace + "/out", Written: true})
		Expect(err).NotTo(HaveOccurred())

		By("no backup to restore from yet: no backup is taken either, which would be the empty master's")
		restore := reconciler(restoredMaster, func(s *MasterBackupSpec) { s.RestoreFrom, s.Every = RestoreLatest, time.Hour })
		reconcile(restore)
		Expect(reconcile(restore)).To(Equal(ctrl.Result{RequeueAfter: 10 * time.Second}))
		Expect(record().Data[datav1alpha1.BackupKeyFailure]).To(ContainSubstring("restore: there is no backup (strata-master-*.backup) under s3://" + bucket + "/backups/ at http://" + s3.Endpoint + " to restore from"))
		Expect(nextEvent()).To(HavePrefix("Warning " + ReasonRestoreFailed))
		Expect(backups()).To(BeEmpty())

		backup := reconciler(backedUpMaster, nil)
		request("first")
		reconcile(backup)
		now = now.Add(time.Hour)
		request("second")
		reconcile(backup)
		Expect(backups()).To(HaveLen(2))
		nextEvent()
		nextEvent()
		_, err = backedUpMaster.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/" + namespace + "/after", Dataset: namespace + "/out", Written: true})
		Expect(err).NotTo(HaveOccurred())

		By("the restore, of the latest")
		now = now.Add(time.Minute)
		Expect(reconcile(restore)).To(Equal(ctrl.Result{Requeue: true}))
		note := record().Data[datav1alpha1.BackupKeyRestore]
		Expect(note).To(HavePrefix("restored from strata-master-20261130T030000Z.backup at 2026-11-30T03:01:00Z: "))
		Expect(nextEvent()).To(HavePrefix("Normal " + ReasonRestored))
		list, err := restoredMaster.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: "/" + namespace})
		Expect(err).NotTo(HaveOccurred())
		Expect(list.Entries).To(HaveLen(1), "the backup's file, not the one written after it")
		By("then the schedule goes on from the last backup, and the restore is not taken again")
		Expect(reconcile(restore)).To(Equal(ctrl.Result{RequeueAfter: 59 * time.Minute}))
		Expect(backups()).To(HaveLen(2))
		Expect(record().Data[datav1alpha1.BackupKeyRestore]).To(Equal(note))

		forgetRestore := func() {
			GinkgoHelper()
			cm := record()
			patch := client.MergeFrom(cm.DeepCopy())
			delete(cm.Data, datav1alpha1.BackupKeyRestore)
			Expect(k8sClient.Patch(ctx, cm, patch)).To(Succeed())
		}
		By("the same backup asked again (an operator that did not learn the outcome) is recognised")
		forgetRestore()
		reconcile(restore)
		Expect(record().Data[datav1alpha1.BackupKeyRestore]).To(HavePrefix("restored from strata-master-20261130T030000Z.backup (by an earlier attempt, "))
		Expect(nextEvent()).To(HavePrefix("Normal " + ReasonRestored))

		By("a master in use is not restored from another backup")
		now = now.Add(time.Hour)
		request("third")
		reconcile(backup)
		Expect(nextEvent()).To(HavePrefix("Normal " + ReasonBackedUp))
		forgetRestore()
		reconcile(restore)
		Expect(record().Data[datav1alpha1.BackupKeyRestore]).To(And(HavePrefix("not restored from strata-master-20261130T040100Z.backup: "), ContainSubstring("the master is not empty")))
		Expect(nextEvent()).To(HavePrefix("Warning " + ReasonRestoreNotTaken))
		list, err = restoredMaster.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: "/" + namespace})
		Expect(err).NotTo(HaveOccurred())
		Expect(list.Entries).To(HaveLen(1))
	})
})
