package controllers

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/pki"
)

// The CachePolicy API's checkpoint defaults, for outputs whose Dataset names no policy.
const (
	defaultEdgeFraction = 0.5
	defaultHotReads     = 2
)

// checkpointsFile is the pool's checkpoint settings (see cacheworker/checkpoint): for every
// output Dataset of the pool with a spec.checkpoint, where its files go, with the credentials of
// its Secret, and how its CachePolicy says to checkpoint them. An output whose Secret or
// CachePolicy is missing, or incomplete, is left out (its status says why): its files stay in
// memory. The order is stable, so that an unchanged set writes nothing.
func (r *WorkerReconciler) checkpointsFile(ctx context.Context, pool *datav1alpha1.TierPool, lineages *namespaceLineages) (string, error) {
	var datasets datav1alpha1.DatasetList
	if err := r.Client.List(ctx, &datasets); err != nil {
		return "", fmt.Errorf("listing Datasets for the checkpoints of TierPool %s: %w", pool.Name, err)
	}
	file := checkpoint.File{Datasets: []checkpoint.Dataset{}}
	for i := range datasets.Items {
		ds := &datasets.Items[i]
		if ds.Spec.TierPoolName != pool.Name || ds.Spec.Lineage == nil || ds.Spec.Checkpoint == nil || !ds.DeletionTimestamp.IsZero() {
			continue
		}
		target, ok, err := r.checkpointTarget(ctx, ds)
		if err != nil {
			return "", err
		}
		if !ok {
			continue
		}
		d := checkpoint.Dataset{
			Name:        datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID)),
			Root:        datav1alpha1.MasterDatasetRoot(ds.Namespace, ds.Name, string(ds.UID)),
			Target:      target,
			Temporary:   ds.Spec.Temporary,
			CreatedUnix: ds.CreationTimestamp.Unix(),
		}
		spec := datav1alpha1.CheckpointSpec{Strategy: datav1alpha1.CheckpointEdge, EdgeFraction: defaultEdgeFraction, HotReads: defaultHotReads}
		if name := ds.Spec.CachePolicyName; name != "" {
			var cp datav1alpha1.CachePolicy
			if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: name}, &cp); err != nil {
				if client.IgnoreNotFound(err) != nil {
					return "", fmt.Errorf("reading CachePolicy %s/%s: %w", ds.Namespace, name, err)
				}
				continue
			}
			if temporaryPatternsProblem(cp.Spec.Checkpoint.TemporaryPathPatterns) != "" {
				continue
			}
			spec, d.CachePolicy = cp.Spec.Checkpoint, ds.Namespace+"/"+name
		}
		setCheckpointSpec(&d, spec)
		ls, err := lineages.of(ctx, ds.Namespace)
		if err != nil {
			return "", err
		}
		d.Consumed = consumed(ls, ds.Name)
		file.Datasets = append(file.Datasets, d)
	}
	slices.SortFunc(file.Datasets, func(a, b checkpoint.Dataset) int { return strings.Compare(a.Name, b.Name) })
	return settingsJSON(file, "checkpoint settings", pool)
}

// setCheckpointSpec copies a CachePolicy's checkpoint settings into d.
func setCheckpointSpec(d *checkpoint.Dataset, spec datav1alpha1.CheckpointSpec) {
	d.Strategy = spec.Strategy
	if d.Strategy == "" {
		d.Strategy = datav1alpha1.CheckpointEdge
	}
	d.EdgeFraction, d.HotReads = spec.EdgeFraction, int(spec.HotReads)
	if spec.Interval != nil {
		d.IntervalSeconds = spec.Interval.Seconds()
	}
	if spec.BandwidthLimit != nil {
		d.BandwidthLimit = spec.BandwidthLimit.Value()
	}
	if spec.SyncWriteThreshold != nil {
		d.SyncWriteThreshold = spec.SyncWriteThreshold.Value()
	}
	d.TemporaryPaths = spec.TemporaryPathPatterns
}

// checkpointTarget is where ds is checkpointed, with the keys of its Secret; ok is false when
// the Secret is missing or lacks a key (the Dataset's CheckpointTargetReachable condition says so).
func (r *WorkerReconciler) checkpointTarget(ctx context.Context, ds *datav1alpha1.Dataset) (checkpoint.Target, bool, error) {
	spec := ds.Spec.Checkpoint
	var secret corev1.Secret
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: spec.SecretRef.Name}, &secret); err != nil {
		return checkpoint.Target{}, false, client.IgnoreNotFound(err)
	}
	creds := map[string]string{}
	for _, key := range []string{understore.CredentialAccessKeyID, understore.CredentialSecretAccessKey, understore.CredentialSessionToken} {
		if v := secret.Data[key]; len(v) > 0 {
			creds[key] = string(v)
		}
	}
	if creds[understore.CredentialAccessKeyID] == "" || creds[understore.CredentialSecretAccessKey] == "" {
		return checkpoint.Target{}, false, nil
	}
	return checkpoint.Target{URI: spec.URI, Endpoint: spec.Endpoint, Region: spec.Region, Credentials: creds}, true, nil
}

// consumed says whether a Lineage of lineages reads the Dataset name and has run or runs:
// then its files are no leaves of the lineage graph any more.
func consumed(lineages []datav1alpha1.Lineage, name string) bool {
	for i := range lineages {
		if l := &lineages[i]; lineageStarted(l) && slices.Contains(l.Spec.Inputs, name) {
			return true
		}
	}
	return false
}

// lineageStarted says whether a Lineage's Job has run or runs: it reads its inputs.
func lineageStarted(l *datav1alpha1.Lineage) bool {
	c := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionReady)
	return l.Status.ActiveRecomputation != nil || c != nil && (c.Reason == ReasonRunning || c.Reason == ReasonWritten)
}

// temporaryPatternsProblem says what is wrong with a CachePolicy's temporaryPathPatterns, or "".
func temporaryPatternsProblem(patterns []string) string {
	return patternsProblem("spec.checkpoint.temporaryPathPatterns", patterns)
}

// CheckpointSettings are the checkpoint settings of the pool named poolName, made now from the
// Datasets, CachePolicies and Lineages and the keys of the outputs' Secrets as they are.
func (r *WorkerReconciler) CheckpointSettings(ctx context.Context, poolName string) ([]byte, error) {
	pool := &datav1alpha1.TierPool{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: poolName}, pool); err != nil {
		return nil, fmt.Errorf("reading TierPool %s: %w", poolName, err)
	}
	settings, err := r.checkpointsFile(ctx, pool, &namespaceLineages{client: r.Client})
	return []byte(settings), err
}

// CheckpointsHandler serves a pool's checkpoint settings (at CheckpointsPath) to the workers of
// that pool and to no one else: the caller's verified certificate must name a worker of the
// pool. The settings carry the keys of the outputs' Secrets, read from their namespaces at each
// request, so no Secret pools keys of several namespaces, and a rotated key reaches the workers
// at their next poll.
func (r *WorkerReconciler) CheckpointsHandler(log logr.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		pool := req.PathValue("pool")
		var caller pki.Identity
		var err error
		if req.TLS == nil || len(req.TLS.VerifiedChains) == 0 {
			err = fmt.Errorf("%w: ask with a worker's certificate", pki.ErrNoIdentity)
		} else {
			caller, err = pki.FromCertificate(req.TLS.VerifiedChains[0][0])
		}
		if err != nil {
			log.Info("refused the checkpoint settings", "pool", pool, "from", req.RemoteAddr, "reason", err.Error())
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if caller.Role != pki.RoleWorker || caller.Pool != pool {
			msg := fmt.Sprintf("%s may not read the checkpoint settings of TierPool %s: only its workers may", caller, pool)
			log.Info("refused the checkpoint settings", "pool", pool, "caller", caller.String())
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		settings, err := r.CheckpointSettings(req.Context(), pool)
		switch {
		case apierrors.IsNotFound(err):
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		case err != nil:
			log.Error(err, "making the checkpoint settings", "pool", pool)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(settings)
	})
}
