package controllers

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

// A Lineage's outputs are committed per attempt, the way Hadoop's output committers work: the
// files a pod of its Jobs seals stay that pod's attempt's at the master (masterpb.File.attempt,
// unseen by readers) until the pod ends. A pod that succeeds has its attempt published; one
// that fails, is disrupted or is gone has it discarded, so that the Job's retry of a killed pod
// writes the same paths afresh and no half-written file of the killed one is ever read.
//
// The pods carry attemptFinalizer, so that a pod that succeeded (or failed) stays until its
// attempt is settled: a Job's ttlSecondsAfterFinished, or a user deleting the Job, would
// otherwise take a pod away before the operator saw it succeed, and its files with it.

// attemptFinalizer holds a Lineage's pods until the operator settled what they wrote.
const attemptFinalizer = "data.strata.dev/attempt"

// ReasonPublishing is the Ready reason of a Lineage whose Job succeeded while what its pods
// wrote is not published yet.
const ReasonPublishing = "Publishing"

// EventAttemptDiscarded is the reason of the event saying a pod's files were discarded.
const EventAttemptDiscarded = "AttemptDiscarded"

// attemptOutcome is what becomes of the files a pod wrote.
type attemptOutcome int

const (
	attemptRunning attemptOutcome = iota // the pod may write more: nothing yet
	attemptPublish                       // the pod succeeded
	attemptDiscard                       // the pod failed, was disrupted, or is gone
)

// outcomeOf is what becomes of the files pod wrote; nil is a pod that no longer exists, or
// never was one of the Lineage's (only its Jobs' pods write its outputs).
func outcomeOf(pod *corev1.Pod) attemptOutcome {
	switch {
	case pod == nil || pod.Status.Phase == corev1.PodFailed:
		return attemptDiscard
	case pod.Status.Phase == corev1.PodSucceeded:
		return attemptPublish
	case !pod.DeletionTimestamp.IsZero() && !anyContainerRunning(pod):
		// Deleted before it ran, or stopped by its deletion: the kubelet may never say Failed.
		return attemptDiscard
	}
	return attemptRunning
}

// anyContainerRunning says whether a container of pod may still run (one without a state yet may).
func anyContainerRunning(pod *corev1.Pod) bool {
	for _, c := range pod.Status.ContainerStatuses {
		if c.State.Running != nil || (c.State.Terminated == nil && c.State.Waiting == nil) {
			return true
		}
	}
	return false
}

// settleAttempts publishes or discards, at the master, the attempts of l's outputs whose pods
// ended, and then lets those pods go (attemptFinalizer). settled is false while an attempt is
// left: its pod runs still (a Job may say Complete before the extra pods it stops are gone),
// or the master could not be reached. l's outputs are not what its Job wrote until then.
func (r *LineageReconciler) settleAttempts(ctx context.Context, l *datav1alpha1.Lineage) (settled bool, err error) {
	if r.Master == nil {
		return true, nil
	}
	// The attempts first, the pods after: a pod that sealed a file existed before, so it is
	// listed (held by its finalizer), or gone for good.
	attempts, err := r.attemptsOf(ctx, l)
	if err != nil {
		return false, err
	}
	pods := &corev1.PodList{}
	if err := r.reader().List(ctx, pods, client.InNamespace(l.Namespace), client.MatchingLabels{lineageLabel: l.Name}); err != nil {
		return false, fmt.Errorf("listing the pods of Lineage %s/%s: %w", l.Namespace, l.Name, err)
	}
	byUID := map[types.UID]*corev1.Pod{}
	for i := range pods.Items {
		byUID[pods.Items[i].UID] = &pods.Items[i]
	}
	unsettled := map[types.UID]bool{} // pods with an attempt left
	var errs []error
	for _, a := range attempts {
		uid := types.UID(a.usage.GetAttempt())
		pod := byUID[uid]
		outcome := outcomeOf(pod)
		if outcome == attemptRunning {
			unsettled[uid] = true // the pod may write more
			continue
		}
		if err := r.settleAttempt(ctx, l, a, pod, outcome == attemptPublish); err != nil {
			errs = append(errs, err)
			unsettled[uid] = true
		}
	}
	var ended []*corev1.Pod
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !unsettled[pod.UID] && outcomeOf(pod) != attemptRunning && controllerutil.ContainsFinalizer(pod, attemptFinalizer) {
			ended = append(ended, pod)
		}
	}
	late := false
	if len(ended) > 0 {
		var err error
		late, err = r.releaseEnded(ctx, l, ended)
		errs = append(errs, err)
	}
	return len(unsettled) == 0 && !late, errors.Join(errs...)
}

// releaseEnded lets go the pods that ended and have nothing left at the master. The attempts
// are read again: a pod that sealed its last files after they were read first, and ended before
// it was listed, is let go only once they are settled, on the next reconcile; late says there
// is such a pod.
func (r *LineageReconciler) releaseEnded(ctx context.Context, l *datav1alpha1.Lineage, ended []*corev1.Pod) (late bool, err error) {
	attempts, err := r.attemptsOf(ctx, l)
	if err != nil {
		return true, err
	}
	left := map[string]bool{}
	for _, a := range attempts {
		left[a.usage.GetAttempt()] = true
	}
	var errs []error
	for _, pod := range ended {
		if left[string(pod.UID)] {
			late = true
			continue
		}
		errs = append(errs, r.releasePod(ctx, pod))
	}
	return late, errors.Join(errs...)
}

// outputAttempt is an unsettled attempt of one of a Lineage's outputs.
type outputAttempt struct {
	output, dataset string // the output's name, and its name at the master
	usage           *masterpb.AttemptUsage
}

// attemptsOf are the attempts of l's outputs that the master holds unsettled.
func (r *LineageReconciler) attemptsOf(ctx context.Context, l *datav1alpha1.Lineage) ([]outputAttempt, error) {
	var attempts []outputAttempt
	for _, out := range l.Spec.Outputs {
		ds := &datav1alpha1.Dataset{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: out}, ds); err != nil {
			continue // reported by the Ready condition
		}
		name := datav1alpha1.MasterDatasetName(l.Namespace, out, string(ds.UID))
		cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
		usage, err := r.Master.GetDatasetUsage(cctx, &masterpb.GetDatasetUsageRequest{Name: name})
		cancel()
		switch {
		case status.Code(err) == codes.NotFound:
			continue // nothing written yet, or forgotten for a recomputation
		case err != nil:
			return nil, fmt.Errorf("reading the attempts of output %s at the master: %w", out, err)
		}
		for _, a := range usage.GetAttempts() {
			attempts = append(attempts, outputAttempt{output: out, dataset: name, usage: a})
		}
	}
	return attempts, nil
}

// settleAttempt publishes or discards the attempt a, written by pod (nil when it is gone), and
// says so in an event when its files are discarded.
func (r *LineageReconciler) settleAttempt(ctx context.Context, l *datav1alpha1.Lineage, a outputAttempt, pod *corev1.Pod, publish bool) error {
	cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	uid, out := a.usage.GetAttempt(), a.output
	resp, err := r.Master.SettleAttempt(cctx, &masterpb.SettleAttemptRequest{Dataset: a.dataset, Attempt: uid, Publish: publish})
	if err != nil {
		verb := "discarding"
		if publish {
			verb = "publishing"
		}
		return fmt.Errorf("%s the files pod %s wrote into output %s: %w", verb, podName(pod, uid), out, err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("output", out, "pod", podName(pod, uid), "files", resp.GetFiles())
	if publish {
		log.V(1).Info("published what a pod wrote")
		return nil
	}
	log.Info("discarded what a pod that did not succeed wrote")
	r.Recorder.Eventf(l, corev1.EventTypeNormal, EventAttemptDiscarded,
		"discarded %d files that pod %s wrote into %s before it %s; its Job's retry writes them again",
		resp.GetFiles(), podName(pod, uid), out, podEnd(pod))
	return nil
}

// releasePod lets pod go: what it wrote is settled.
func (r *LineageReconciler) releasePod(ctx context.Context, pod *corev1.Pod) error {
	return releaseAttemptPod(ctx, r.Client, pod)
}

// releaseAttemptPod takes the attempt finalizer off pod, and only it.
func releaseAttemptPod(ctx context.Context, c client.Client, pod *corev1.Pod) error {
	patch := client.MergeFromWithOptions(pod.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(pod, attemptFinalizer)
	if err := c.Patch(ctx, pod, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("letting pod %s/%s go: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// ReleaseAllAttemptPods lets go every pod, in every namespace, that still waits for the
// operator to settle what it wrote (the attempt finalizer), and returns how many it let go.
// The chart runs it before Helm uninstalls the operator (`operator --release-attempts-and-exit`,
// a pre-delete hook): nothing would settle them afterwards, and a deleted one would stay
// Terminating. What such a pod wrote is not published; the master goes with the release.
func ReleaseAllAttemptPods(ctx context.Context, c client.Client) (int, error) {
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.HasLabels{lineageLabel}); err != nil {
		return 0, fmt.Errorf("listing the pods of Lineages: %w", err)
	}
	released := 0
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !controllerutil.ContainsFinalizer(pod, attemptFinalizer) {
			continue
		}
		if err := releaseAttemptPod(ctx, c, pod); err != nil {
			errs = append(errs, err)
			continue
		}
		released++
	}
	return released, errors.Join(errs...)
}

// releaseOrphanedPods lets go the pods of a Lineage that was deleted: nothing settles what
// they write any more. It says whether any was left to the garbage collector, which deletes
// the Jobs' pods after the Lineage, so that the caller looks again.
func (r *LineageReconciler) releaseOrphanedPods(ctx context.Context, key types.NamespacedName) (left bool, err error) {
	pods := &corev1.PodList{}
	if err := r.reader().List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingLabels{lineageLabel: key.Name}); err != nil {
		return false, fmt.Errorf("listing the pods of deleted Lineage %s: %w", key, err)
	}
	var errs []error
	for i := range pods.Items {
		if controllerutil.ContainsFinalizer(&pods.Items[i], attemptFinalizer) {
			errs = append(errs, r.releasePod(ctx, &pods.Items[i]))
		}
	}
	return len(pods.Items) > 0, errors.Join(errs...)
}

func podName(pod *corev1.Pod, uid string) string {
	if pod == nil {
		return "(gone, UID " + uid + ")"
	}
	return pod.Name
}

func podEnd(pod *corev1.Pod) string {
	switch {
	case pod == nil:
		return "was deleted"
	case pod.Status.Phase == corev1.PodFailed && pod.Status.Reason != "":
		return "failed (" + pod.Status.Reason + ")"
	case pod.Status.Phase == corev1.PodFailed:
		return "failed"
	}
	return "was deleted"
}
