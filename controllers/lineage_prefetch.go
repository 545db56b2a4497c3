package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/lineage"
	"github.com/strata-cache/strata/lineage/kariz"
	"github.com/strata-cache/strata/master/masterpb"
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
// scheduling hints then send their readers there), of the share of each file the plan holds,
// which the workers pin while the DataLoad lasts (WorkerReconciler.prefetchPin); the loads a
// new plan no longer wants are deleted once no stage that reads them runs (the stage they were
// for ended, or the plan changed). Only Datasets read from an under-store are prefetched: a
// Lineage's outputs are written into the cache.
//
// The namespaces whose prefetched Datasets share a pool share its memory: they are planned
// together, each pipeline of each namespace one DAG of Kariz's multi-DAG plan (a Dataset that
// several pipelines read counts once per pipeline); the plan is applied to all of them at
// once, by whichever namespace's reconcile made it.
//
// It says when to plan again: soon while the plan may grow (a running set's time, and so the
// bandwidth it leaves, grows as it runs, which no event tells), never when nothing is planned for.
func (r *LineageReconciler) planPrefetch(ctx context.Context, namespace string, ns *namespace) (time.Duration, error) {
	prefetchOf, err := r.prefetchPolicies(ctx, namespace)
	if err != nil {
		return 0, err
	}
	if len(prefetchOf) == 0 {
		return 0, r.applyPrefetch(ctx, namespace, ns, nil)
	}
	tenants, err := r.poolTenants(ctx, namespace, &tenant{graph: ns, prefetchOf: prefetchOf})
	if err != nil {
		return 0, err
	}
	plan, planned := r.prefetchPlan(ctx, tenants)
	var replan time.Duration
	if planned {
		replan = prefetchReplan
	}
	// Every namespace of the plan gets its part now, so that the pool's memory is never
	// promised twice while the other namespaces wait for their own reconciles.
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(tenants)) {
		want := map[string]prefetchLoad{}
		for q, w := range plan {
			if q.namespace == name {
				want[q.name] = w
			}
		}
		errs = append(errs, r.applyPrefetch(ctx, name, tenants[name].graph, want))
	}
	return replan, errors.Join(errs...)
}

// prefetchReplan is how often a namespace's prefetches are planned again while Lineages wait
// for a running set that reads Datasets a policy prefetches.
const prefetchReplan = 3 * time.Second

// tenant is a namespace as the prefetch planner sees it: its Lineage graph, and the prefetch
// policy of each of its CachePolicies that names one.
type tenant struct {
	graph      *namespace
	prefetchOf map[string]datav1alpha1.PrefetchPolicy
}

// qualified names a Dataset or a Lineage across namespaces.
type qualified struct{ namespace, name string }

func (q qualified) String() string { return q.namespace + "/" + q.name }

// prefetchPolicies maps the CachePolicies of namespace that prefetch to their policy.
func (r *LineageReconciler) prefetchPolicies(ctx context.Context, namespace string) (map[string]datav1alpha1.PrefetchPolicy, error) {
	policies := &datav1alpha1.CachePolicyList{}
	if err := r.Client.List(ctx, policies, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing CachePolicies in %s: %w", namespace, err)
	}
	prefetchOf := map[string]datav1alpha1.PrefetchPolicy{}
	for _, cp := range policies.Items {
		if p := cp.Spec.Prefetch.Policy; p != "" && p != datav1alpha1.PrefetchNone {
			prefetchOf[cp.Name] = p
		}
	}
	return prefetchOf, nil
}

// prefetched says whether ds is one a tenant's policies prefetch, and with which.
func (t *tenant) prefetched(ds *datav1alpha1.Dataset) (datav1alpha1.PrefetchPolicy, bool) {
	if ds == nil || !ds.ReadsStores() || ds.Status.TotalBytes == 0 {
		return "", false
	}
	p, ok := t.prefetchOf[ds.Spec.CachePolicyName]
	return p, ok
}

// poolTenants are namespace (own) and every other namespace that prefetches a Dataset of a pool
// where own prefetches one: their plans share the pool's memory.
func (r *LineageReconciler) poolTenants(ctx context.Context, namespace string, own *tenant) (map[string]*tenant, error) {
	tenants := map[string]*tenant{namespace: own}
	pools := map[string]bool{}
	for _, ds := range own.graph.datasets {
		if _, ok := own.prefetched(ds); ok {
			pools[ds.Spec.TierPoolName] = true
		}
	}
	if len(pools) == 0 {
		return tenants, nil
	}
	all := &datav1alpha1.DatasetList{}
	if err := r.Client.List(ctx, all); err != nil {
		return nil, fmt.Errorf("listing the Datasets of the pools of %s: %w", namespace, err)
	}
	others := map[string]bool{}
	for _, ds := range all.Items {
		if ds.Namespace != namespace && pools[ds.Spec.TierPoolName] && ds.Spec.CachePolicyName != "" {
			others[ds.Namespace] = true
		}
	}
	for _, other := range slices.Sorted(maps.Keys(others)) {
		prefetchOf, err := r.prefetchPolicies(ctx, other)
		if err != nil {
			return nil, err
		}
		if len(prefetchOf) == 0 {
			continue
		}
		graph, err := r.namespaceGraph(ctx, other)
		if err != nil {
			return nil, err
		}
		tenants[other] = &tenant{graph: graph, prefetchOf: prefetchOf}
	}
	return tenants, nil
}

// prefetchPlan runs each policy over the tenants' Lineages, for the Datasets whose CachePolicy
// names it, grouped by policy and TierPool; the groups of one pool take its memory in turn.
// planned says whether a Lineage that waits reads such a Dataset, so that the plan may change
// as the running ones go on.
func (r *LineageReconciler) prefetchPlan(ctx context.Context, tenants map[string]*tenant) (_ map[qualified]prefetchLoad, planned bool) {
	type group struct {
		policy datav1alpha1.PrefetchPolicy
		pool   string
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
	datasets := map[string]*datav1alpha1.Dataset{} // the inputs, by qualified name
	groupsSeen := map[group]bool{}
	now := time.Now()
	for _, namespace := range slices.Sorted(maps.Keys(tenants)) {
		t := tenants[namespace]
		lineages := t.graph.lineages
		stageOf := t.graph.pipeline.Stages(func(step string) lineage.Phase { return phaseOf(lineages[step]) })
		dags := t.graph.pipeline.DAGs()
		for _, name := range slices.Sorted(maps.Keys(lineages)) {
			set, ok := stageOf[name]
			if !ok || set < 0 {
				continue
			}
			l := lineages[name]
			st := step{stage: kariz.Stage{Name: qualified{namespace, name}.String(), DAG: qualified{namespace, dags[name]}.String(), Set: set},
				inputs: map[group][]kariz.Input{}, model: runTimeModel(l.Status.RunTime)}
			for _, in := range l.Spec.Inputs {
				ds := t.graph.datasets[in]
				if ds == nil {
					continue
				}
				q := qualified{namespace, in}.String()
				datasets[q] = ds
				st.total += ds.Status.TotalBytes
				cached := min(ds.Status.CachedBytes, ds.Status.TotalBytes)
				if ds.ReadsStores() {
					st.sources += ds.Status.TotalBytes - cached
				}
				if p, ok := t.prefetched(ds); ok {
					g := group{policy: p, pool: ds.Spec.TierPoolName}
					st.inputs[g] = append(st.inputs[g], kariz.Input{Dataset: q, Bytes: ds.Status.TotalBytes})
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
			if set > 0 && len(st.inputs) > 0 {
				planned = true
			}
			steps = append(steps, st)
		}
	}
	uncachedOf := func(q string) int64 {
		ds := datasets[q]
		return ds.Status.TotalBytes - min(ds.Status.CachedBytes, ds.Status.TotalBytes)
	}
	groups := map[group][]kariz.Stage{}
	for g := range groupsSeen {
		for _, st := range steps {
			s := st.stage
			s.Inputs = st.inputs[g]
			var bytes, uncached int64
			for _, in := range s.Inputs {
				bytes += in.Bytes
				uncached += uncachedOf(in.Dataset)
			}
			// What caching the group's inputs would take off the step, the rest as it is.
			s.Cached = min(s.Remote, st.model.Predict(st.total, st.cachedOthers+bytes))
			s.OtherReads = max(0, st.sources-uncached)
			groups[g] = append(groups[g], s)
		}
	}

	// cachedOf is what memory holds of each group's Datasets; memory, what each pool has left
	// for the groups not planned yet.
	cachedOf := map[group]map[string]int64{}
	held := map[string]int64{}
	for g, stages := range groups {
		cachedOf[g] = map[string]int64{}
		for _, s := range stages {
			for _, in := range s.Inputs {
				ds := datasets[in.Dataset]
				if _, seen := cachedOf[g][in.Dataset]; !seen {
					cachedOf[g][in.Dataset] = min(ds.Status.CachedBytes, ds.Status.TotalBytes)
					held[g.pool] += cachedOf[g][in.Dataset]
				}
			}
		}
	}
	memory := map[string]int64{}
	want := map[qualified]prefetchLoad{}
	for _, g := range slices.SortedFunc(maps.Keys(groups), func(a, b group) int {
		return cmp.Or(cmp.Compare(a.pool, b.pool), cmp.Compare(a.policy, b.policy))
	}) {
		stages := groups[g]
		sortStages(stages)
		if _, ok := memory[g.pool]; !ok {
			memory[g.pool] = r.memoryOf(ctx, g.pool, held[g.pool])
		}
		budget := kariz.Budget{Memory: memory[g.pool], Bandwidth: lineage.DefaultUnderStoreRate}
		var holds []kariz.Hold
		switch g.policy {
		case datav1alpha1.PrefetchMRD:
			holds = kariz.PlanMRD(stages, cachedOf[g], budget)
		case datav1alpha1.PrefetchCP:
			holds = kariz.PlanCP(stages, cachedOf[g], budget)
		case datav1alpha1.PrefetchCMR:
			holds = kariz.PlanCMR(stages, cachedOf[g], budget)
		}
		for _, h := range holds {
			memory[g.pool] -= max(h.Bytes, 0)
			if h.Bytes <= 0 || (h.Prefetch > 0 && h.Start != 0) {
				continue // read ahead during a later set
			}
			ds := datasets[h.Dataset]
			total := ds.Status.TotalBytes
			percent := int32(min(100, max(1, (h.Bytes*100+total-1)/total)))
			var readers []string
			for _, s := range stages {
				if s.Set > 0 && strings.HasPrefix(s.Name, ds.Namespace+"/") && slices.ContainsFunc(s.Inputs, func(in kariz.Input) bool { return in.Dataset == h.Dataset }) {
					readers = append(readers, strings.TrimPrefix(s.Name, ds.Namespace+"/"))
				}
			}
			want[qualified{ds.Namespace, ds.Name}] = prefetchLoad{policy: g.policy, percent: percent, readers: readers, fetch: h.Prefetch > 0}
		}
	}
	return want, planned
}

// memoryOf is what a plan may hold of a pool: the free space of the memory tiers of the node
// of the pool that has most (the prefetch loads onto one node), as its worker last told the
// master, and the bytes of the planned Datasets that memory holds already (a plan counts what
// it keeps, not only what it brings in). Before any worker of the pool reported, or without a
// master, it is one node's memory quotas, which the pool declares.
func (r *LineageReconciler) memoryOf(ctx context.Context, pool string, held int64) int64 {
	tp := &datav1alpha1.TierPool{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: pool}, tp); err != nil {
		return 0
	}
	memory := map[string]bool{}
	var quota int64
	for _, t := range tp.Spec.Tiers {
		if t.Medium == datav1alpha1.MediumMemory {
			memory[t.Name] = true
			quota += t.Quota.Value()
		}
	}
	free, ok := r.freeMemory(ctx, pool, memory)
	if !ok {
		return quota
	}
	return min(quota, free+held)
}

// freeMemory is the most free space of the tiers named memory that a live worker of pool has,
// as the workers last told the master; ok is false when none did.
func (r *LineageReconciler) freeMemory(ctx context.Context, pool string, memory map[string]bool) (free int64, ok bool) {
	if r.Master == nil {
		return 0, false
	}
	cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	resp, err := r.Master.ListWorkers(cctx, &masterpb.ListWorkersRequest{StaleOk: true})
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("cannot read the workers' free memory from the master; prefetches are planned within the pool's memory quota", "error", err.Error())
		return 0, false
	}
	for _, w := range resp.GetWorkers() {
		if !liveWorkerOf(w, pool) {
			continue
		}
		var f int64
		reported := false
		for _, t := range w.GetTiers() {
			if memory[t.GetTier()] {
				f += max(0, t.GetCapacityBytes()-t.GetUsedBytes())
				reported = true
			}
		}
		if reported && (!ok || f > free) {
			free, ok = f, true
		}
	}
	return free, ok
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
		own := dl.Name == prefetchName(dl.Spec.DatasetName)
		if _, ok := want[dl.Spec.DatasetName]; ok && own {
			existing[dl.Spec.DatasetName] = dl
			continue
		}
		if own && len(runningReaders(ns, dl.Spec.DatasetName)) > 0 {
			// What it loaded stays pinned (WorkerReconciler.prefetchPin) until the stage that
			// reads it ends.
			continue
		}
		if err := r.Client.Delete(ctx, dl); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("deleting prefetch DataLoad %s/%s: %w", namespace, dl.Name, err))
			continue
		}
		if ds := ns.datasets[dl.Spec.DatasetName]; ds != nil {
			r.Recorder.Eventf(ds, corev1.EventTypeNormal, "PrefetchEnded",
				"the %s plan no longer holds %s (the stage that read it ended, or the plan changed): deleted DataLoad %s, which unpins what it loaded",
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

// runningReaders are the Lineages of a namespace that read dataset and run now, or may start
// now (their inputs are written: the status of one that just became runnable may not say so yet).
func runningReaders(ns *namespace, dataset string) []string {
	stageOf := ns.pipeline.Stages(func(step string) lineage.Phase { return phaseOf(ns.lineages[step]) })
	var out []string
	for _, name := range slices.Sorted(maps.Keys(ns.lineages)) {
		if set, ok := stageOf[name]; ok && set == 0 && slices.Contains(ns.lineages[name].Spec.Inputs, dataset) {
			out = append(out, name)
		}
	}
	return out
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
