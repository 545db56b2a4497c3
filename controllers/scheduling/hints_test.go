package scheduling

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// TestTheWebhookFailsOpen: a pod is never refused for want of a hint, whether the webhook cannot
// read the pod or cannot read what the pod mounts; with both readable, the pod is hinted.
func TestTheWebhookFailsOpen(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := datav1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ds := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Name: "images", Namespace: "team-a", UID: "ds-uid"}}
	ds.Status.Nodes = []datav1alpha1.NodeUsage{{Node: "node-b", Bytes: 1 << 30}}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "images", Namespace: "team-a"}}
	pvc.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(ds, datav1alpha1.GroupVersion.WithKind("Dataset"))}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: "team-a"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: "i"}},
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "images"}}}},
	}}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	request := func(object []byte) admission.Request {
		return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Namespace: "team-a", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: object},
		}}
	}
	cases := []struct {
		name     string
		object   []byte
		apiDown  bool
		outcome  string
		patched  bool
		contains string
	}{
		{name: "hinted", object: raw, outcome: outcomeHinted, patched: true},
		{name: "a pod it cannot decode", object: []byte("{not json"), outcome: outcomeFailed, contains: "not a pod the Dataset locality webhook can read"},
		{name: "claims it cannot read", object: raw, apiDown: true, outcome: outcomeFailed, contains: "the API server is unavailable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ds, pvc).WithInterceptorFuncs(interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if tc.apiDown {
						return errors.New("the API server is unavailable")
					}
					return c.Get(ctx, key, obj, opts...)
				}}).Build()
			reg := prometheus.NewRegistry()
			h, err := NewHinter(c, admission.NewDecoder(scheme), reg)
			g.Expect(err).NotTo(HaveOccurred())
			resp := h.Handle(context.Background(), request(tc.object))
			g.Expect(resp.Allowed).To(BeTrue(), "the pod is admitted: %v", resp.Result)
			g.Expect(resp.Patches != nil).To(Equal(tc.patched))
			if tc.contains != "" {
				g.Expect(resp.Result.Message).To(ContainSubstring(tc.contains))
			}
			g.Expect(testutil.ToFloat64(h.hints.WithLabelValues(tc.outcome))).To(Equal(1.0))
		})
	}
}
