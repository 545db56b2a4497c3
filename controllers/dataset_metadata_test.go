package controllers

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/miniotest"
	masterclient "github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestTheStatusShowsWhatTheWorkersHold: cached bytes, their share of the source and the bytes
// of each tier come from the master's record of block copies.
func TestTheStatusShowsWhatTheWorkersHold(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	masters := mastertest.New(t, 1, mastertest.Options{GRPC: true})
	master := masters.Client()
	ds := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pictures", UID: "9e1d"}}
	ds.Status.TotalBytes = 400
	r := &DatasetReconciler{Master: master}

	r.refreshUsage(ctx, ds)
	g.Expect(ds.Status.CachedBytes).To(BeZero(), "nothing cached before any worker reported a block")
	g.Expect(ds.Status.CachedPercentage).To(Equal("0%"))

	name := datav1alpha1.MasterDatasetName("team-a", "pictures", "9e1d")
	root := datav1alpha1.MasterDatasetRoot("team-a", "pictures", "9e1d")
	_, err := master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = master.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: "pool/node-a", Node: "node-a"})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = master.CreateFile(ctx, &masterpb.CreateFileRequest{Path: root + "/a", Dataset: name})
	g.Expect(err).NotTo(HaveOccurred())
	for i, tier := range []string{"mem", "mem", "nvme"} {
		_, err = master.CommitBlock(ctx, &masterpb.CommitBlockRequest{
			BlockId: uint64(i + 1), Path: root + "/a", Offset: int64(i) * 100, Size: 100, Worker: "pool/node-a", Tier: tier,
		})
		g.Expect(err).NotTo(HaveOccurred())
	}
	r.refreshUsage(ctx, ds)
	g.Expect(ds.Status.CachedBytes).To(BeEquivalentTo(300))
	g.Expect(ds.Status.CachedPercentage).To(Equal("75%"))
	g.Expect(ds.Status.Tiers).To(Equal([]datav1alpha1.TierUsage{{Tier: "mem", Bytes: 200}, {Tier: "nvme", Bytes: 100}}))
	g.Expect(ds.Status.Replicas).To(BeZero(), "a Dataset read from a source shows no replicas: its source has every block")

	// An output's status counts the copies of its least copied block.
	ds.Spec.Lineage = &datav1alpha1.LineageReference{Name: "make-pictures"}
	r.refreshUsage(ctx, ds)
	g.Expect(ds.Status.Replicas).To(BeEquivalentTo(1))
	_, err = master.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: "pool/node-b", Node: "node-b"})
	g.Expect(err).NotTo(HaveOccurred())
	for i := range 3 {
		_, err = master.CommitBlock(ctx, &masterpb.CommitBlockRequest{
			BlockId: uint64(i + 1), Path: root + "/a", Offset: int64(i) * 100, Size: 100, Worker: "pool/node-b", Tier: "mem",
		})
		g.Expect(err).NotTo(HaveOccurred())
	}
	r.refreshUsage(ctx, ds)
	g.Expect(ds.Status.Replicas).To(BeEquivalentTo(2), "every block is on both nodes")
}

// TestADeletedDatasetIsForgottenByTheMaster: the files workers registered for a Dataset go with
// it, and a master that does not answer holds the deletion with a message that says so.
func TestADeletedDatasetIsForgottenByTheMaster(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	masters := mastertest.New(t, 1, mastertest.Options{GRPC: true})
	master := masters.Client()
	ds := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pictures", UID: "3f6c"}}
	name := datav1alpha1.MasterDatasetName("team-a", "pictures", "3f6c")
	root := datav1alpha1.MasterDatasetRoot("team-a", "pictures", "3f6c")

	// As a worker does when it reports the first block it cached.
	_, err := master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = master.CreateFile(ctx, &masterpb.CreateFileRequest{Path: root + "/images/cat.jpg", Dataset: name})
	g.Expect(err).NotTo(HaveOccurred())

	r := &DatasetReconciler{Master: master}
	g.Expect(r.forgetMetadata(ctx, ds)).To(Succeed())
	_, err = master.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
	g.Expect(status.Code(err)).To(Equal(codes.NotFound), "the master forgot the Dataset")
	_, err = master.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/images/cat.jpg"})
	g.Expect(status.Code(err)).To(Equal(codes.NotFound), "and its files")
	g.Expect(r.forgetMetadata(ctx, ds)).To(Succeed(), "forgetting a Dataset the master does not know is done already")

	gone, err := masterclient.New([]string{miniotest.ClosedAddr(t)}, masterclient.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = gone.Close() }()
	err = (&DatasetReconciler{Master: gone}).forgetMetadata(ctx, ds)
	g.Expect(err).To(MatchError(ContainSubstring("waiting for the master to forget the Dataset's files (team-a/pictures/3f6c)")))
}

// TestTierPoolUsageSumsWhatItsLiveWorkersHold: a pool's tiers hold what its live workers report,
// not other pools' workers nor lost ones.
func TestTierPoolUsageSumsWhatItsLiveWorkersHold(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	masters := mastertest.New(t, 1, mastertest.Options{GRPC: true})
	master := masters.Client()
	for id, tiers := range map[string][]*masterpb.TierUsage{
		"fast/node-a":  {{Tier: "mem", UsedBytes: 100}},
		"fast/node-b":  {{Tier: "mem", UsedBytes: 50}, {Tier: "nvme", UsedBytes: 10}},
		"fast/node-c":  {{Tier: "mem", UsedBytes: 7}},
		"other/node-a": {{Tier: "mem", UsedBytes: 1000}},
	} {
		_, err := master.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: id, Node: id, Tiers: tiers})
		g.Expect(err).NotTo(HaveOccurred())
	}
	_, err := master.MarkWorkerLost(ctx, "fast/node-c", "test: node deleted")
	g.Expect(err).NotTo(HaveOccurred())

	used, err := (&TierPoolReconciler{Master: master}).tierUsage(ctx, "fast")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(used).To(Equal(map[string]int64{"mem": 150, "nvme": 10}))
}

// TestAReleasedVolumeLosesItsFiles: deleting a provisioned volume makes the master forget its
// files first, so that the workers drop its blocks.
func TestAReleasedVolumeLosesItsFiles(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	name := datav1alpha1.MasterDatasetName("team-a", "scratch", "77aa")
	_, err := master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: datav1alpha1.MasterDatasetRoot("team-a", "scratch", "77aa")})
	g.Expect(err).NotTo(HaveOccurred())

	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pvc-77aa", Annotations: map[string]string{annProvisionedBy: CSIDriverName}},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: CSIDriverName, VolumeHandle: "team-a/scratch/77aa",
				VolumeAttributes: map[string]string{
					datav1alpha1.VolumeAttributeNamespace: "team-a", datav1alpha1.VolumeAttributeDataset: "scratch",
					datav1alpha1.VolumeAttributeUID: "77aa", datav1alpha1.VolumeAttributeOutput: "true",
				},
			}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased},
	}
	kube := fake.NewClientBuilder().WithObjects(pv).WithStatusSubresource(pv).Build()
	r := &reclaimer{&ProvisionerReconciler{Client: kube, Recorder: record.NewFakeRecorder(10), Master: master}}
	_, err = r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pv)})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = master.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
	g.Expect(status.Code(err)).To(Equal(codes.NotFound), "the master forgot the volume's files")
	g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(pv), &corev1.PersistentVolume{})).To(Satisfy(apierrors.IsNotFound))
}
