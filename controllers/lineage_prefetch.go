package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/lineage"
	"github.com/strata-cache/strata/lineage/kariz"
)

// prefetchLabel marks the DataLoads that a CachePolicy's prefetch policy makes; its value is
// the policy.
const prefetchLabel = "data.strata.dev/prefetch"

// prefetchLoad is a DataLoad a plan wants: percent of each file of a Dataset, loaded now.
type prefetchLoad struct {
	policy  datav1alpha1.PrefetchPolicy
	percent int32
	// readers are the Lineages of the set the prefetch is for.
	readers []string
	// fetch: part of it is not in memory yet; a load that brought it all in is kept, not made.
	fetch bool
}

// +kubebuilder:rbac:groups=data.strata.dev,resources=dataloads,verbs=get;list;watch;create;update;delete

// planPrefetch brings the prefetch DataLoads of a namespace in line with what the prefetch
// policies of its Datasets' CachePolicies (Kariz's MRD, CP and CMR: lineage/kariz) plan now,
// at the start of the stage-set that runs: the inputs of the Lineages of the next sets that
// the plan reads ahead during this one get a DataLoad each, onto one node of their pool (the
// scheduling hints then send their readers there), of the share of each file the plan holds;
// the loads a new plan no longer wants, because their readers started or the plan changed,
// are deleted. Only Datasets read from an under-store are prefetched: a Lineage's outputs are
// written into the cache.
//
// It says when to plan again: soon while the plan may grow (a running set's time, and so the
// bandwidth it leaves, grows as it runs, which no event tells), never when nothing is planned for.
func (r *LineageReconciler) planPrefetch(ctx context.Context, namespace string, ns *namespace) (time.Duration, error) {
	policies := &datav1alpha1.CachePolicyList{}
	if err := r.Client.List(ctx, policies, client.InNamespace(namespace)); err != nil {
		return 0, fmt.Errorf("listing CachePolicies in %s: %w", namespace, err)
	}
	prefetchOf := map[string]datav1alpha1.PrefetchPolicy{}
	for _, cp := range policies.Items {
		if p := cp.Spec.Prefetch.Policy; p != "" && p != datav1alpha1.PrefetchNone {
			prefetchOf[cp.Name] = p
		}
	}
	want := map[string]prefetchLoad{}
	var replan time.Duration
	if len(prefetchOf) > 0 {
		var planned bool
		want, planned = r.prefetchPlan(ctx, ns, prefetchOf)
		if planned {
			replan = prefetchReplan
		}
	}
	return replan, r.applyPrefetch(ctx, namespace, ns, want)
}

// prefetchReplan is how often a namespace's prefetches are planned again while Lineages wait
// for a running set that reads Datasets a policy prefetches.
const prefetchReplan = 3 * time.Second

// prefetchPlan runs each policy over the namespace's Lineages, for the Datasets whose
// CachePolicy names it, grouped by TierPool (each pool's memory is its own budget). planned
// says whether a Lineage that waits reads such a Dataset, so that the plan may change as the
// running ones go on.
func (r *LineageReconciler) prefetchPlan(ctx context.Context, ns *namespace, prefetchOf map[string]datav1alpha1.PrefetchPolicy) (_ map[string]prefetchLoad, planned bool) {
	lineages := ns.lineages
	stageOf := ns.pipeline.Stages(func(step string) lineage.Phase { return phaseOf(lineages[step]) })

	type group struct {
		policy datav1alpha1.PrefetchPolicy
		pool   string
	}
	// candidate says which group a Dataset is planned in, if any.
	candidate := func(name string) (group, bool) {
		ds := ns.datasets[name]
		if ds == nil || !ds.ReadsStores() || ds.Status.TotalBytes == 0 {
			return group{}, false
		}
		p, ok := prefetchOf[ds.Spec.CachePolicyName]
		return group{policy: p, pool: ds.Spec.TierPoolName}, ok
	}
	// Every Lineage that will still run is a stage of every group's plan (its reads take the
	// bandwidth whatever is prefetched); its inputs there are the group's Datasets it reads.
	type step struct {
		stage  kariz.Stage
		inputs map[group][]kariz.Input
		model  lineage.RunTimeModel
		// total is what it reads; sources are its uncached bytes of under-store Datasets.
		total, sources, cachedOthers int64
	}
	var steps []step
	groupsSeen := map[group]bool{}
	now := time.Now()
	for _, name := range slices.Sorted(maps.Keys(lineages)) {
		set, ok := stageOf[name]
		if !ok || set < 0 {
			continue
		}
		l := lineages[name]
		st := step{stage: kariz.Stage{Name: name, DAG: namespaceDAG, Set: set}, inputs: map[group][]kariz.Input{}, model: runTimeModel(l.Status.RunTime)}
		for _, in := range l.Spec.Inputs {
			ds := ns.datasets[in]
			if ds == nil {
				continue
			}
			st.total += ds.Status.TotalBytes
			cached := min(ds.Status.CachedBytes, ds.Status.TotalBytes)
			if ds.ReadsStores() {
				st.sources += ds.Status.TotalBytes - cached
			}
			if g, ok := candidate(in); ok {
				st.inputs[g] = append(st.inputs[g], kariz.Input{Dataset: in, Bytes: ds.Status.TotalBytes})
				groupsSeen[g] = true
				continue
			}
			st.cachedOthers += cached
		}
		st.stage.Remote = st.model.Predict(st.total, st.cachedOthers)
		if running := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionReady); phaseOf(l) == lineage.Running &&
			running != nil && running.Reason == ReasonRunning {
			// It runs at least as long as it has run: a step without runs to learn from is
			// predicted by its reads alone, which leave out its own work.
			st.stage.Remote = max(st.stage.Remote, now.Sub(running.LastTransitionTime.Time).Seconds())
		}
		steps = append(steps, st)
	}
	for _, st := range steps {
		if st.stage.Set > 0 && len(st.inputs) > 0 {
			planned = true
		}
	}
	groups := map[group][]kariz.Stage{}
	for g := range groupsSeen {
		for _, st := range steps {
			s := st.stage
			s.Inputs = st.inputs[g]
			var bytes, uncached int64
			for _, in := range s.Inputs {
				bytes += in.Bytes
				ds := ns.datasets[in.Dataset]
				uncached += ds.Status.TotalBytes - min(ds.Status.CachedBytes, ds.Status.TotalBytes)
			}
			// What caching the group's inputs would take off the step, the rest as it is.
			s.Cached = min(s.Remote, st.model.Predict(st.total, st.cachedOthers+bytes))
			s.OtherReads = max(0, st.sources-uncached)
			groups[g] = append(groups[g], s)
		}
	}

	want := map[string]prefetchLoad{}
	for g, stages := range groups {
		sortStages(stages)
		cached := map[string]int64{}
		for _, s := range stages {
			for _, in := range s.Inputs {
				ds := ns.datasets[in.Dataset]
				cached[in.Dataset] = min(ds.Status.CachedBytes, ds.Status.TotalBytes)
			}
		}
		budget := kariz.Budget{Memory: r.memoryOf(ctx, g.pool), Bandwidth: lineage.DefaultUnderStoreRate}
		var holds []kariz.Hold
		switch g.policy {
		case datav1alpha1.PrefetchMRD:
			holds = kariz.PlanMRD(stages, cached, budget)
		case datav1alpha1.PrefetchCP:
			holds = kariz.PlanCP(stages, cached, budget)
		case datav1alpha1.PrefetchCMR:
			holds = kariz.PlanCMR(stages, cached, budget)
		}
		for _, h := range holds {
			if h.Bytes <= 0 || (h.Prefetch > 0 && h.Start != 0) {
				continue // read ahead during a later set
			}
			total := ns.datasets[h.Dataset].Status.TotalBytes
			percent := int32(min(100, max(1, (h.Bytes*100+total-1)/total)))
			var readers []string
			for _, s := range stages {
				if s.Set > 0 && slices.ContainsFunc(s.Inputs, func(in kariz.Input) bool { return in.Dataset == h.Dataset }) {
					readers = append(readers, s.Name)
				}
			}
			want[h.Dataset] = prefetchLoad{policy: g.policy, percent: percent, readers: readers, fetch: h.Prefetch > 0}
		}
	}
	return want, planned
}

// namespaceDAG is the one pipeline of a namespace, as the planner sees it: a Dataset that
// several of its Lineages read is read by one pipeline, not shared between pipelines.
const namespaceDAG = "namespace"

// memoryOf is what a plan may hold of a pool: one node's memory tiers, whose quotas the pool
// declares (the prefetch loads onto one node).
func (r *LineageReconciler) memoryOf(ctx context.Context, pool string) int64 {
	tp := &datav1alpha1.TierPool{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: pool}, tp); err != nil {
		return 0
	}
	var memory int64
	for _, t := range tp.Spec.Tiers {
		if t.Medium == datav1alpha1.MediumMemory {
			memory += t.Quota.Value()
		}
	}
	return memory
}

// prefetchName is the DataLoad that prefetches a Dataset.
func prefetchName(dataset string) string { return objectName(dataset, "-prefetch") }

// applyPrefetch creates the DataLoads want names and has not, gives those whose share changed
// the new one, and deletes the prefetch DataLoads of the namespace that want leaves out.
func (r *LineageReconciler) applyPrefetch(ctx context.Context, namespace string, ns *namespace, want map[string]prefetchLoad) error {
	have := &datav1alpha1.DataLoadList{}
	if err := r.Client.List(ctx, have, client.InNamespace(namespace), client.HasLabels{prefetchLabel}); err != nil {
		return fmt.Errorf("listing the prefetch DataLoads of %s: %w", namespace, err)
	}
	var errs []error
	existing := map[string]*datav1alpha1.DataLoad{}
	for i := range have.Items {
		dl := &have.Items[i]
		if _, ok := want[dl.Spec.DatasetName]; ok && dl.Name == prefetchName(dl.Spec.DatasetName) {
			existing[dl.Spec.DatasetName] = dl
			continue
		}
		if err := r.Client.Delete(ctx, dl); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("deleting prefetch DataLoad %s/%s: %w", namespace, dl.Name, err))
			continue
		}
		if ds := ns.datasets[dl.Spec.DatasetName]; ds != nil {
			r.Recorder.Eventf(ds, corev1.EventTypeNormal, "PrefetchEnded",
				"the %s plan no longer reads ahead %s (its readers started, or the plan changed): deleted DataLoad %s",
				dl.Labels[prefetchLabel], ds.Name, dl.Name)
		}
	}
	for _, dataset := range slices.Sorted(maps.Keys(want)) {
		w, ds := want[dataset], ns.datasets[dataset]
		if dl := existing[dataset]; dl != nil || !w.fetch {
			if dl == nil {
				continue // in memory already, and not by a load of this plan: nothing to do
			}
			// A new share starts the load again: not for a few points, as a plan that grows with
			// the running set's time would otherwise restart it every few seconds.
			have := ptr.Deref(dl.Spec.PercentOfEachFile, 100)
			if dl.Labels[prefetchLabel] == string(w.policy) && (have == w.percent || (w.percent < 100 && abs32(w.percent-have) < prefetchStep)) {
				continue
			}
			dl.Spec.PercentOfEachFile, dl.Labels[prefetchLabel] = ptr.To(w.percent), string(w.policy)
			if err := r.Client.Update(ctx, dl); err != nil && !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("updating prefetch DataLoad %s/%s: %w", namespace, dl.Name, err))
			}
			continue
		}
		dl := &datav1alpha1.DataLoad{
			ObjectMeta: metav1.ObjectMeta{Name: prefetchName(dataset), Namespace: namespace, Labels: map[string]string{
				prefetchLabel: string(w.policy), "app.kubernetes.io/managed-by": "strata-operator",
			}},
			Spec: datav1alpha1.DataLoadSpec{DatasetName: dataset, PercentOfEachFile: ptr.To(w.percent)},
		}
		if err := controllerutil.SetControllerReference(ds, dl, r.Client.Scheme()); err != nil {
			errs = append(errs, fmt.Errorf("owning prefetch DataLoad %s/%s: %w", namespace, dl.Name, err))
			continue
		}
		if err := r.Client.Create(ctx, dl); err != nil && !apierrors.IsAlreadyExists(err) {
			errs = append(errs, fmt.Errorf("creating prefetch DataLoad %s/%s: %w", namespace, dl.Name, err))
			continue
		}
		r.Recorder.Eventf(ds, corev1.EventTypeNormal, "Prefetching",
			"the %s plan reads ahead %d%% of each file of %s for %s, which run next: DataLoad %s",
			w.policy, w.percent, ds.Name, describeNodes(w.readers), dl.Name)
	}
	return errors.Join(errs...)
}

// prefetchStep is the least change of a prefetch's share that loads it again.
const prefetchStep = 10

func abs32(n int32) int32 {
	if n < 0 {
		return -n
	}
	return n
}

// sortStages orders stages for a stable plan.
func sortStages(stages []kariz.Stage) {
	slices.SortFunc(stages, func(a, b kariz.Stage) int { return cmp.Or(cmp.Compare(a.Set, b.Set), cmp.Compare(a.Name, b.Name)) })
}
