package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/lineage"
	"github.com/strata-cache/strata/master/masterpb"
)

// Reasons of a Lineage's Ready condition.
const (
	ReasonInputNotFound     = "InputNotFound"
	ReasonOutputNotDeclared = "OutputNotDeclared"
	ReasonCycle             = "Cycle"
	ReasonWaitingForInputs  = "WaitingForInputs"
	// ReasonWaitingForOutputClaims: an output Dataset's claim is not mountable yet (not bound).
	ReasonWaitingForOutputClaims = "WaitingForOutputClaims"
	ReasonRunning                = "Running"
	ReasonWritten                = "Written"
	ReasonJobFailed              = "JobFailed"
	ReasonNotCheckpointed        = "NotCheckpointed"
	ReasonAllCheckpointed        = "AllCheckpointed"
)

// ReasonOutputForgotten is the event of an output that the master no longer knows.
const ReasonOutputForgotten = "OutputForgotten"

// recomputeRecheck is how often a running recomputation is looked at: whether a pod of higher
// priority now waits for its data (pods are not watched: the operator does not cache tenants'
// pods).
const recomputeRecheck = 10 * time.Second

// attemptRecheck is how often a Lineage with pods whose attempts are not settled is looked at
// (a pod's end changes its Job's status, which is watched, but a pod deleted with its Job, or
// one the master could not be told of, is not).
const attemptRecheck = 5 * time.Second

// lineageLabel marks the Jobs a Lineage runs.
const lineageLabel = "data.strata.dev/lineage"

// LineageReconciler checks a Lineage against the Datasets and Lineages of its namespace, runs
// its Job from the template once every input is there (inputs written by other Lineages once
// those are written), and reports the state of each output and how deep the chain of
// uncheckpointed outputs ending at it is.
//
// A bad Lineage (an input that does not exist, an output that does not name it, a cycle
// through other Lineages, a Job that fails) ends with a condition that says what to fix, and
// nothing is retried: the Job is created once, and a failed one is left for its logs.
type LineageReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// Master, when the operator runs one, tells which outputs are written, whole, and lost.
	Master LineageMaster
	// Partitions, when set (the master), lets a recomputation rerun only the completion indexes
	// of an Indexed Job whose partitions were lost (spec.partitions); without it, the whole Job.
	Partitions PartitionsMaster
	// Depth, when set, receives each Lineage's uncheckpointed depth.
	Depth *prometheus.GaugeVec
	// RecomputeClass is the PriorityClass recomputation Jobs start at; empty means
	// DefaultRecomputeClass.
	RecomputeClass string
	// APIReader reads the pods of tenants' namespaces, which the operator does not cache.
	APIReader client.Reader
	// Refresh is how often written outputs are looked up at the master; 0 means usageRefresh.
	Refresh time.Duration
	// RestorePending, when set, says whether the master is still to be restored from a backup:
	// until then, an output it does not know is not taken for lost.
	RestorePending func(context.Context) (bool, error)
}

// LineageMaster is the part of the master the Lineage reconciler talks to: the outputs'
// records, and the workers, whose lost nodes recomputations avoid.
type LineageMaster interface {
	DatasetMetadata
	ListWorkers(ctx context.Context, req *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error)
	SetDatasetRecovery(ctx context.Context, req *masterpb.SetDatasetRecoveryRequest) (*masterpb.Dataset, error)
	SettleAttempt(ctx context.Context, req *masterpb.SettleAttemptRequest) (*masterpb.SettleAttemptResponse, error)
}

// NewLineageDepthGauge registers the gauge of uncheckpointed lineage depth on reg.
func NewLineageDepthGauge(reg prometheus.Registerer) (*prometheus.GaugeVec, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "strata_operator_lineage_uncheckpointed_depth",
		Help: "Length of the longest chain of written but uncheckpointed outputs ending at a Lineage: how many Jobs a loss could rerun.",
	}, []string{"namespace", "lineage"})
	if err := reg.Register(g); err != nil {
		return nil, fmt.Errorf("registering the lineage depth gauge: %w", err)
	}
	return g, nil
}

// +kubebuilder:rbac:groups=data.strata.dev,resources=lineages,verbs=get;list;watch
// +kubebuilder:rbac:groups=data.strata.dev,resources=lineages/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=data.strata.dev,resources=lineages/finalizers,verbs=update
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create

// Reconcile brings one Lineage's Job and status up to date. The status this pass computed is
// written on every way out, even when a step fails after it.
func (r *LineageReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	l := &datav1alpha1.Lineage{}
	if err := r.Client.Get(ctx, req.NamespacedName, l); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		if r.Depth != nil {
			r.Depth.DeleteLabelValues(req.Namespace, req.Name)
		}
		left, err := r.releaseOrphanedPods(ctx, req.NamespacedName)
		if left && err == nil {
			return ctrl.Result{RequeueAfter: attemptRecheck}, nil
		}
		return ctrl.Result{}, err
	}
	before := l.DeepCopy()
	result, err := r.reconcileLineage(ctx, l)
	if !apiequality.Semantic.DeepEqual(before.Status, l.Status) {
		if perr := r.Client.Status().Patch(ctx, l, client.MergeFrom(before)); perr != nil {
			return ctrl.Result{}, errors.Join(err, fmt.Errorf("patching status of Lineage %s/%s: %w", l.Namespace, l.Name, perr))
		}
		r.recordTransition(before, l)
	}
	return result, err
}

// reconcileLineage runs l's Job when it can, follows its outputs, recomputes what is lost, and
// computes l's status; the caller writes it.
func (r *LineageReconciler) reconcileLineage(ctx context.Context, l *datav1alpha1.Lineage) (ctrl.Result, error) {
	ns, err := r.namespaceGraph(ctx, l.Namespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	replan, err := r.planPrefetch(ctx, l.Namespace, ns)
	if err != nil {
		// Prefetching only speeds the pipeline up: the Lineage runs without it.
		ctrl.LoggerFrom(ctx).Error(err, "planning the namespace's prefetches")
	}
	ready := checkLineage(l, ns)
	if ready != nil && (ready.Reason == ReasonInputNotFound || ready.Reason == ReasonOutputNotDeclared) {
		// The cache may not have seen yet a Dataset applied together with the Lineage: ask the
		// API server before saying it is missing.
		if fresh, err := r.datasetsOf(ctx, l.Namespace); err == nil {
			ns.datasets = fresh
			ready = checkLineage(l, ns)
		}
	}
	settled := true
	if ready == nil {
		job, waiting, err := r.ensureRunJob(ctx, l, ns)
		if err != nil {
			return ctrl.Result{}, err
		}
		ready = waiting
		if job != nil {
			ready = runCondition(l, job)
			var serr error
			if settled, serr = r.settleAttempts(ctx, l); serr != nil {
				ctrl.LoggerFrom(ctx).Info("cannot settle what the Lineage's pods wrote yet; trying again", "error", serr.Error())
			}
			if !settled && ready.Status == metav1.ConditionTrue {
				ready = notReady(ReasonPublishing, "Job %s succeeded; publishing what its pods wrote at the master", job.Name)
			}
		}
	}
	ready.ObservedGeneration = l.Generation
	meta.SetStatusCondition(&l.Status.Conditions, *ready)
	written := ready.Status == metav1.ConditionTrue
	complete := r.setOutputs(ctx, l, written)
	if written {
		recomputing, err := r.recompute(ctx, l, ns)
		if err != nil {
			return ctrl.Result{}, err
		}
		meta.SetStatusCondition(&l.Status.Conditions, recomputing)
		if l.Status.ActiveRecomputation == nil && settled {
			r.completeOutputs(ctx, l, complete)
		}
		if err := r.setRecovery(ctx, l); err != nil {
			ctrl.LoggerFrom(ctx).Info("cannot tell the master how readers of a lost output wait; trying again on the next reconcile", "error", err.Error())
		}
	}
	if err := r.recordRunTime(ctx, l); err != nil {
		ctrl.LoggerFrom(ctx).Info("cannot learn the step's run time yet; trying again on the next reconcile", "error", err.Error())
	}
	ns.lineages[l.Name] = l
	l.Status.UncheckpointedDepth = int32(ns.depth(l))
	meta.SetStatusCondition(&l.Status.Conditions, checkpointedCondition(l, ns))
	l.Status.ObservedGeneration = l.Generation
	if r.Depth != nil {
		r.Depth.WithLabelValues(l.Namespace, l.Name).Set(float64(l.Status.UncheckpointedDepth))
	}

	var result ctrl.Result
	switch {
	case !settled:
		// Pods are not watched (the operator does not cache tenants' pods): look again soon.
		result.RequeueAfter = attemptRecheck
	case l.Status.ActiveRecomputation != nil:
		// Pods that wait for the data may come with a higher priority: look again soon.
		result.RequeueAfter = recomputeRecheck
	case written && r.Master != nil:
		// Outputs may be lost or checkpointed meanwhile.
		result.RequeueAfter = cmp.Or(r.Refresh, usageRefresh)
	}
	if replan > 0 && (result.RequeueAfter == 0 || replan < result.RequeueAfter) {
		result.RequeueAfter = replan
	}
	return result, nil
}

// namespace is what a Lineage is checked against: the Datasets and Lineages of its namespace,
// and the pipeline they make.
type namespace struct {
	datasets map[string]*datav1alpha1.Dataset
	lineages map[string]*datav1alpha1.Lineage
	pipeline *lineage.Pipeline
}

// datasetsOf are the Datasets of a namespace as the API server has them now, by name.
func (r *LineageReconciler) datasetsOf(ctx context.Context, namespace string) (map[string]*datav1alpha1.Dataset, error) {
	list := &datav1alpha1.DatasetList{}
	if err := r.reader().List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing Datasets in %s: %w", namespace, err)
	}
	out := make(map[string]*datav1alpha1.Dataset, len(list.Items))
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

func (r *LineageReconciler) namespaceGraph(ctx context.Context, name string) (*namespace, error) {
	datasets := &datav1alpha1.DatasetList{}
	if err := r.Client.List(ctx, datasets, client.InNamespace(name)); err != nil {
		return nil, fmt.Errorf("listing Datasets in %s: %w", name, err)
	}
	lineages := &datav1alpha1.LineageList{}
	if err := r.Client.List(ctx, lineages, client.InNamespace(name)); err != nil {
		return nil, fmt.Errorf("listing Lineages in %s: %w", name, err)
	}
	ns := &namespace{datasets: map[string]*datav1alpha1.Dataset{}, lineages: map[string]*datav1alpha1.Lineage{}, pipeline: pipelineOf(lineages.Items)}
	for i := range datasets.Items {
		ns.datasets[datasets.Items[i].Name] = &datasets.Items[i]
	}
	for i := range lineages.Items {
		ns.lineages[lineages.Items[i].Name] = &lineages.Items[i]
	}
	return ns, nil
}

// awaiting are the Datasets that wait for outputs to be written again: outputs, and every
// Dataset downstream of them that is lost too, which its Lineage can recompute only after them.
// A pod that waits for any of them waits for outputs.
func (r *LineageReconciler) awaiting(ctx context.Context, namespace string, ns *namespace, outputs []string) []string {
	lost := func(dataset string) bool { return r.outputLost(ctx, namespace, ns, dataset) }
	return append(slices.Clone(outputs), ns.pipeline.Downstream(outputs, lost)...)
}

// outputLost says whether dataset is an output of a Lineage that has lost some of it: as the
// Lineage's status says, or, since a node's loss reaches every Lineage at once and a status may
// not say it yet, as the master says.
func (r *LineageReconciler) outputLost(ctx context.Context, namespace string, ns *namespace, dataset string) bool {
	producer, ok := ns.pipeline.Producer(dataset)
	if !ok || ns.lineages[producer] == nil {
		return false
	}
	switch state := outputState(ns.lineages[producer], dataset); state {
	case datav1alpha1.OutputLost, datav1alpha1.OutputRecomputing:
		return true
	default:
		// Pending too: the status read here may be older than the write (the cache lags), and an
		// output never written has nothing lost at the master anyway.
		st := outputStatus(ns.lineages[producer], dataset)
		r.outputUsage(ctx, namespace, dataset, &st)
		return st.State == datav1alpha1.OutputLost
	}
}

// pipelineOf is the pipeline of a namespace's Lineages.
func pipelineOf(lineages []datav1alpha1.Lineage) *lineage.Pipeline {
	steps := make([]lineage.Step, len(lineages))
	for i, l := range lineages {
		steps[i] = lineage.Step{Name: l.Name, Inputs: l.Spec.Inputs, Outputs: l.Spec.Outputs}
	}
	return lineage.NewPipeline(steps)
}

// cycle returns the Lineages of a cycle through l ("a → b → a"), or "" if l is on none.
func (ns *namespace) cycle(l *datav1alpha1.Lineage) string {
	return strings.Join(ns.pipeline.Cycle(l.Name), " → ")
}

// depth is the length of the longest chain of written, uncheckpointed outputs ending at l.
func (ns *namespace) depth(l *datav1alpha1.Lineage) int {
	g := ns.pipeline.Files(func(step, out string) bool {
		state := outputState(ns.lineages[step], out)
		// Outputs not written yet cannot be lost: they end every chain as a checkpoint does.
		return state == datav1alpha1.OutputCheckpointed || state == datav1alpha1.OutputPending || state == ""
	})
	deepest := 0
	for _, out := range l.Spec.Outputs {
		deepest = max(deepest, g.Depth(out))
	}
	return deepest
}

// notReady is a Ready condition that is False.
func notReady(reason, format string, args ...any) *metav1.Condition {
	return &metav1.Condition{Type: datav1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason,
		Message: fmt.Sprintf(format, args...)}
}

// ensureRunJob returns the Job that writes l's outputs the first time, creating it once every
// input is available and every output's claim can be mounted; until then it returns no Job and
// a Ready condition that says what it waits for. A Job of that name that l does not own is
// returned as it is, for runCondition to name.
func (r *LineageReconciler) ensureRunJob(ctx context.Context, l *datav1alpha1.Lineage, ns *namespace) (*batchv1.Job, *metav1.Condition, error) {
	job := &batchv1.Job{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: runJobName(l)}, job)
	switch {
	case apierrors.IsNotFound(err):
		if waiting := r.missingInputs(ctx, l, ns, l.Spec.Inputs); len(waiting) > 0 {
			return nil, notReady(ReasonWaitingForInputs, "waiting for inputs %s before running the Job", strings.Join(waiting, ", ")), nil
		}
		if waiting := unmountableOutputs(ns, l.Spec.Outputs); len(waiting) > 0 {
			return nil, notReady(ReasonWaitingForOutputClaims, "waiting for the claims of %s before running the Job, whose pods mount them",
				strings.Join(waiting, "; ")), nil
		}
		// Before any pod writes: its files must be sealed as its attempt's.
		if err := r.setRecovery(ctx, l); err != nil {
			return nil, nil, fmt.Errorf("before running Lineage %s/%s: %w", l.Namespace, l.Name, err)
		}
		job, err = r.createRunJob(ctx, l)
		return job, nil, err
	case err != nil:
		return nil, nil, fmt.Errorf("reading Job %s/%s: %w", l.Namespace, runJobName(l), err)
	}
	return job, nil, nil
}

// missingInputs are the inputs not available yet: a Dataset that is not Ready, or an output of
// a Lineage that has not written it, or that has lost some of it. Loss is asked of the master
// itself: the producer's status may not say it yet (a node's loss reaches every Lineage at
// once), and a child recomputed before its parent would read holes. inputs are those of l's
// inputs to check: all for a run, those a recomputation reads for one (neededInputs).
func (r *LineageReconciler) missingInputs(ctx context.Context, l *datav1alpha1.Lineage, ns *namespace, inputs []string) []string {
	var missing []string
	for _, in := range inputs {
		ds := ns.datasets[in]
		available := meta.IsStatusConditionTrue(ds.Status.Conditions, datav1alpha1.ConditionReady)
		if p, ok := ns.pipeline.Producer(in); ok && ds.Spec.Lineage != nil {
			producer := ns.lineages[p]
			state := outputState(producer, in)
			available = meta.IsStatusConditionTrue(producer.Status.Conditions, datav1alpha1.ConditionReady) &&
				state != datav1alpha1.OutputLost && state != datav1alpha1.OutputRecomputing
			if available {
				st := outputStatus(producer, in)
				r.outputUsage(ctx, l.Namespace, in, &st)
				_, _, active, _, err := r.recomputeJobs(ctx, producer)
				available = st.State != datav1alpha1.OutputLost && len(active) == 0 && err == nil
			}
		}
		if !available {
			missing = append(missing, in)
		}
	}
	return missing
}

// unmountableOutputs are the outputs whose claims pods cannot mount yet, each with why (its
// Dataset's Ready condition): a Job's pod made before its claims exist and are bound is put
// back by the scheduler with a growing back-off ("unbound immediate PersistentVolumeClaims"),
// which a Lineage applied together with its outputs would meet; one whose output cannot be
// served (no TierPool, no worker, no CSI driver) would wait in ContainerCreating, while the
// Lineage said Running.
func unmountableOutputs(ns *namespace, outputs []string) []string {
	var waiting []string
	for _, out := range outputs {
		ready := meta.FindStatusCondition(ns.datasets[out].Status.Conditions, datav1alpha1.ConditionReady)
		switch {
		case ready == nil:
			waiting = append(waiting, fmt.Sprintf("output %s (not served yet)", out))
		case ready.Status != metav1.ConditionTrue:
			waiting = append(waiting, fmt.Sprintf("output %s (%s)", out, ready.Message))
		}
	}
	return waiting
}

// runJobName is the name of the Job that writes a Lineage's outputs the first time.
func runJobName(l *datav1alpha1.Lineage) string {
	return objectName(l.Name, "-run")
}

// jobFromTemplate is a Job of l's template, labelled as l's and owned by it, in l's namespace,
// that does onDisruption with a pod that is disrupted (see onDisruptions).
func (r *LineageReconciler) jobFromTemplate(l *datav1alpha1.Lineage, onDisruption batchv1.PodFailurePolicyAction) (*batchv1.Job, error) {
	tmpl := l.Spec.Template.DeepCopy()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Labels: tmpl.Labels, Annotations: tmpl.Annotations},
		Spec:       tmpl.Spec,
	}
	if job.Labels == nil {
		job.Labels = map[string]string{}
	}
	job.Labels[lineageLabel] = l.Name
	// Its pods too, for the operator to find them and settle what each wrote; and they stay
	// until it has (lineage_attempts.go).
	pod := &job.Spec.Template.ObjectMeta
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[lineageLabel] = l.Name
	if !slices.Contains(pod.Finalizers, attemptFinalizer) {
		pod.Finalizers = append(pod.Finalizers, attemptFinalizer)
	}
	onDisruptions(&job.Spec, onDisruption)
	if err := controllerutil.SetControllerReference(l, job, r.Client.Scheme()); err != nil {
		return nil, fmt.Errorf("owning a Job of Lineage %s/%s: %w", l.Namespace, l.Name, err)
	}
	return job, nil
}

// onDisruptions makes a Job do action when one of its pods is disrupted (evicted from a lost
// node, preempted, drained) rather than count it as its program's failure: Ignore replaces the
// pod (a Lineage's first run must not fail for what its program did not do); FailJob ends the
// Job at once, for the operator to make a new one (a recomputation, whose next Job lets go of
// what the killed pod wrote first, and comes at the inherited priority; see disrupted). A pod
// failure policy needs pods that are never restarted in place; a template whose pods are is left
// as it is.
func onDisruptions(spec *batchv1.JobSpec, action batchv1.PodFailurePolicyAction) {
	if spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		return
	}
	rule := batchv1.PodFailurePolicyRule{
		Action:          action,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
	}
	if spec.PodFailurePolicy == nil {
		spec.PodFailurePolicy = &batchv1.PodFailurePolicy{}
	}
	// First, so that no rule of the template's fails the Job on a disruption before it.
	spec.PodFailurePolicy.Rules = append([]batchv1.PodFailurePolicyRule{rule}, spec.PodFailurePolicy.Rules...)
}

// createRunJob creates the Job of l's template, owned by l.
func (r *LineageReconciler) createRunJob(ctx context.Context, l *datav1alpha1.Lineage) (*batchv1.Job, error) {
	job, err := r.jobFromTemplate(l, batchv1.PodFailurePolicyActionIgnore)
	if err != nil {
		return nil, err
	}
	job.Name = runJobName(l)
	r.noteInputs(ctx, l, job)
	if err := r.Client.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating Job %s/%s: %w", job.Namespace, job.Name, err)
	}
	r.Recorder.Eventf(l, corev1.EventTypeNormal, ReasonRunning, "created Job %s to write %s", job.Name, strings.Join(l.Spec.Outputs, ", "))
	return job, nil
}

// setOutputs sets each output's state: Pending until the Job wrote it; then, from the master,
// InMemory while every block has a live copy, Lost when one has none, Checkpointed when all of
// it is in the under-store. It returns the outputs the master already knows to be complete.
func (r *LineageReconciler) setOutputs(ctx context.Context, l *datav1alpha1.Lineage, written bool) map[string]bool {
	complete := map[string]bool{}
	old := map[string]datav1alpha1.LineageOutputStatus{}
	for _, o := range l.Status.Outputs {
		old[o.Name] = o
	}
	l.Status.Outputs = nil
	for _, out := range l.Spec.Outputs {
		// What the master held is kept while the Lineage is not Ready (its Job's pods being
		// published again, an input gone for a while): a master that forgot the output meanwhile
		// is found out once it is Ready again.
		st := datav1alpha1.LineageOutputStatus{Name: out, State: datav1alpha1.OutputPending, Bytes: old[out].Bytes}
		if written {
			st = old[out]
			st.Name = out
			if st.State == "" || st.State == datav1alpha1.OutputPending {
				st.State = datav1alpha1.OutputInMemory
			}
			var forgotten bool
			complete[out], forgotten = r.outputUsage(ctx, l.Namespace, out, &st)
			if forgotten {
				r.Recorder.Eventf(l, corev1.EventTypeWarning, ReasonOutputForgotten,
					"the master no longer knows output %s (%d bytes when it last answered): its state was lost, as when every master replica "+
						"is replaced on emptyDir storage (master.persistence.size unset) or restored from a backup older than the output; "+
						"the output is lost and is recomputed", out, st.Bytes)
			}
		}
		l.Status.Outputs = append(l.Status.Outputs, st)
	}
	return complete
}

// completeOutputs tells the master that the outputs' writer finished, so that their mounts
// take no more changes: a pod that mounts an output after its Job (a reader that forgot
// readOnly, a second run of a step) finds it read-only instead of changing data that Lineages
// downstream have read. A recomputation forgets the outputs first, which opens them again. When
// the master cannot be reached, the next reconcile tries again. Outputs in complete (as this
// reconcile read them) are complete already.
func (r *LineageReconciler) completeOutputs(ctx context.Context, l *datav1alpha1.Lineage, complete map[string]bool) {
	if r.Master == nil {
		return
	}
	for _, out := range l.Spec.Outputs {
		st := outputStatus(l, out)
		if complete[out] || st.State == datav1alpha1.OutputLost {
			continue
		}
		ds := &datav1alpha1.Dataset{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: out}, ds); err != nil {
			continue // reported by the Ready condition
		}
		uid := string(ds.UID)
		cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
		err := completeAtMaster(cctx, r.Master, datav1alpha1.MasterDatasetName(l.Namespace, out, uid),
			datav1alpha1.MasterDatasetRoot(l.Namespace, out, uid), st.Bytes == 0)
		cancel()
		if err != nil {
			ctrl.LoggerFrom(ctx).Info("cannot mark an output complete at the master yet; it stays writable until then",
				"output", out, "error", err.Error())
		}
	}
}

// completeAtMaster marks the Dataset complete at the master, registering it first when the
// writer wrote nothing into it (empty), so that it stays empty. An output the master held bytes
// of and no longer knows is never registered so: it is lost (see notAtMaster), or waits for the
// master's restore, and registered empty and complete it would look written.
func completeAtMaster(ctx context.Context, master DatasetMetadata, name, root string, empty bool) error {
	ds, err := master.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name, StaleOk: true})
	switch {
	case err == nil && ds.GetComplete():
		return nil
	case status.Code(err) == codes.NotFound && !empty:
		return fmt.Errorf("the master does not know %s, which held files: not registering it empty", name)
	case status.Code(err) == codes.NotFound:
		if _, err := master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root}); err != nil {
			return fmt.Errorf("registering %s: %w", name, err)
		}
	case err != nil:
		return fmt.Errorf("reading %s: %w", name, err)
	}
	if _, err := master.CompleteDataset(ctx, name); err != nil {
		return fmt.Errorf("completing %s: %w", name, err)
	}
	return nil
}

// outputUsage updates st from the master's record of the output Dataset; without an answer it
// keeps what st says. It returns whether the master holds the Dataset complete, and whether
// the master forgot the output just now (see notAtMaster).
func (r *LineageReconciler) outputUsage(ctx context.Context, namespace, name string, st *datav1alpha1.LineageOutputStatus) (complete, forgotten bool) {
	if r.Master == nil {
		return false, false
	}
	ds := &datav1alpha1.Dataset{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ds); err != nil {
		return false, false
	}
	masterName := datav1alpha1.MasterDatasetName(namespace, name, string(ds.UID))
	cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	usage, err := r.Master.GetDatasetUsage(cctx, &masterpb.GetDatasetUsageRequest{Name: masterName, StaleOk: true})
	switch {
	case status.Code(err) == codes.NotFound:
		return false, r.notAtMaster(ctx, masterName, ds, st)
	case err != nil:
		ctrl.LoggerFrom(ctx).Info("cannot read an output's state from the master; keeping the last", "output", name, "error", err.Error())
		return false, false
	}
	st.CheckpointedBytes = usage.GetCheckpointedBytes()
	st.Replicas = int32(usage.GetMinCopies())
	st.Bytes = usage.GetTotalBytes()
	switch {
	case usage.GetLostFiles() > 0:
		// A file with neither a live copy nor a checkpoint: only a recomputation brings it back.
		// One without a live copy but with a checkpoint is read back from the under-store.
		st.State = datav1alpha1.OutputLost
	case usage.GetTotalBytes() > 0 && usage.GetCheckpointedBytes() == usage.GetTotalBytes():
		st.State = datav1alpha1.OutputCheckpointed
	case usage.GetCheckpointedBytes() > 0:
		st.State = datav1alpha1.OutputCheckpointing
	default:
		st.State = datav1alpha1.OutputInMemory
	}
	return usage.GetComplete(), false
}

// notAtMaster updates st for an output Dataset the master (as one replica answered) does not
// know. Usually nothing was written into it, or a recomputation let go of it (and says so
// itself): nothing to lose. But an output the master held bytes of has been forgotten, when the
// master's state was lost: st is then Lost, so that the output is recomputed instead of shown
// written and empty. That is decided only on the leader's word (a replica that answered may lag
// behind), and not while the master is still to be restored from a backup. It returns whether
// st became Lost so.
func (r *LineageReconciler) notAtMaster(ctx context.Context, masterName string, ds *datav1alpha1.Dataset, st *datav1alpha1.LineageOutputStatus) bool {
	held := st.Bytes > 0 && ds.DeletionTimestamp == nil &&
		st.State != datav1alpha1.OutputRecomputing && st.State != datav1alpha1.OutputPending
	if !held {
		st.State, st.Replicas, st.Bytes = datav1alpha1.OutputInMemory, 0, 0
		return false
	}
	if st.State == datav1alpha1.OutputLost {
		return false // found forgotten before
	}
	log := ctrl.LoggerFrom(ctx).WithValues("output", ds.Name)
	cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	if _, err := r.Master.GetDatasetUsage(cctx, &masterpb.GetDatasetUsageRequest{Name: masterName}); status.Code(err) != codes.NotFound {
		if err != nil {
			log.Info("cannot ask the master's leader whether it forgot an output; keeping its last state", "error", err.Error())
		}
		return false // the leader knows it (a lagging replica answered), or said nothing
	}
	if r.RestorePending != nil {
		pending, err := r.RestorePending(ctx)
		if err != nil || pending {
			log.Info("the master does not know an output it held, but is still to be restored from a backup; waiting for the restore",
				"bytes", st.Bytes, "error", fmt.Sprint(err))
			return false
		}
	}
	log.Info("the master forgot an output it held: it is lost", "bytes", st.Bytes)
	st.State, st.Replicas, st.CheckpointedBytes = datav1alpha1.OutputLost, 0, 0
	return true
}

// recordTransition turns a change of the Ready reason into an event.
func (r *LineageReconciler) recordTransition(before, after *datav1alpha1.Lineage) {
	was := meta.FindStatusCondition(before.Status.Conditions, datav1alpha1.ConditionReady)
	now := meta.FindStatusCondition(after.Status.Conditions, datav1alpha1.ConditionReady)
	if now == nil || (was != nil && was.Reason == now.Reason) || now.Reason == ReasonRunning {
		return // the Running event is the Job's creation
	}
	kind := corev1.EventTypeWarning
	if now.Status == metav1.ConditionTrue || now.Reason == ReasonWaitingForInputs || now.Reason == ReasonWaitingForOutputClaims {
		kind = corev1.EventTypeNormal
	}
	r.Recorder.Event(after, kind, now.Reason, now.Message)
}

// SetupWithManager watches Lineages, their Jobs, and the Datasets and Lineages of their
// namespace, any of which can change what a Lineage waits for.
func (r *LineageReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&datav1alpha1.Lineage{}).
		Owns(&batchv1.Job{}).
		Watches(&datav1alpha1.Dataset{}, handler.EnqueueRequestsFromMapFunc(r.lineagesInNamespace)).
		Watches(&datav1alpha1.Lineage{}, handler.EnqueueRequestsFromMapFunc(r.lineagesInNamespace)).
		// A CachePolicy's prefetch policy plans for the Lineages of its namespace.
		Watches(&datav1alpha1.CachePolicy{}, handler.EnqueueRequestsFromMapFunc(r.lineagesInNamespace)).
		Complete(r)
}

func (r *LineageReconciler) lineagesInNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	lineages := &datav1alpha1.LineageList{}
	if err := r.Client.List(ctx, lineages, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(lineages.Items))
	for _, l := range lineages.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l)})
	}
	return reqs
}
