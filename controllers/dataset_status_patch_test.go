package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/miniotest"
)

// countingSyncer answers every sync with one mount and one file added.
type countingSyncer struct{ calls int }

func (s *countingSyncer) SyncDataset(context.Context, string, string) (SyncOutcome, error) {
	s.calls++
	return SyncOutcome{Mounts: 1, Added: 1}, nil
}

func (s *countingSyncer) DescribeDataset(context.Context, string, string) (DatasetView, bool, error) {
	return DatasetView{}, false, nil
}

func (s *countingSyncer) ForgetDataset(context.Context, string, string) error { return nil }

// TestWhatAReconcileFoundIsRecordedWhenALaterStepFails: the status is written on every way
// out of a reconcile, so a sync that ran is not run again, nor its counts lost, because
// creating the volume failed after it.
func TestWhatAReconcileFoundIsRecordedWhenALaterStepFails(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s3 := miniotest.Start(t)
	s3.MakeBucket(t, "data")
	s3.Put(t, "data", "set/a.bin", []byte("hello"))

	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	g.Expect(datav1alpha1.AddToScheme(scheme)).To(Succeed())
	ds := &datav1alpha1.Dataset{
		ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "team-a", UID: "5c2e", Finalizers: []string{DatasetFinalizer},
			Annotations: map[string]string{datav1alpha1.AnnotationSyncRequested: "1"}},
		Spec: datav1alpha1.DatasetSpec{
			Source: &datav1alpha1.DatasetSource{URI: "s3://data/set/", Endpoint: "http://" + s3.Endpoint,
				SecretRef: &datav1alpha1.SecretReference{Name: "creds"}},
			TierPoolName: "pool",
		},
	}
	pool := &datav1alpha1.TierPool{ObjectMeta: metav1.ObjectMeta{Name: "pool"}, Spec: datav1alpha1.TierPoolSpec{Tiers: []datav1alpha1.Tier{{
		Name: "mem", Medium: datav1alpha1.MediumMemory, Paths: []string{"/mnt/mem"}, Quota: resource.MustParse("1Gi"),
	}}}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "team-a"},
		Data: map[string][]byte{"accessKeyID": []byte(miniotest.AccessKey), "secretAccessKey": []byte(miniotest.SecretKey)}}
	volumesDown := true
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ds, pool, secret).WithStatusSubresource(ds).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.PersistentVolume); ok && volumesDown {
				return errors.New("the API server is overloaded")
			}
			return c.Create(ctx, obj, opts...)
		}}).Build()
	syncer := &countingSyncer{}
	r := &DatasetReconciler{Client: c, APIReader: c, Recorder: record.NewFakeRecorder(100), Syncer: syncer}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ds)}

	_, err := r.Reconcile(ctx, req)
	g.Expect(err).To(MatchError(ContainSubstring("the API server is overloaded")))
	got := &datav1alpha1.Dataset{}
	g.Expect(c.Get(ctx, req.NamespacedName, got)).To(Succeed())
	g.Expect(got.Status.Sync).NotTo(BeNil(), "the sync that ran is recorded though the reconcile failed after it")
	g.Expect(got.Status.Sync.Request).To(Equal("1"))
	g.Expect(got.Status.Sync.Added).To(BeEquivalentTo(1))

	volumesDown = false
	_, err = r.Reconcile(ctx, req)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(syncer.calls).To(Equal(1), "the request was answered once")
}
