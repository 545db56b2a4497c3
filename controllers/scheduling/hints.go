// Package scheduling steers the pods that mount Datasets to the nodes that hold them, so that
// their reads are local. It is a mutating admission webhook on pod creation: for each claim of
// the pod that is a Dataset's, it reads from the Dataset's status which nodes hold how much of
// it (the operator refreshes that from the master), and adds to the pod a preferred node
// affinity for those nodes, weighted by the bytes they hold. A preference, never a
// requirement: the scheduler still places a pod where the nodes holding its data are full,
// and the pod then reads from them over the network.
//
// The webhook fails open. A pod is never refused or delayed for want of a hint: any failure
// admits the pod as it came, and the webhook configuration's failurePolicy is Ignore.
package scheduling

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// Path is where the webhook is served.
const Path = "/mutate-v1-pod-dataset-locality"

// HintAnnotation records on a pod the nodes it was steered to and the weight of each, such as
// "node-a=100,node-b=40", so that `kubectl get pod -o yaml` says why it prefers them.
const HintAnnotation = "data.strata.dev/preferred-nodes"

// maxHintedNodes bounds the terms added to one pod.
const maxHintedNodes = 8

// Outcomes of one admission, the label of the hints counter.
const (
	outcomeHinted   = "hinted"
	outcomeNoData   = "no_cached_data"
	outcomeNoClaims = "no_dataset_claims"
	outcomeSkipped  = "skipped"
	outcomeFailed   = "failed"
)

// Hinter is the webhook's handler.
type Hinter struct {
	// Client reads claims and Datasets, from the operator's cache.
	Client  client.Reader
	Decoder admission.Decoder
	hints   *prometheus.CounterVec
}

// NewHinter returns a Hinter whose counter of admissions by outcome,
// strata_operator_scheduling_hints_total, is registered with reg.
func NewHinter(c client.Reader, decoder admission.Decoder, reg prometheus.Registerer) (*Hinter, error) {
	h := &Hinter{Client: c, Decoder: decoder, hints: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_operator_scheduling_hints_total",
		Help: "Pods admitted by the Dataset locality webhook, by outcome: hinted, no_cached_data, no_dataset_claims, skipped or failed.",
	}, []string{"outcome"})}
	if err := reg.Register(h.hints); err != nil {
		return nil, fmt.Errorf("registering the scheduling hint metrics: %w", err)
	}
	return h, nil
}

var _ admission.Handler = (*Hinter)(nil)

// Handle adds the node preferences of the Datasets a new pod mounts.
func (h *Hinter) Handle(ctx context.Context, req admission.Request) admission.Response {
	log := logf.FromContext(ctx).WithValues("pod", req.Namespace+"/"+podName(req))
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		h.hints.WithLabelValues(outcomeFailed).Inc()
		// Fail open: a pod the webhook cannot read is still the API server's to judge.
		return admission.Allowed("not a pod the Dataset locality webhook can read: " + err.Error())
	}
	if pod.Spec.NodeName != "" || pod.Annotations[HintAnnotation] != "" {
		h.hints.WithLabelValues(outcomeSkipped).Inc()
		return admission.Allowed("the pod names its node, or was hinted already")
	}
	nodes, datasets, err := h.cachedNodes(ctx, req.Namespace, pod)
	if err != nil {
		h.hints.WithLabelValues(outcomeFailed).Inc()
		log.Error(err, "Admitting the pod without Dataset locality hints")
		return admission.Allowed("no Dataset locality hints: " + err.Error())
	}
	switch {
	case datasets == 0:
		h.hints.WithLabelValues(outcomeNoClaims).Inc()
		return admission.Allowed("the pod mounts no Dataset")
	case len(nodes) == 0:
		h.hints.WithLabelValues(outcomeNoData).Inc()
		return admission.Allowed("no node holds any of the pod's Datasets yet")
	}
	addPreferences(pod, nodes)
	mutated, err := json.Marshal(pod)
	if err != nil {
		h.hints.WithLabelValues(outcomeFailed).Inc()
		return admission.Allowed("no Dataset locality hints: " + err.Error())
	}
	h.hints.WithLabelValues(outcomeHinted).Inc()
	log.V(1).Info("Steering the pod to the nodes holding its Datasets", "nodes", pod.Annotations[HintAnnotation])
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

func podName(req admission.Request) string {
	if req.Name != "" {
		return req.Name
	}
	return "(generated name)"
}

// nodeBytes is how much of a pod's Datasets one node holds.
type nodeBytes struct {
	node  string
	bytes int64
}

// cachedNodes sums, per node, the bytes held of the Datasets whose claims pod mounts, most
// first, and says how many of its claims are Datasets'.
func (h *Hinter) cachedNodes(ctx context.Context, namespace string, pod *corev1.Pod) ([]nodeBytes, int, error) {
	perNode := map[string]int64{}
	datasets := 0
	seen := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim == nil || seen[v.PersistentVolumeClaim.ClaimName] {
			continue
		}
		seen[v.PersistentVolumeClaim.ClaimName] = true
		ds, err := h.datasetOfClaim(ctx, namespace, v.PersistentVolumeClaim.ClaimName)
		if err != nil {
			return nil, 0, err
		}
		if ds == nil {
			continue
		}
		datasets++
		for _, n := range ds.Status.Nodes {
			perNode[n.Node] += n.Bytes
		}
	}
	var out []nodeBytes
	for node, bytes := range perNode {
		if bytes > 0 {
			out = append(out, nodeBytes{node, bytes})
		}
	}
	slices.SortFunc(out, func(a, b nodeBytes) int {
		if c := cmp.Compare(b.bytes, a.bytes); c != 0 {
			return c
		}
		return strings.Compare(a.node, b.node)
	})
	return out, datasets, nil
}

// datasetOfClaim returns the Dataset whose claim this is, or nil for any other claim (not
// found included: the pod then waits for its claim, hints or not).
func (h *Hinter) datasetOfClaim(ctx context.Context, namespace, claim string) (*datav1alpha1.Dataset, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := h.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: claim}, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading claim %s/%s: %w", namespace, claim, err)
	}
	owner := metav1.GetControllerOf(pvc)
	if owner == nil || owner.Kind != "Dataset" || !strings.HasPrefix(owner.APIVersion, datav1alpha1.GroupVersion.Group+"/") {
		return nil, nil
	}
	ds := &datav1alpha1.Dataset{}
	if err := h.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: owner.Name}, ds); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Dataset %s/%s: %w", namespace, owner.Name, err)
	}
	if ds.UID != owner.UID {
		return nil, nil // a Dataset of the same name made since; its own claim will follow
	}
	return ds, nil
}

// addPreferences adds one preferred node affinity term per node, weighted from 1 to 100 by the
// bytes it holds against the node that holds most, and records them in HintAnnotation.
func addPreferences(pod *corev1.Pod, nodes []nodeBytes) {
	if len(nodes) > maxHintedNodes {
		nodes = nodes[:maxHintedNodes]
	}
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Spec.Affinity.NodeAffinity
	most := nodes[0].bytes
	var hint []string
	for _, n := range nodes {
		weight := int32(max(1, n.bytes*100/most))
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.PreferredSchedulingTerm{Weight: weight, Preference: corev1.NodeSelectorTerm{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n.node}}},
			}})
		hint = append(hint, fmt.Sprintf("%s=%d", n.node, weight))
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[HintAnnotation] = strings.Join(hint, ",")
}
