package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// rolloutRecheck is how often a master rollout that has not finished is looked at again: a
// replica that fails to start (its image not found, say) changes nothing the operator watches.
const rolloutRecheck = 10 * time.Second

// replaceStalledReplicas deletes the replicas of an earlier revision of the StatefulSet that
// never started. The StatefulSet controller replaces one replica at a time and waits for each
// new one to be Ready before the next; a master replica is Ready only once it is part of a
// quorum. So when a majority never started (an install or upgrade whose image cannot be pulled,
// a flag that makes the replica exit), the replica replaced with the fixed template waits for a
// quorum of replicas the controller will not replace until it is Ready: the fix is never rolled
// out, and someone has to delete the broken replicas by hand. Such a replica serves nothing, so
// deleting it costs the group nothing; the StatefulSet starts it again at the new revision. A
// replica whose container runs, ready or not (catching up, or on a node that stopped
// answering), is left to the rollout.
// It reports whether the rollout is still going, to be looked at again.
func (r *MasterReconciler) replaceStalledReplicas(ctx context.Context, pods []corev1.Pod) (rolling bool, err error) {
	sts := &appsv1.StatefulSet{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Spec.Namespace, Name: r.Spec.Name}, sts); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	revision := sts.Status.UpdateRevision
	if revision == "" || sts.Status.ObservedGeneration < sts.Generation {
		// The StatefulSet controller has not looked at the latest template yet; its status
		// update, when it does, wakes this reconciler (it owns the StatefulSet).
		return false, nil
	}
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || p.Labels[appsv1.ControllerRevisionHashLabelKey] == revision {
			continue
		}
		rolling = true
		why, stalled := neverStarted(p)
		if !stalled {
			continue
		}
		ctrl.LoggerFrom(ctx).Info("replacing a master replica of an earlier revision that never started, so that the rollout goes on",
			"pod", p.Name, "revision", p.Labels[appsv1.ControllerRevisionHashLabelKey], "updateRevision", revision, "why", why)
		if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil {
			return true, fmt.Errorf("deleting master pod %s/%s, of an earlier revision and never started (%s): %w", p.Namespace, p.Name, why, err)
		}
		r.event(sts, corev1.EventTypeNormal, "ReplacedStalledReplica", fmt.Sprintf(
			"deleted replica %s of revision %s, which never started (%s), to start it at revision %s",
			p.Name, p.Labels[appsv1.ControllerRevisionHashLabelKey], why, revision))
	}
	return rolling, nil
}

// neverStarted says whether none of p's containers runs nor is ready, and why: it waits to be
// scheduled, or each container waits (for its image, or to be started again after a crash).
func neverStarted(p *corev1.Pod) (why string, stalled bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return "", false
		}
	}
	if p.Status.Phase == corev1.PodPending && len(p.Status.ContainerStatuses) == 0 {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				return "not scheduled: " + c.Message, true
			}
		}
		return "", false // created a moment ago
	}
	var reasons []string
	for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		switch {
		case c.State.Running != nil:
			return "", false
		case c.State.Waiting != nil && c.State.Waiting.Reason != "ContainerCreating" && c.State.Waiting.Reason != "PodInitializing":
			reasons = append(reasons, c.Name+": "+c.State.Waiting.Reason)
		}
	}
	if len(reasons) == 0 {
		return "", false
	}
	return strings.Join(reasons, ", "), true
}
