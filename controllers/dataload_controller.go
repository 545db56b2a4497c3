package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/humanize"
)

// SelectionHeld is what a node holds of the files a DataLoad selects.
type SelectionHeld struct {
	// Files and Bytes are the selected files and their size; HeldFiles are those every block
	// of which the node holds, HeldBytes the bytes of the selected blocks it holds.
	Files, Bytes, HeldFiles, HeldBytes int64
}

// LoadNodes is what a DataLoad asks of a TierPool's workers (WorkerSyncs).
type LoadNodes interface {
	// Nodes are the nodes of pool that run a live worker, in order.
	Nodes(ctx context.Context, pool string) ([]string, error)
	// Held is what the pool's worker on node holds of the files of Dataset uid that sel
	// selects; mounted is false when the worker does not mount the Dataset, whose selection it
	// then cannot see.
	Held(ctx context.Context, pool, node, uid string, sel *workerpb.Selection) (held SelectionHeld, mounted bool, err error)
}

const (
	// dataLoadLabel names a DataLoad's Jobs, and dataLoadRunLabel their run.
	dataLoadLabel    = "data.strata.dev/dataload"
	dataLoadRunLabel = "data.strata.dev/dataload-run"
	// dataLoadNodeAnnotation is the node a DataLoad's Job loads onto, and
	// dataLoadGenerationAnnotation the generation of the spec it loads.
	dataLoadNodeAnnotation       = "data.strata.dev/dataload-node"
	dataLoadGenerationAnnotation = "data.strata.dev/dataload-generation"
	// dataLoadRefresh is how often the progress of a run is counted again while it loads, and
	// dataLoadRecheck how often after it ended (eviction may take what it loaded).
	dataLoadRefresh = 5 * time.Second
	dataLoadRecheck = time.Minute
)

// DataLoadReconciler runs DataLoads: one Job per chosen node per run, pinned to the node, that
// reads the selected files through the Dataset's claim, and the progress each node's worker
// counts in its tiers.
type DataLoadReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// WorkerImage runs the loads (`worker preload`); without it, no DataLoad can run.
	WorkerImage WorkerImage
	// Nodes are the pools' workers; nil (the operator runs no master) runs no DataLoad.
	Nodes LoadNodes
	// Now is the clock of schedules; nil is time.Now.
	Now func() time.Time
	// Refresh, if set, is how often progress is counted again, during runs and after them
	// (by default every 5 seconds while a run loads, every minute after).
	Refresh time.Duration
}

// +kubebuilder:rbac:groups=data.strata.dev,resources=dataloads,verbs=get;list;watch
// +kubebuilder:rbac:groups=data.strata.dev,resources=dataloads/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;delete

// Reconcile starts a DataLoad's runs when they are due and says how far the last one got.
func (r *DataLoadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	dl := &datav1alpha1.DataLoad{}
	if err := r.Client.Get(ctx, req.NamespacedName, dl); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !dl.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // its Jobs go with it
	}
	before := dl.Status.DeepCopy()
	result, err := r.reconcile(ctx, dl)
	dl.Status.ObservedGeneration = dl.Generation
	if !apiequality.Semantic.DeepEqual(*before, dl.Status) {
		if uerr := r.Client.Status().Update(ctx, dl); uerr != nil {
			return ctrl.Result{}, errors.Join(err, fmt.Errorf("updating the status of DataLoad %s/%s: %w", dl.Namespace, dl.Name, uerr))
		}
	}
	return result, err
}

// reconcile moves dl's status on and says when to look again.
func (r *DataLoadReconciler) reconcile(ctx context.Context, dl *datav1alpha1.DataLoad) (ctrl.Result, error) {
	schedule, why := dataLoadSpecProblem(dl.Spec)
	if why != "" {
		r.pending(dl, datav1alpha1.ReasonInvalidSpec, why)
		return ctrl.Result{}, nil
	}
	if r.WorkerImage.Image == "" || r.Nodes == nil {
		r.pending(dl, datav1alpha1.ReasonLoadNotAvailable,
			"the operator runs without a worker image (--worker-image) or a master, so it cannot load: pods still read the Dataset, cold")
		return ctrl.Result{}, nil
	}
	ds := &datav1alpha1.Dataset{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: dl.Namespace, Name: dl.Spec.DatasetName}, ds)
	switch {
	case apierrors.IsNotFound(err):
		r.pending(dl, datav1alpha1.ReasonDatasetNotFound, fmt.Sprintf(
			"no Dataset %q in namespace %s: create it, or name another in spec.datasetName", dl.Spec.DatasetName, dl.Namespace))
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("reading Dataset %s/%s: %w", dl.Namespace, dl.Spec.DatasetName, err)
	case !ds.ReadsStores():
		r.pending(dl, datav1alpha1.ReasonNotLoadable, fmt.Sprintf(
			"Dataset %s is a Lineage's output: its pods write it into the cache; load Datasets read from an under-store", ds.Name))
		return ctrl.Result{}, nil
	case ds.Status.Phase != datav1alpha1.DatasetReady && ds.Status.Phase != datav1alpha1.DatasetDegraded:
		r.pending(dl, datav1alpha1.ReasonDatasetNotReady, fmt.Sprintf(
			"Dataset %s is %s, not Ready: the load starts once pods can mount it (`kubectl -n %s describe dataset %s`)",
			ds.Name, cmp.Or(string(ds.Status.Phase), "new"), ds.Namespace, ds.Name))
		return ctrl.Result{}, nil
	}

	now := r.now()
	if err := r.adoptNewerRun(ctx, dl); err != nil {
		return ctrl.Result{}, err
	}
	jobs, err := r.runJobs(ctx, dl, dl.Status.Runs)
	if err != nil {
		return ctrl.Result{}, err
	}
	running := dl.Status.Runs > 0 && !runEnded(jobs, len(dl.Status.Nodes))
	switch {
	case dl.Status.Runs == 0, runGeneration(jobs, dl) != dl.Generation:
		// A new spec loads anew at once: the last run's Jobs go.
		return r.startRun(ctx, dl, ds, now)
	case schedule != nil && !running && dl.Status.NextRunTime != nil && !now.Before(dl.Status.NextRunTime.Time):
		return r.startRun(ctx, dl, ds, now)
	}
	return r.observeRun(ctx, dl, ds, jobs, schedule, now)
}

func (r *DataLoadReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// dataLoadSpecProblem parses the schedule and says what is wrong with spec, if anything.
func dataLoadSpecProblem(spec datav1alpha1.DataLoadSpec) (cron.Schedule, string) {
	if why := patternsProblem("spec.paths", spec.Paths); why != "" {
		return nil, why
	}
	if spec.Schedule == "" {
		return nil, ""
	}
	schedule, err := cron.ParseStandard(spec.Schedule)
	if err != nil {
		return nil, fmt.Sprintf("spec.schedule %q is not a cron expression of five fields (minute hour day-of-month month day-of-week): %v", spec.Schedule, err)
	}
	return schedule, ""
}

// pending says the load cannot go on, and why.
func (r *DataLoadReconciler) pending(dl *datav1alpha1.DataLoad, reason, message string) {
	if c := meta.FindStatusCondition(dl.Status.Conditions, datav1alpha1.ConditionLoaded); c == nil || c.Reason != reason {
		r.Recorder.Event(dl, corev1.EventTypeWarning, reason, message)
	}
	dl.Status.Phase = datav1alpha1.DataLoadPending
	r.setLoaded(dl, metav1.ConditionFalse, reason, message)
}

func (r *DataLoadReconciler) setLoaded(dl *datav1alpha1.DataLoad, st metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&dl.Status.Conditions, metav1.Condition{
		Type: datav1alpha1.ConditionLoaded, Status: st, Reason: reason, Message: message, ObservedGeneration: dl.Generation,
	})
}

// chooseNodes picks the nodes of a run: spec.nodes, each checked to run the pool's worker, or
// spec.nodeCount of the pool's nodes, those that hold the most of the Dataset first.
func (r *DataLoadReconciler) chooseNodes(ctx context.Context, dl *datav1alpha1.DataLoad, ds *datav1alpha1.Dataset) ([]string, string, error) {
	pool := ds.Spec.TierPoolName
	live, err := r.Nodes.Nodes(ctx, pool)
	if err != nil {
		return nil, "", fmt.Errorf("finding the nodes of TierPool %s: %w", pool, err)
	}
	if len(dl.Spec.Nodes) > 0 {
		for _, n := range dl.Spec.Nodes {
			if !slices.Contains(live, n) {
				return nil, fmt.Sprintf("node %s runs no live worker of TierPool %s, the Dataset's (nodes that do: %s)",
					n, pool, describeNodes(live)), nil
			}
		}
		return slices.Sorted(slices.Values(dl.Spec.Nodes)), "", nil
	}
	want := 1
	if dl.Spec.NodeCount != nil {
		want = int(*dl.Spec.NodeCount)
	}
	if len(live) < want {
		return nil, fmt.Sprintf("spec.nodeCount is %d, but TierPool %s has %d live workers (on %s)", want, pool, len(live), describeNodes(live)), nil
	}
	held := map[string]int64{}
	for _, u := range ds.Status.Nodes {
		held[u.Node] = u.Bytes
	}
	ranked := slices.Clone(live)
	slices.SortStableFunc(ranked, func(a, b string) int { return cmp.Compare(held[b], held[a]) })
	return slices.Sorted(slices.Values(ranked[:want])), "", nil
}

func describeNodes(nodes []string) string {
	if len(nodes) == 0 {
		return "none"
	}
	return strings.Join(nodes, ", ")
}

// startRun starts the next run: one Job per node, the last run's Jobs deleted.
func (r *DataLoadReconciler) startRun(ctx context.Context, dl *datav1alpha1.DataLoad, ds *datav1alpha1.Dataset, now time.Time) (ctrl.Result, error) {
	nodes, why, err := r.chooseNodes(ctx, dl, ds)
	if err != nil {
		return ctrl.Result{}, err
	}
	if why != "" {
		r.pending(dl, datav1alpha1.ReasonNoNodes, why)
		// Workers come and go without an event here: look again.
		return ctrl.Result{RequeueAfter: dataLoadRefresh}, nil
	}
	if err := r.deleteJobs(ctx, dl); err != nil {
		return ctrl.Result{}, err
	}
	run := dl.Status.Runs + 1
	var args []string
	for _, p := range dl.Spec.Paths {
		args = append(args, "--path", p)
	}
	if dl.Spec.MetadataOnly {
		args = append(args, "--metadata-only")
	}
	if p := percentOf(dl); p < 100 && !dl.Spec.MetadataOnly {
		pool := &datav1alpha1.TierPool{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: ds.Spec.TierPoolName}, pool); err != nil {
			return ctrl.Result{}, fmt.Errorf("reading TierPool %s for its block size: %w", ds.Spec.TierPoolName, err)
		}
		args = append(args, "--percent", strconv.Itoa(int(p)), "--block-size", strconv.FormatInt(blockSize(pool), 10))
	}
	status := make([]datav1alpha1.DataLoadNode, 0, len(nodes))
	for i, node := range nodes {
		labels := datasetLabels(ds)
		labels["app.kubernetes.io/component"] = "dataload"
		labels[dataLoadLabel] = dl.Name
		labels[dataLoadRunLabel] = strconv.Itoa(int(run))
		job := loadJob(r.WorkerImage, dl.Namespace, objectName(dl.Name, fmt.Sprintf("-%d-%d", run, i)), ds.Name, labels, args)
		job.Annotations = map[string]string{dataLoadNodeAnnotation: node, dataLoadGenerationAnnotation: strconv.FormatInt(dl.Generation, 10)}
		job.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}},
		}}
		if err := controllerutil.SetControllerReference(dl, job, r.Client.Scheme()); err != nil {
			return ctrl.Result{}, fmt.Errorf("owning Job %s/%s: %w", job.Namespace, job.Name, err)
		}
		if err := r.Client.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, fmt.Errorf("creating Job %s/%s: %w", job.Namespace, job.Name, err)
		}
		status = append(status, datav1alpha1.DataLoadNode{Node: node, JobName: job.Name})
	}
	dl.Status.Runs = run
	dl.Status.LastRunTime = &metav1.Time{Time: now}
	dl.Status.NextRunTime = nil
	dl.Status.Nodes = status
	dl.Status.Files, dl.Status.Bytes, dl.Status.Progress = datav1alpha1.LoadCount{}, datav1alpha1.LoadCount{}, ""
	dl.Status.Phase = datav1alpha1.DataLoadLoading
	what := "the selected files"
	if dl.Spec.MetadataOnly {
		what = "the selected files' metadata"
	}
	msg := fmt.Sprintf("run %d loads %s of Dataset %s onto %s", run, what, ds.Name, strings.Join(nodes, ", "))
	r.setLoaded(dl, metav1.ConditionFalse, datav1alpha1.ReasonLoading, msg)
	r.Recorder.Event(dl, corev1.EventTypeNormal, datav1alpha1.ReasonLoading, msg)
	return ctrl.Result{RequeueAfter: dataLoadRefresh}, nil
}

// deleteJobs deletes the Jobs of dl's earlier runs.
func (r *DataLoadReconciler) deleteJobs(ctx context.Context, dl *datav1alpha1.DataLoad) error {
	list := &batchv1.JobList{}
	if err := r.Client.List(ctx, list, client.InNamespace(dl.Namespace), client.MatchingLabels{dataLoadLabel: dl.Name}); err != nil {
		return fmt.Errorf("listing the Jobs of DataLoad %s/%s: %w", dl.Namespace, dl.Name, err)
	}
	for i := range list.Items {
		j := &list.Items[i]
		if !metav1.IsControlledBy(j, dl) {
			continue
		}
		if err := r.Client.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting Job %s/%s of an earlier run: %w", j.Namespace, j.Name, err)
		}
	}
	return nil
}

// percentOf is the share of each file dl loads: spec.percentOfEachFile, or 100.
func percentOf(dl *datav1alpha1.DataLoad) int32 {
	if p := dl.Spec.PercentOfEachFile; p != nil && !dl.Spec.MetadataOnly {
		return *p
	}
	return 100
}

// adoptNewerRun takes up a run whose Jobs exist but that dl's status does not show: a reconcile
// started it and wrote the status, and this one read dl from a cache that has not seen that
// write yet. The Jobs are the record of a run; without this, a stale read would start the same
// run again, deleting the Jobs that load.
func (r *DataLoadReconciler) adoptNewerRun(ctx context.Context, dl *datav1alpha1.DataLoad) error {
	list := &batchv1.JobList{}
	if err := r.Client.List(ctx, list, client.InNamespace(dl.Namespace), client.MatchingLabels{dataLoadLabel: dl.Name}); err != nil {
		return fmt.Errorf("listing the Jobs of DataLoad %s/%s: %w", dl.Namespace, dl.Name, err)
	}
	newest := dl.Status.Runs
	for i := range list.Items {
		j := &list.Items[i]
		run, err := strconv.Atoi(j.Labels[dataLoadRunLabel])
		if err == nil && metav1.IsControlledBy(j, dl) && j.DeletionTimestamp.IsZero() && int32(run) > newest {
			newest = int32(run)
		}
	}
	if newest == dl.Status.Runs {
		return nil
	}
	var nodes []datav1alpha1.DataLoadNode
	started := time.Time{}
	for i := range list.Items {
		j := &list.Items[i]
		if j.Labels[dataLoadRunLabel] != strconv.Itoa(int(newest)) || !metav1.IsControlledBy(j, dl) {
			continue
		}
		nodes = append(nodes, datav1alpha1.DataLoadNode{Node: j.Annotations[dataLoadNodeAnnotation], JobName: j.Name})
		if started.IsZero() || j.CreationTimestamp.Before(&metav1.Time{Time: started}) {
			started = j.CreationTimestamp.Time
		}
	}
	slices.SortFunc(nodes, func(a, b datav1alpha1.DataLoadNode) int { return cmp.Compare(a.Node, b.Node) })
	dl.Status.Runs, dl.Status.Nodes, dl.Status.NextRunTime = newest, nodes, nil
	dl.Status.LastRunTime = &metav1.Time{Time: started}
	dl.Status.Phase = datav1alpha1.DataLoadLoading
	return nil
}

// runGeneration is the generation of the spec the run of jobs loads; dl's own when the run has
// no Job left to say (deleted by hand: nothing to load again for).
func runGeneration(jobs map[string]*batchv1.Job, dl *datav1alpha1.DataLoad) int64 {
	for _, j := range jobs {
		if g, err := strconv.ParseInt(j.Annotations[dataLoadGenerationAnnotation], 10, 64); err == nil {
			return g
		}
	}
	return dl.Generation
}

// runJobs lists the Jobs of run, by node.
func (r *DataLoadReconciler) runJobs(ctx context.Context, dl *datav1alpha1.DataLoad, run int32) (map[string]*batchv1.Job, error) {
	list := &batchv1.JobList{}
	if err := r.Client.List(ctx, list, client.InNamespace(dl.Namespace),
		client.MatchingLabels{dataLoadLabel: dl.Name, dataLoadRunLabel: strconv.Itoa(int(run))}); err != nil {
		return nil, fmt.Errorf("listing the Jobs of DataLoad %s/%s: %w", dl.Namespace, dl.Name, err)
	}
	jobs := map[string]*batchv1.Job{}
	for i := range list.Items {
		j := &list.Items[i]
		if metav1.IsControlledBy(j, dl) {
			jobs[j.Annotations[dataLoadNodeAnnotation]] = j
		}
	}
	return jobs, nil
}

// jobOutcome is a finished Job's condition (Complete or Failed), or "" while it runs.
func jobOutcome(j *batchv1.Job) (batchv1.JobConditionType, string) {
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
			return c.Type, c.Message
		}
	}
	return "", ""
}

// runEnded says whether every one of a run's nodes Jobs finished (a Job deleted by hand counts
// as finished: nothing loads any more).
func runEnded(jobs map[string]*batchv1.Job, nodes int) bool {
	finished := nodes - len(jobs)
	for _, j := range jobs {
		if t, _ := jobOutcome(j); t != "" {
			finished++
		}
	}
	return finished >= nodes
}

// observeRun counts the last run's progress on its nodes and says where it stands.
func (r *DataLoadReconciler) observeRun(ctx context.Context, dl *datav1alpha1.DataLoad, ds *datav1alpha1.Dataset,
	jobs map[string]*batchv1.Job, schedule cron.Schedule, now time.Time) (ctrl.Result, error) {
	var failures, unknown []string
	var files, bytes datav1alpha1.LoadCount
	// counted is how many nodes said what they hold this time.
	counted := 0
	for i := range dl.Status.Nodes {
		n := &dl.Status.Nodes[i]
		if j := jobs[n.Node]; j != nil {
			if t, msg := jobOutcome(j); t == batchv1.JobFailed {
				failures = append(failures, fmt.Sprintf("the Job %s on node %s failed (%s): see `kubectl -n %s logs job/%s`", j.Name, n.Node, msg, dl.Namespace, j.Name))
			}
		}
		held, mounted, err := r.Nodes.Held(ctx, ds.Spec.TierPoolName, n.Node, string(ds.UID),
			&workerpb.Selection{Paths: dl.Spec.Paths, Percent: percentOf(dl)})
		if err == nil && mounted {
			counted++
		}
		switch {
		case err != nil:
			unknown = append(unknown, fmt.Sprintf("node %s: %v", n.Node, err))
		case !mounted:
			// The node does not mount the Dataset (its Job has not started, or ran long ago and
			// the mount went idle): it cannot say what it holds, which keeps the count it had.
		default:
			n.Files, n.Bytes = datav1alpha1.LoadCount{Done: held.HeldFiles, Total: held.Files}, datav1alpha1.LoadCount{Done: held.HeldBytes, Total: held.Bytes}
			if dl.Spec.MetadataOnly {
				// The files are there once the node shows them.
				n.Files.Done, n.Bytes.Done = held.Files, held.Bytes
			}
		}
		files.Done, files.Total = files.Done+n.Files.Done, files.Total+n.Files.Total
		bytes.Done, bytes.Total = bytes.Done+n.Bytes.Done, bytes.Total+n.Bytes.Total
	}
	dl.Status.Files, dl.Status.Bytes = files, bytes
	dl.Status.Progress = humanize.Percent(bytes.Done, bytes.Total)
	if dl.Spec.MetadataOnly {
		dl.Status.Progress = humanize.Percent(files.Done, files.Total)
	}
	ended := runEnded(jobs, len(dl.Status.Nodes))
	if ended && schedule != nil && dl.Status.NextRunTime == nil && dl.Status.LastRunTime != nil {
		dl.Status.NextRunTime = &metav1.Time{Time: schedule.Next(dl.Status.LastRunTime.Time)}
	}
	next := cmp.Or(r.Refresh, dataLoadRecheck)
	if !ended {
		next = cmp.Or(r.Refresh, dataLoadRefresh)
	}
	if dl.Status.NextRunTime != nil {
		next = min(next, max(dl.Status.NextRunTime.Sub(now), time.Second))
	}
	result := ctrl.Result{RequeueAfter: next}

	switch {
	case len(failures) > 0:
		r.finish(dl, datav1alpha1.DataLoadFailed, datav1alpha1.ReasonLoadFailed, strings.Join(failures, "; ")+
			"; the next run (a change of the spec, or the schedule) tries again", corev1.EventTypeWarning)
	case len(unknown) > 0 && !ended:
		dl.Status.Phase = datav1alpha1.DataLoadLoading
		r.setLoaded(dl, metav1.ConditionFalse, datav1alpha1.ReasonProgressUnknown, "cannot count the progress on every node: "+strings.Join(unknown, "; "))
	case !ended:
		dl.Status.Phase = datav1alpha1.DataLoadLoading
		r.setLoaded(dl, metav1.ConditionFalse, datav1alpha1.ReasonLoading, fmt.Sprintf("run %d: %s loaded", dl.Status.Runs, describeLoad(dl)))
	case len(unknown) > 0:
		r.finish(dl, datav1alpha1.DataLoadIncomplete, datav1alpha1.ReasonProgressUnknown,
			"the run ended, but not every node could say what it holds: "+strings.Join(unknown, "; "), corev1.EventTypeWarning)
	case files.Total == 0 && counted == len(dl.Status.Nodes):
		r.finish(dl, datav1alpha1.DataLoadFailed, datav1alpha1.ReasonNothingSelected, nothingSelected(dl, ds), corev1.EventTypeWarning)
	case allHeld(dl):
		if dl.Status.Phase != datav1alpha1.DataLoadLoaded {
			dl.Status.LastLoadedTime = &metav1.Time{Time: now}
		}
		r.finish(dl, datav1alpha1.DataLoadLoaded, datav1alpha1.ReasonLoaded,
			fmt.Sprintf("run %d: every selected file is on %s: %s", dl.Status.Runs, nodeList(dl), describeLoad(dl)), corev1.EventTypeNormal)
	default:
		r.finish(dl, datav1alpha1.DataLoadIncomplete, datav1alpha1.ReasonNotAllHeld, fmt.Sprintf(
			"run %d read every selected file, but the nodes hold %s: %s. The tiers may be smaller than the selection, or eviction took part of it since",
			dl.Status.Runs, describeLoad(dl), missingByNode(dl)), corev1.EventTypeWarning)
	}
	return result, nil
}

// nothingSelected says that a run found no file to load, and what to fix.
func nothingSelected(dl *datav1alpha1.DataLoad, ds *datav1alpha1.Dataset) string {
	if len(dl.Spec.Paths) == 0 {
		return fmt.Sprintf("run %d: Dataset %s has no file to load: check its source (spec.source) holds objects under its prefix", dl.Status.Runs, ds.Name)
	}
	return fmt.Sprintf("run %d: spec.paths %q select no file of Dataset %s: fix the patterns, which are relative to the Dataset's root (such as train/** or **/*.parquet)",
		dl.Status.Runs, dl.Spec.Paths, ds.Name)
}

// finish records where an ended run stands, with an event when that changes.
func (r *DataLoadReconciler) finish(dl *datav1alpha1.DataLoad, phase, reason, message, eventType string) {
	if dl.Status.Phase != phase {
		r.Recorder.Event(dl, eventType, reason, message)
	}
	dl.Status.Phase = phase
	st := metav1.ConditionFalse
	if phase == datav1alpha1.DataLoadLoaded {
		st = metav1.ConditionTrue
	}
	if dl.Status.NextRunTime != nil {
		message += fmt.Sprintf("; the next run is at %s", dl.Status.NextRunTime.UTC().Format(time.RFC3339))
	}
	r.setLoaded(dl, st, reason, message)
}

// allHeld says whether every node of the run holds all it was to load, and there was something
// to count.
func allHeld(dl *datav1alpha1.DataLoad) bool {
	if len(dl.Status.Nodes) == 0 {
		return false
	}
	for _, n := range dl.Status.Nodes {
		if n.Files.Total == 0 && n.Bytes.Total == 0 && n.Files.Done == 0 {
			// Nothing counted yet on this node, or nothing selected: said apart below.
			if dl.Status.Files.Total != 0 {
				return false
			}
			continue
		}
		if n.Files.Done != n.Files.Total || n.Bytes.Done != n.Bytes.Total {
			return false
		}
	}
	return true
}

func describeLoad(dl *datav1alpha1.DataLoad) string {
	return fmt.Sprintf("%d of %d files, %s of %s", dl.Status.Files.Done, dl.Status.Files.Total,
		humanize.Bytes(dl.Status.Bytes.Done), humanize.Bytes(dl.Status.Bytes.Total))
}

func nodeList(dl *datav1alpha1.DataLoad) string {
	names := make([]string, 0, len(dl.Status.Nodes))
	for _, n := range dl.Status.Nodes {
		names = append(names, n.Node)
	}
	return strings.Join(names, ", ")
}

func missingByNode(dl *datav1alpha1.DataLoad) string {
	var parts []string
	for _, n := range dl.Status.Nodes {
		if n.Bytes.Done != n.Bytes.Total || n.Files.Done != n.Files.Total {
			parts = append(parts, fmt.Sprintf("node %s lacks %s, of %d of the %d files", n.Node,
				humanize.Bytes(n.Bytes.Total-n.Bytes.Done), n.Files.Total-n.Files.Done, n.Files.Total))
		}
	}
	return strings.Join(parts, ", ")
}

// SetupWithManager registers the controller: DataLoads, their Jobs, and the Datasets they name.
func (r *DataLoadReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("dataload").
		For(&datav1alpha1.DataLoad{}).
		Owns(&batchv1.Job{}).
		Watches(&datav1alpha1.Dataset{}, handler.EnqueueRequestsFromMapFunc(r.loadsOfDataset)).
		Complete(r)
}

// loadsOfDataset maps a Dataset to the DataLoads of its namespace that name it.
func (r *DataLoadReconciler) loadsOfDataset(ctx context.Context, obj client.Object) []reconcile.Request {
	list := &datav1alpha1.DataLoadList{}
	if err := r.Client.List(ctx, list, client.InNamespace(obj.GetNamespace())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing DataLoads to map a Dataset's event")
		return nil
	}
	var reqs []reconcile.Request
	for _, dl := range list.Items {
		if dl.Spec.DatasetName == obj.GetName() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&dl)})
		}
	}
	return reqs
}
