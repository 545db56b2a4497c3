package controllers

import (
	"fmt"
	"math"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// Reasons of a TierPool's Ready condition.
const (
	// ReasonNoNodesSelected means that no node matches the pool's selector, or that every one
	// that does has a taint the pool does not tolerate.
	ReasonNoNodesSelected = "NoNodesSelected"
	// ReasonWorkersNotDeployed means that the operator deploys no worker for the pool: it was
	// started without --worker-image, or the pool's name cannot label the workers' pods.
	ReasonWorkersNotDeployed = "WorkersNotDeployed"
	// ReasonWorkersNotReady means that fewer workers are ready than the pool has nodes, or than
	// its DaemonSet wants.
	ReasonWorkersNotReady = "WorkersNotReady"
	// ReasonWorkersReady means that every node of the pool runs a ready worker.
	ReasonWorkersReady = "WorkersReady"
)

// workerObservation is what the status needs to know about a pool's worker DaemonSet.
type workerObservation struct {
	// deployed is false when the operator deploys no worker (it has no --worker-image).
	deployed bool
	// namespace of the DaemonSet, for the kubectl command in the message.
	namespace string
	// found is false until the worker reconciler has created the DaemonSet.
	found bool
	// desired and ready are the DaemonSet's status.desiredNumberScheduled and status.numberReady.
	desired, ready int32
}

// daemonSetTolerations are the tolerations the DaemonSet controller adds to every daemon pod
// (see "Taints and tolerations" in the DaemonSet documentation). The workers of a pool run as a
// DaemonSet, so status.nodes counts what the DaemonSet's desired number of pods counts: a cordoned
// or pressured node stays in the pool. A node that is not ready carries
// node.kubernetes.io/not-ready:NoSchedule and leaves it, as it leaves the DaemonSet's count
// (a worker already running there is not evicted: the NoExecute variant is tolerated).
var daemonSetTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

// untoleratedTaint returns the first NoSchedule or NoExecute taint that neither the pool's
// tolerations nor the DaemonSet's own tolerate, or nil when a worker can run on the node.
// PreferNoSchedule taints do not keep a pod off a node.
func untoleratedTaint(taints []corev1.Taint, tolerations []corev1.Toleration) *corev1.Taint {
	for i := range taints {
		taint := &taints[i]
		if taint.Effect != corev1.TaintEffectNoSchedule && taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !tolerates(tolerations, taint) && !tolerates(daemonSetTolerations, taint) {
			return taint
		}
	}
	return nil
}

func tolerates(tolerations []corev1.Toleration, taint *corev1.Taint) bool {
	for i := range tolerations {
		if tolerations[i].ToleratesTaint(taint) {
			return true
		}
	}
	return false
}

// setTierPoolStatus writes into pool.Status what sel says about the cluster and workers about
// the pool's DaemonSet. It is the only place that sets the pool's conditions.
func setTierPoolStatus(pool *datav1alpha1.TierPool, sel nodeSelection, workers workerObservation, used map[string]int64) {
	nodes := int32(len(sel.schedulable))
	pool.Status.Nodes = nodes
	pool.Status.ReadyWorkers = workers.ready
	pool.Status.ObservedGeneration = pool.Generation

	tiers := make([]datav1alpha1.TierStatus, 0, len(pool.Spec.Tiers))
	for _, t := range pool.Spec.Tiers {
		tiers = append(tiers, datav1alpha1.TierStatus{
			Name:          t.Name,
			Medium:        t.Medium,
			CapacityBytes: multiplySaturating(t.Quota.Value(), int64(nodes)),
			// What the pool's workers report to the master; nothing before they run.
			UsedBytes: used[t.Name],
		})
	}
	pool.Status.Tiers = tiers

	ready := metav1.Condition{
		Type:               datav1alpha1.ConditionReady,
		Status:             metav1.ConditionFalse,
		ObservedGeneration: pool.Generation,
	}
	if nodes == 0 {
		ready.Reason = ReasonNoNodesSelected
		ready.Message = noNodesMessage(pool.Spec.NodeSelector, sel)
	} else {
		ready.Status, ready.Reason, ready.Message = workersReadiness(pool.Name, nodes, workers)
		if excluded := sel.matching - len(sel.schedulable); excluded > 0 {
			ready.Message += fmt.Sprintf("; %d more node(s) match spec.nodeSelector but have a taint "+
				"the pool does not tolerate, such as %s", excluded, sel.untolerated.ToString())
		}
	}
	meta.SetStatusCondition(&pool.Status.Conditions, ready)
}

// workersReadiness says whether the workers of a pool that selects nodes serve all of them, and
// if not, what to look at.
func workersReadiness(pool string, nodes int32, workers workerObservation) (metav1.ConditionStatus, string, string) {
	if !workers.deployed {
		return metav1.ConditionFalse, ReasonWorkersNotDeployed,
			fmt.Sprintf("%d node(s) selected, but no cache worker runs on them: the operator was started without "+
				"--worker-image, so it deploys none (set the chart's worker.enabled and worker.image values)", nodes)
	}
	if problem := workerNameProblem(pool); problem != "" {
		return metav1.ConditionFalse, ReasonWorkersNotDeployed,
			fmt.Sprintf("%d node(s) selected, but no cache worker runs on them: %s", nodes, problem)
	}
	if !workers.found {
		return metav1.ConditionFalse, ReasonWorkersNotReady,
			fmt.Sprintf("%d node(s) selected; the worker DaemonSet %s/%s does not exist yet: the operator creates it, "+
				"and the Events of this TierPool say why when it cannot", nodes, workers.namespace, WorkerName(pool))
	}
	// The larger of the two: a DaemonSet that has not yet counted a new node is not ready on it.
	want := max(workers.desired, nodes)
	if workers.ready < want {
		return metav1.ConditionFalse, ReasonWorkersNotReady,
			fmt.Sprintf("%d of %d worker(s) ready: see `kubectl -n %s get pods -l %s`",
				workers.ready, want, workers.namespace, workerPodsSelector(pool))
	}
	return metav1.ConditionTrue, ReasonWorkersReady, fmt.Sprintf("%d of %d worker(s) ready", workers.ready, want)
}

// noNodesMessage says why a pool selects no node and what to change.
func noNodesMessage(selector map[string]string, sel nodeSelection) string {
	switch {
	case sel.matching > 0:
		return fmt.Sprintf("%d node(s) match spec.nodeSelector %s, but each has a taint the pool does not "+
			"tolerate, such as %s: add a toleration to spec.tolerations or remove the taint from the nodes",
			sel.matching, formatSelector(selector), sel.untolerated.ToString())
	case len(selector) == 0:
		return "the cluster has no node: spec.nodeSelector is empty and selects every node, so add nodes to the cluster"
	default:
		pairs := selectorPairs(selector)
		return fmt.Sprintf("no node matches spec.nodeSelector {%s}: label nodes with "+
			"`kubectl label node <node> %s` or change the selector",
			strings.Join(pairs, ", "), strings.Join(pairs, " "))
	}
}

// formatSelector writes a node selector as {key=value, …} with sorted keys.
func formatSelector(selector map[string]string) string {
	return "{" + strings.Join(selectorPairs(selector), ", ") + "}"
}

func selectorPairs(selector map[string]string) []string {
	pairs := make([]string, 0, len(selector))
	for k, v := range selector {
		pairs = append(pairs, k+"="+v)
	}
	sort.Strings(pairs)
	return pairs
}

// multiplySaturating returns a×b for non-negative a and b, or math.MaxInt64 when that overflows.
func multiplySaturating(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}
