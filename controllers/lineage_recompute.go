package controllers

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

// Reasons of a Lineage's Recomputing condition.
const (
	ReasonRecomputing          = "Recomputing"
	ReasonWaitingForLostInputs = "WaitingForLostInputs"
	ReasonRecomputationLimit   = "RecomputationLimit"
	ReasonRecomputationFailed  = "RecomputationFailed"
	ReasonNothingLost          = "NothingLost"
	ReasonPriorityInherited    = "PriorityInherited"
)

// DefaultRecomputeClass is the PriorityClass recomputation Jobs start at (the chart's).
const DefaultRecomputeClass = "strata-recompute-lowest"

// +kubebuilder:rbac:groups=scheduling.k8s.io,resources=priorityclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// recomputationLabel carries the number of a recomputation Job, 1 for the first.
const recomputationLabel = "data.strata.dev/recomputation"

// recompute runs a Job that writes l's outputs again when one is lost (Tachyon §5): only once
// every input is available, so that a chain is recomputed parents first and no Job holds
// resources while it waits; at the lowest PriorityClass, raised to the highest priority of the
// pods that wait for the lost data (the Job is recreated with it while its pod is still
// pending); at most spec.maxRecomputations times. It returns the Recomputing condition.
//
// What runs and how many were made is read from the Jobs themselves, uncached, never from the
// status: a status read from the cache may be older than the last Job made, and trusting it
// would make a second Job for one loss.
func (r *LineageReconciler) recompute(ctx context.Context, l *datav1alpha1.Lineage, ns *namespace) (metav1.Condition, error) {
	cond := metav1.Condition{Type: datav1alpha1.ConditionRecomputing, Status: metav1.ConditionFalse, ObservedGeneration: l.Generation}
	made, counted, active, last, err := r.recomputeJobs(ctx, l)
	if err != nil {
		return cond, err
	}
	l.Status.Recomputations = made
	l.Status.ActiveRecomputation = nil
	if len(active) > 0 {
		return r.followRecomputation(ctx, l, ns, active)
	}
	if len(last) > 0 && failed(last) {
		// What a recomputation that failed was to write is missing: the master let go of it first.
		markLost(l, r.rewritten(l, last))
	}
	var lost []string
	for _, o := range l.Status.Outputs {
		if o.State == datav1alpha1.OutputLost || o.State == datav1alpha1.OutputRecomputing {
			lost = append(lost, o.Name)
		}
	}
	switch {
	case len(lost) == 0:
		cond.Reason, cond.Message = ReasonNothingLost, "every written output has a live copy or a checkpoint"
		return cond, nil
	case counted >= l.Spec.MaxRecomputations:
		cond.Reason = ReasonRecomputationLimit
		cond.Message = fmt.Sprintf("%s lost, and %d recomputations were made already (spec.maxRecomputations): not trying again; "+
			"raise spec.maxRecomputations to try again", strings.Join(lost, ", "), counted)
		if len(last) > 0 && failed(last) {
			cond.Message += fmt.Sprintf("; the last failed: see `kubectl logs job/%s`", failedJob(last).Name)
		}
		return cond, nil
	}
	indexes, partial, err := r.lostPartitions(ctx, l, lost)
	if err != nil {
		return cond, err
	}
	if partial && len(last) > 0 {
		for _, i := range failedIndexes(last) {
			if !slices.Contains(indexes, i) {
				indexes = append(indexes, i)
			}
		}
		slices.Sort(indexes)
	}
	if !partial {
		indexes = nil
	}
	// A Narrow Lineage's rerun reads only the inputs of what it writes again.
	if waiting := r.missingInputs(ctx, l, ns, neededInputs(l, outputsOf(l, indexes))); len(waiting) > 0 {
		cond.Reason = ReasonWaitingForLostInputs
		cond.Message = fmt.Sprintf("%s lost; recomputing once inputs %s are there again", strings.Join(lost, ", "), strings.Join(waiting, ", "))
		return cond, nil
	}

	class, err := r.inheritedClass(ctx, l.Namespace, r.awaiting(ctx, l.Namespace, ns, lost))
	if err != nil {
		return cond, err
	}
	// Created suspended, then the master lets go of what they write, then they run: from the
	// moment this Lineage decides to recompute, a Job says so to the Lineages that read its
	// outputs (see missingInputs), and none writes before the master let go of the old files.
	jobs, err := r.createRecomputation(ctx, l, made+1, class, indexes)
	if err != nil {
		return cond, err
	}
	if err := r.release(ctx, l, jobs); err != nil {
		return cond, err
	}
	l.Status.Recomputations = made + 1
	l.Status.ActiveRecomputation = recomputationStatus(jobs)
	markRecomputing(l, r.rewritten(l, jobs))
	what := strings.Join(lost, ", ")
	if len(indexes) > 0 {
		what += fmt.Sprintf(" (the partitions of completion indexes %v)", indexes)
	}
	r.Recorder.Eventf(l, corev1.EventTypeWarning, ReasonRecomputing, "%s lost: recomputing with Job %s at PriorityClass %s",
		what, jobNames(jobs), class)
	cond.Status, cond.Reason = metav1.ConditionTrue, ReasonRecomputing
	cond.Message = fmt.Sprintf("Job %s recomputes %s at PriorityClass %s", jobNames(jobs), what, class)
	return cond, nil
}

// recomputeJobs reads l's recomputation Jobs from the API server: how many recomputations were
// made, the Jobs of the one that runs (not finished, not being deleted: one Job, or one per lost
// partition), and the Jobs of the newest.
func (r *LineageReconciler) recomputeJobs(ctx context.Context, l *datav1alpha1.Lineage) (made, counted int32, active, last []*batchv1.Job, err error) {
	jobs := &batchv1.JobList{}
	if err := r.reader().List(ctx, jobs, client.InNamespace(l.Namespace), client.MatchingLabels{lineageLabel: l.Name}); err != nil {
		return 0, 0, nil, nil, fmt.Errorf("listing the recomputation Jobs of Lineage %s: %w", l.Name, err)
	}
	groups := map[int32][]*batchv1.Job{}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		n, err := strconv.ParseInt(job.Labels[recomputationLabel], 10, 32)
		if err != nil || !metav1.IsControlledBy(job, l) {
			continue // the first run, or not ours
		}
		made = max(made, int32(n))
		if job.DeletionTimestamp.IsZero() {
			groups[int32(n)] = append(groups[int32(n)], job)
		}
	}
	// A recomputation whose pod was disrupted does not count against spec.maxRecomputations:
	// it comes back, as the next, for what its program did not do.
	counted = made
	for _, jobs := range groups {
		if slices.ContainsFunc(jobs, disrupted) {
			counted--
		}
	}
	last = groups[made]
	for _, job := range last {
		if jobFinished(job) == "" {
			return made, counted, last, last, nil
		}
	}
	return made, counted, nil, last, nil
}

// disrupted says whether a recomputation Job ended because one of its pods was disrupted
// (preempted, evicted, its node lost), not by its program (see onDisruptions).
func disrupted(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue && c.Reason == batchv1.JobReasonPodFailurePolicy &&
			strings.Contains(c.Message, string(corev1.DisruptionTarget)) {
			return true
		}
	}
	return false
}

// failed says whether a Job of a recomputation failed.
func failed(jobs []*batchv1.Job) bool { return failedJob(jobs) != nil }

func failedJob(jobs []*batchv1.Job) *batchv1.Job {
	for _, job := range jobs {
		if jobFinished(job) == batchv1.JobFailed {
			return job
		}
	}
	return nil
}

// jobNames lists the names of jobs for messages.
func jobNames(jobs []*batchv1.Job) string {
	names := make([]string, len(jobs))
	for i, job := range jobs {
		names[i] = job.Name
	}
	return strings.Join(names, ", ")
}

// recomputationStatus describes the running recomputation made of jobs.
func recomputationStatus(jobs []*batchv1.Job) *datav1alpha1.RecomputationStatus {
	first := jobs[0]
	st := &datav1alpha1.RecomputationStatus{JobName: first.Name, PriorityClassName: first.Spec.Template.Spec.PriorityClassName,
		StartTime: first.CreationTimestamp}
	for _, job := range jobs {
		if i, ok := jobIndex(job); ok {
			st.Indexes = append(st.Indexes, i)
		}
	}
	slices.Sort(st.Indexes)
	return st
}

// jobFinished is JobComplete or JobFailed once job ended, "" before.
func jobFinished(job *batchv1.Job) batchv1.JobConditionType {
	for _, c := range job.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
			return c.Type
		}
	}
	return ""
}

// followRecomputation reports the running recomputation, and recreates a Job of it with a
// higher class when a pod of higher priority waits for the data and the Job's pods have no node
// yet.
func (r *LineageReconciler) followRecomputation(ctx context.Context, l *datav1alpha1.Lineage, ns *namespace, jobs []*batchv1.Job) (metav1.Condition, error) {
	if err := r.release(ctx, l, jobs); err != nil {
		// Made by a reconcile that could not let go of the old files, or not let every Job run.
		return metav1.Condition{}, err
	}
	l.Status.ActiveRecomputation = recomputationStatus(jobs)
	rewritten := r.rewritten(l, jobs)
	markRecomputing(l, rewritten)
	current := l.Status.ActiveRecomputation.PriorityClassName
	cond := metav1.Condition{Type: datav1alpha1.ConditionRecomputing, Status: metav1.ConditionTrue, Reason: ReasonRecomputing,
		ObservedGeneration: l.Generation, Message: fmt.Sprintf("Job %s recomputes the lost outputs at PriorityClass %s", jobNames(jobs), current)}

	// Priority inheritance: a pod's priority cannot change, so a Job whose pods all still wait
	// for room is recreated with the higher class; one that runs is left alone.
	class, err := r.inheritedClass(ctx, l.Namespace, r.awaiting(ctx, l.Namespace, ns, rewritten))
	if err != nil {
		return cond, err
	}
	var recreated []*batchv1.Job
	for i, job := range jobs {
		if jobFinished(job) != "" || class == job.Spec.Template.Spec.PriorityClassName {
			continue
		}
		higher, err := r.higherClass(ctx, class, job.Spec.Template.Spec.PriorityClassName)
		if err != nil {
			return cond, err
		}
		if !higher {
			continue
		}
		started, err := r.jobStarted(ctx, job)
		if err != nil {
			return cond, err
		}
		if started {
			continue
		}
		if err := r.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return cond, fmt.Errorf("deleting Job %s to raise its priority: %w", job.Name, err)
		}
		n, _ := strconv.ParseInt(job.Labels[recomputationLabel], 10, 32)
		var index *int32
		if i, ok := jobIndex(job); ok {
			index = &i
		}
		replacement, err := r.createRecomputeJob(ctx, l, int32(n), class, false, index) // the old files are let go already
		if err != nil {
			return cond, err
		}
		jobs[i] = replacement
		recreated = append(recreated, replacement)
	}
	if len(recreated) == 0 {
		return cond, nil
	}
	l.Status.ActiveRecomputation = recomputationStatus(jobs)
	r.Recorder.Eventf(l, corev1.EventTypeNormal, ReasonPriorityInherited,
		"a pod of PriorityClass %s waits for the lost data: recreated the pending recomputation as Job %s with that class", class, jobNames(recreated))
	cond.Message = fmt.Sprintf("Job %s recomputes the lost outputs at PriorityClass %s, inherited from a pod that waits for them", jobNames(jobs), class)
	return cond, nil
}

// markRecomputing shows outputs as being recomputed.
func markRecomputing(l *datav1alpha1.Lineage, outputs []string) {
	markOutputs(l, outputs, datav1alpha1.OutputRecomputing)
}

// markLost shows outputs as lost.
func markLost(l *datav1alpha1.Lineage, outputs []string) {
	markOutputs(l, outputs, datav1alpha1.OutputLost)
}

func markOutputs(l *datav1alpha1.Lineage, outputs []string, state datav1alpha1.OutputState) {
	for i := range l.Status.Outputs {
		if contains(outputs, l.Status.Outputs[i].Name) {
			l.Status.Outputs[i].State = state
		}
	}
}

// forgetOutput makes the master forget the files of an output Dataset.
func (r *LineageReconciler) forgetOutput(ctx context.Context, namespace, name string) error {
	ds := &datav1alpha1.Dataset{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ds); err != nil {
		return client.IgnoreNotFound(err)
	}
	return forgetAtMaster(ctx, r.Master, datav1alpha1.MasterDatasetName(namespace, name, string(ds.UID)))
}

// inheritedClass is the PriorityClass a recomputation runs at: the highest of the pods of
// namespace that mount one of the Datasets awaiting it (its outputs, and what is lost
// downstream of them: priority inheritance is transitive, Tachyon §5) and are not finished, if
// it is above the recomputation class; the recomputation class otherwise.
func (r *LineageReconciler) inheritedClass(ctx context.Context, namespace string, awaiting []string) (string, error) {
	base := r.RecomputeClass
	if base == "" {
		base = DefaultRecomputeClass
	}
	pods := &corev1.PodList{}
	if err := r.reader().List(ctx, pods, client.InNamespace(namespace)); err != nil {
		return "", fmt.Errorf("listing the pods of %s that wait for lost data: %w", namespace, err)
	}
	bestPriority, err := r.priorityOf(ctx, base)
	if err != nil {
		return "", err
	}
	best := base
	for _, pod := range pods.Items {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.Labels[recomputationLabel] != "" ||
			pod.Spec.PriorityClassName == "" || pod.Spec.Priority == nil || !mountsAny(&pod, awaiting) {
			continue
		}
		if *pod.Spec.Priority > bestPriority {
			best, bestPriority = pod.Spec.PriorityClassName, *pod.Spec.Priority
		}
	}
	return best, nil
}

// mountsAny says whether pod mounts the claim of one of the Datasets (a Dataset's claim has its name).
func mountsAny(pod *corev1.Pod, datasets []string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && contains(datasets, v.PersistentVolumeClaim.ClaimName) {
			return true
		}
	}
	return false
}

// priorityOf is the value of a PriorityClass; a class that does not exist counts as 0.
func (r *LineageReconciler) priorityOf(ctx context.Context, name string) (int32, error) {
	pc := &schedulingv1.PriorityClass{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, pc); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("reading PriorityClass %s: %w", name, err)
	}
	return pc.Value, nil
}

func (r *LineageReconciler) higherClass(ctx context.Context, a, b string) (bool, error) {
	pa, err := r.priorityOf(ctx, a)
	if err != nil {
		return false, err
	}
	pb, err := r.priorityOf(ctx, b)
	return pa > pb, err
}

// jobStarted says whether a pod of job got a node.
func (r *LineageReconciler) jobStarted(ctx context.Context, job *batchv1.Job) (bool, error) {
	pods := &corev1.PodList{}
	if err := r.reader().List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingLabels{"job-name": job.Name}); err != nil {
		return false, fmt.Errorf("listing the pods of Job %s: %w", job.Name, err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			return true, nil
		}
	}
	return false, nil
}

// release lets the suspended Jobs of a recomputation run once the master let go of what they
// write: every output of l (a whole recomputation), or the files of the lost partitions, whose
// outputs are opened again (a partial one). The master lets go only while every Job of the
// recomputation is suspended: once one runs, it may have written files that must stay.
func (r *LineageReconciler) release(ctx context.Context, l *datav1alpha1.Lineage, jobs []*batchv1.Job) error {
	suspended := 0
	for _, job := range jobs {
		if job.Spec.Suspend != nil && *job.Spec.Suspend {
			suspended++
		}
	}
	if suspended == 0 {
		return nil
	}
	if suspended == len(jobs) {
		var indexes []int32
		for _, job := range jobs {
			if i, ok := jobIndex(job); ok {
				indexes = append(indexes, i)
			}
		}
		if len(indexes) > 0 {
			if err := r.releasePartitions(ctx, l, indexes); err != nil {
				return err
			}
		} else {
			for _, out := range l.Spec.Outputs {
				if err := r.forgetOutput(ctx, l.Namespace, out); err != nil {
					return err
				}
			}
		}
	}
	// Forgetting an output forgets how it is written: said again before a pod writes it.
	if err := r.setRecovery(ctx, l); err != nil {
		return fmt.Errorf("before recomputing Lineage %s/%s: %w", l.Namespace, l.Name, err)
	}
	for _, job := range jobs {
		if job.Spec.Suspend == nil || !*job.Spec.Suspend {
			continue
		}
		before := job.DeepCopy()
		job.Spec.Suspend = ptr.To(false)
		if err := r.Client.Patch(ctx, job, client.MergeFrom(before)); err != nil {
			return fmt.Errorf("letting recomputation Job %s run: %w", job.Name, err)
		}
	}
	return nil
}

// createRecomputation creates the Jobs of the n-th recomputation of l at class, suspended: one
// per index when indexes are given (the lost partitions of an Indexed Job), else one that runs
// the whole template. If one cannot be created, those created are deleted again.
func (r *LineageReconciler) createRecomputation(ctx context.Context, l *datav1alpha1.Lineage, n int32, class string, indexes []int32) ([]*batchv1.Job, error) {
	if len(indexes) == 0 {
		job, err := r.createRecomputeJob(ctx, l, n, class, true, nil)
		if err != nil {
			return nil, err
		}
		return []*batchv1.Job{job}, nil
	}
	var jobs []*batchv1.Job
	for _, index := range indexes {
		job, err := r.createRecomputeJob(ctx, l, n, class, true, &index)
		if err != nil {
			for _, made := range jobs {
				if derr := r.Client.Delete(ctx, made, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(derr) != nil {
					ctrl.LoggerFrom(ctx).Error(derr, "deleting a Job of a recomputation that could not be made whole", "job", made.Name)
				}
			}
			return nil, err
		}
		jobs = append(jobs, job)
	}
	return jobs, nil
}

// createRecomputeJob creates a Job of the n-th recomputation of l at class, suspended if asked:
// the template's Job, or, for index, the one completion index of it.
func (r *LineageReconciler) createRecomputeJob(ctx context.Context, l *datav1alpha1.Lineage, n int32, class string, suspended bool, index *int32) (*batchv1.Job, error) {
	// A recomputation whose pod is disrupted ends; the next one lets go of what that pod wrote
	// (the pod that replaced it would find the files it sealed before it was killed).
	job, err := r.jobFromTemplate(l, batchv1.PodFailurePolicyActionFailJob)
	if err != nil {
		return nil, err
	}
	job.GenerateName = objectName(l.Name, fmt.Sprintf("-recompute-%d-", n))
	if index != nil {
		job.GenerateName = objectName(l.Name, fmt.Sprintf("-recompute-%d-index-%d-", n, *index))
		onlyIndex(job, *index)
	} else {
		// A whole recomputation is a run of the step to learn from; one index reads a part.
		r.noteInputs(ctx, l, job)
	}
	job.Labels[recomputationLabel] = strconv.Itoa(int(n))
	job.Spec.Suspend = ptr.To(suspended)
	job.Spec.Template.Spec.PriorityClassName = class
	job.Spec.Template.Spec.Priority = nil // set by admission from the class
	// Its pods too: a recomputation never inherits its own pods' class (inheritedClass).
	job.Spec.Template.Labels[recomputationLabel] = strconv.Itoa(int(n))
	avoidNodes(&job.Spec.Template.Spec, r.lostNodes(ctx))
	if err := r.Client.Create(ctx, job); err != nil {
		return nil, fmt.Errorf("creating a recomputation Job for Lineage %s/%s: %w", l.Namespace, l.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("created a recomputation Job", "job", job.Name, "priorityClass", class, "index", index)
	return job, nil
}

// lostNodes are the nodes whose workers the master holds lost, none alive (workers of TierPools
// deleted since stay lost on nodes that are well). The master finds a stopped node before the
// node controller marks it NotReady, so the scheduler would still place a recomputation there,
// where it waits for a node that may never come back. Without an answer from the master,
// nothing is avoided.
func (r *LineageReconciler) lostNodes(ctx context.Context) []string {
	if r.Master == nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	resp, err := r.Master.ListWorkers(cctx, &masterpb.ListWorkersRequest{StaleOk: true})
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("cannot list the workers; the recomputation may be placed on a lost node", "error", err.Error())
		return nil
	}
	return lostNodesOf(resp.GetWorkers())
}

// lostNodesOf are the nodes of workers that have a lost worker and no live one, sorted.
func lostNodesOf(workers []*masterpb.Worker) []string {
	lost, alive := map[string]bool{}, map[string]bool{}
	for _, w := range workers {
		switch w.GetState() {
		case masterpb.WorkerState_WORKER_STATE_LOST:
			lost[w.GetNode()] = true
		case masterpb.WorkerState_WORKER_STATE_ALIVE:
			alive[w.GetNode()] = true
		}
	}
	var nodes []string
	for node := range lost {
		if node != "" && !alive[node] {
			nodes = append(nodes, node)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// avoidNodes keeps the pods of spec off nodes, whatever node affinity they already require: a
// required node affinity is a union of terms, so the exclusion joins each term.
func avoidNodes(spec *corev1.PodSpec, nodes []string) {
	if len(nodes) == 0 {
		return
	}
	notIn := corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: nodes}
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	required := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if required == nil || len(required.NodeSelectorTerms) == 0 {
		spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{notIn}}},
		}
		return
	}
	for i := range required.NodeSelectorTerms {
		required.NodeSelectorTerms[i].MatchExpressions = append(required.NodeSelectorTerms[i].MatchExpressions, notIn)
	}
}

// reader reads what the operator does not cache: pods of tenants' namespaces.
func (r *LineageReconciler) reader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}
