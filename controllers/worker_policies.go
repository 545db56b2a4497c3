package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/policy"
)

// policiesFile is the pool's policies file (see cacheworker/policy): the CachePolicy settings
// of its Datasets that the workers apply, in a stable order so that an unchanged set writes
// nothing. A Dataset whose CachePolicy is missing or names a bad pattern is left out; its own
// status says why. A Dataset without a CachePolicy follows the workers' own settings.
func (r *WorkerReconciler) policiesFile(ctx context.Context, pool *datav1alpha1.TierPool, lineages *namespaceLineages) (string, error) {
	var datasets datav1alpha1.DatasetList
	if err := r.Client.List(ctx, &datasets); err != nil {
		return "", fmt.Errorf("listing Datasets for the policies of TierPool %s: %w", pool.Name, err)
	}
	file := policy.File{Datasets: []policy.Dataset{}}
	for _, ds := range datasets.Items {
		if ds.Spec.TierPoolName != pool.Name || ds.Spec.CachePolicyName == "" || !ds.DeletionTimestamp.IsZero() {
			continue
		}
		var cp datav1alpha1.CachePolicy
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: ds.Spec.CachePolicyName}, &cp); err != nil {
			if client.IgnoreNotFound(err) != nil {
				return "", fmt.Errorf("reading CachePolicy %s/%s: %w", ds.Namespace, ds.Spec.CachePolicyName, err)
			}
			continue
		}
		if pinnedPathsProblem(cp.Spec.PinnedPaths) != "" {
			continue
		}
		d := datasetPolicy(datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID)), &cp)
		prefetch, err := r.prefetchPin(ctx, &ds)
		if err != nil {
			return "", err
		}
		d.Prefetch = prefetch
		if d.Eviction == string(eviction.MRD) {
			ls, err := lineages.of(ctx, ds.Namespace)
			if err != nil {
				return "", err
			}
			if u, ok := nextUses(ls)[ds.Name]; ok {
				d.NextUse = &u
			}
		}
		file.Datasets = append(file.Datasets, d)
	}
	claims, err := r.claimPolicies(ctx, pool)
	if err != nil {
		return "", err
	}
	file.Datasets = append(file.Datasets, claims...)
	slices.SortFunc(file.Datasets, func(a, b policy.Dataset) int { return strings.Compare(a.Name, b.Name) })
	topology, err := r.topology(ctx, file.Datasets)
	if err != nil {
		return "", err
	}
	file.Topology = topology
	return settingsJSON(file, "policies", pool)
}

// prefetchPin is what the prefetch DataLoad of Dataset ds loads, which stays pinned while the
// DataLoad lasts (until the stage that reads it ends: LineageReconciler.planPrefetch); nil if
// there is none.
func (r *WorkerReconciler) prefetchPin(ctx context.Context, ds *datav1alpha1.Dataset) (*policy.Prefetch, error) {
	dl := &datav1alpha1.DataLoad{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: prefetchName(ds.Name)}, dl)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the prefetch DataLoad of Dataset %s/%s: %w", ds.Namespace, ds.Name, err)
	case dl.Labels[prefetchLabel] == "" || dl.Spec.DatasetName != ds.Name || !dl.DeletionTimestamp.IsZero():
		return nil, nil // a user's DataLoad of that name, or one going
	}
	return &policy.Prefetch{Paths: dl.Spec.Paths, Percent: int(ptr.Deref(dl.Spec.PercentOfEachFile, 100))}, nil
}

// claimPolicies are the policies of the pool's provisioned claim volumes that name a
// CachePolicy (the provisioner checked it exists; one deleted since is left out).
func (r *WorkerReconciler) claimPolicies(ctx context.Context, pool *datav1alpha1.TierPool) ([]policy.Dataset, error) {
	var volumes corev1.PersistentVolumeList
	if err := r.Client.List(ctx, &volumes); err != nil {
		return nil, fmt.Errorf("listing PersistentVolumes for the policies of TierPool %s: %w", pool.Name, err)
	}
	var out []policy.Dataset
	for i := range volumes.Items {
		pv := &volumes.Items[i]
		if !provisionedByStrata(pv) {
			continue
		}
		attrs := pv.Spec.CSI.VolumeAttributes
		name := attrs[datav1alpha1.VolumeAttributeCachePolicy]
		if name == "" || attrs[datav1alpha1.VolumeAttributePool] != pool.Name {
			continue
		}
		namespace := attrs[datav1alpha1.VolumeAttributeNamespace]
		var cp datav1alpha1.CachePolicy
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cp); err != nil {
			if client.IgnoreNotFound(err) != nil {
				return nil, fmt.Errorf("reading CachePolicy %s/%s: %w", namespace, name, err)
			}
			continue
		}
		if pinnedPathsProblem(cp.Spec.PinnedPaths) != "" {
			continue
		}
		out = append(out, datasetPolicy(datav1alpha1.MasterDatasetName(namespace, attrs[datav1alpha1.VolumeAttributeDataset],
			attrs[datav1alpha1.VolumeAttributeUID]), &cp))
	}
	return out, nil
}

// topology maps every node to the values it has of the labels that bound the replicas of
// datasets (their scope labels), so that a worker knows which nodes share its rack or zone;
// nil when no Dataset is replicated within a scope.
func (r *WorkerReconciler) topology(ctx context.Context, datasets []policy.Dataset) (map[string]map[string]string, error) {
	labels := map[string]bool{}
	for _, d := range datasets {
		if d.Replication != nil && d.Replication.ScopeLabel != "" {
			labels[d.Replication.ScopeLabel] = true
		}
	}
	if len(labels) == 0 {
		return nil, nil
	}
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("listing the nodes for the replication scopes: %w", err)
	}
	topology := map[string]map[string]string{}
	for _, n := range nodes.Items {
		for label := range labels {
			if v, ok := n.Labels[label]; ok {
				if topology[n.Name] == nil {
					topology[n.Name] = map[string]string{}
				}
				topology[n.Name][label] = v
			}
		}
	}
	return topology, nil
}

// settingsJSON is a file the pool's workers read, as JSON, in a stable form: an unchanged set
// writes nothing.
func settingsJSON(v any, what string, pool *datav1alpha1.TierPool) (string, error) {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", fmt.Errorf("writing the %s of TierPool %s: %w", what, pool.Name, err)
	}
	return string(raw) + "\n", nil
}

// namespaceLineages lists the Lineages of a namespace once per reconcile of a pool: the
// policies (MRD's next uses) and the checkpoint settings (the Datasets read already) follow them.
type namespaceLineages struct {
	client client.Client
	byNS   map[string][]datav1alpha1.Lineage
}

func (n *namespaceLineages) of(ctx context.Context, namespace string) ([]datav1alpha1.Lineage, error) {
	if ls, ok := n.byNS[namespace]; ok {
		return ls, nil
	}
	var list datav1alpha1.LineageList
	if err := n.client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing the Lineages of %s: %w", namespace, err)
	}
	if n.byNS == nil {
		n.byNS = map[string][]datav1alpha1.Lineage{}
	}
	n.byNS[namespace] = list.Items
	return list.Items, nil
}

// datasetPolicy is what the workers apply to the blocks of the Dataset named name at the master
// from its CachePolicy cp: pins, its eviction policy (MRD's next use is the caller's), its share
// of each tier, its promotion threshold.
func datasetPolicy(name string, cp *datav1alpha1.CachePolicy) policy.Dataset {
	d := policy.Dataset{
		Name: name, CachePolicy: cp.Namespace + "/" + cp.Name, PinnedPaths: cp.Spec.PinnedPaths,
		PromotionThreshold: int(cp.Spec.Promotion.AccessThreshold),
	}
	if ev, err := eviction.ConfigFromSpec(cp.Spec.Eviction); err == nil {
		d.Eviction = string(ev.Kind)
		if ev.Kind == eviction.LRFU {
			d.Lambda = &ev.Lambda
		}
	}
	if w := cp.Spec.Eviction.Watermarks; w != nil {
		d.Watermarks = &policy.Watermarks{High: w.High, Low: w.Low}
	}
	if rs := cp.Spec.Replication; rs.Count > 1 {
		d.Replication = &policy.Replication{Count: int(rs.Count), ScopeLabel: rs.ScopeLabel(), Selective: rs.Selective == nil || *rs.Selective}
		if rs.BandwidthLimit != nil {
			d.Replication.BandwidthBytes = rs.BandwidthLimit.Value()
		}
	}
	return d
}

// pinnedPathsProblem says what is wrong with a CachePolicy's pinnedPaths, or "".
func pinnedPathsProblem(patterns []string) string {
	return patternsProblem("spec.pinnedPaths", patterns)
}

// patternsProblem says what is wrong with the path patterns of a CachePolicy's field, or "".
func patternsProblem(field string, patterns []string) string {
	for i, p := range patterns {
		if _, err := policy.Compile(p); err != nil {
			return fmt.Sprintf("%s[%d]: %v", field, i, err)
		}
	}
	return ""
}

// poolOfDataset maps a Dataset to its TierPool, whose policies file lists it.
func poolOfDataset(_ context.Context, obj client.Object) []reconcile.Request {
	ds, ok := obj.(*datav1alpha1.Dataset)
	if !ok || ds.Spec.TierPoolName == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: ds.Spec.TierPoolName}}}
}

// poolsOfNamespace maps an object (a Lineage) to the TierPools of the Datasets of
// its namespace.
func (r *WorkerReconciler) poolsOfNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.poolsOf(ctx, obj.GetNamespace(), func(*datav1alpha1.Dataset) bool { return true })
}

// poolsOf are the TierPools of the Datasets of namespace that match, once each.
func (r *WorkerReconciler) poolsOf(ctx context.Context, namespace string, match func(*datav1alpha1.Dataset) bool) []reconcile.Request {
	var datasets datav1alpha1.DatasetList
	if err := r.Client.List(ctx, &datasets, client.InNamespace(namespace)); err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []reconcile.Request
	for i := range datasets.Items {
		ds := &datasets.Items[i]
		if pool := ds.Spec.TierPoolName; pool != "" && !seen[pool] && match(ds) {
			seen[pool] = true
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: pool}})
		}
	}
	return out
}
