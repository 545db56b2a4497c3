package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/understore"
)

// Reasons of an output Dataset's CheckpointTargetReachable condition.
const (
	ReasonCheckpointTargetReachable   = "TargetReachable"
	ReasonCheckpointAccessDenied      = "CheckpointTargetAccessDenied"
	ReasonCheckpointTargetNotFound    = "CheckpointTargetNotFound"
	ReasonCheckpointTargetUnreachable = "CheckpointTargetUnreachable"
)

// checkpointTargetCondition checks where an output is checkpointed (spec.checkpoint): that its
// Secret holds the keys, and that the bucket answers to them. It is nil for a Dataset without a
// spec.checkpoint. A target that fails keeps the output in memory alone, mountable and written
// as before: it does not make the Dataset unready.
func (r *DatasetReconciler) checkpointTargetCondition(ctx context.Context, ds *datav1alpha1.Dataset) (*metav1.Condition, error) {
	target := ds.Spec.Checkpoint
	if target == nil || ds.Spec.Lineage == nil {
		return nil, nil
	}
	cond := &metav1.Condition{Type: datav1alpha1.ConditionCheckpointTargetReachable, ObservedGeneration: ds.Generation,
		Status: metav1.ConditionFalse}
	fail := func(reason, format string, args ...any) (*metav1.Condition, error) {
		cond.Reason = reason
		cond.Message = fmt.Sprintf(format, args...) + "; until then its files stay in memory alone, and lineage recovers what is lost"
		return cond, nil
	}
	secret := &corev1.Secret{}
	if found, err := r.exists(ctx, secret, ds.Namespace, target.SecretRef.Name); err != nil || !found {
		if err != nil {
			return nil, err
		}
		return fail(ReasonSecretNotFound, "Secret %q of spec.checkpoint does not exist in namespace %s: create it with the keys %s and %s",
			target.SecretRef.Name, ds.Namespace, understore.CredentialAccessKeyID, understore.CredentialSecretAccessKey)
	}
	creds := map[string]string{}
	var missing []string
	for _, key := range []string{understore.CredentialAccessKeyID, understore.CredentialSecretAccessKey} {
		if len(secret.Data[key]) == 0 {
			missing = append(missing, key)
		}
	}
	if len(missing) > 0 {
		return fail(ReasonSecretIncomplete, "Secret %q of spec.checkpoint has no %v: add them", target.SecretRef.Name, missing)
	}
	for k, v := range secret.Data {
		creds[k] = string(v)
	}

	now := time.Now()
	if _, ok := r.targetProbes.get(ds.UID, ds.Generation, secret.ResourceVersion, now); !ok {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		if err := probeTarget(pctx, understore.Source{URI: target.URI, Endpoint: target.Endpoint, Region: target.Region, Credentials: creds}); err != nil {
			switch {
			case errors.Is(err, understore.ErrAccessDenied):
				return fail(ReasonCheckpointAccessDenied,
					"the under-store refuses the keys of Secret %q: they must allow listing and writing under %s (%v)", target.SecretRef.Name, target.URI, err)
			case errors.Is(err, understore.ErrNotFound) || errors.Is(err, understore.ErrInvalidPath):
				return fail(ReasonCheckpointTargetNotFound, "%s cannot be written: create the bucket, or fix spec.checkpoint.uri (%v)", target.URI, err)
			default:
				return fail(ReasonCheckpointTargetUnreachable,
					"cannot reach %s: check spec.checkpoint.endpoint and that the cluster can reach it (%v)", target.URI, err)
			}
		}
		r.targetProbes.put(ds.UID, probeRecord{generation: ds.Generation, secretVersion: secret.ResourceVersion, at: now})
	}
	cond.Status, cond.Reason = metav1.ConditionTrue, ReasonCheckpointTargetReachable
	policy := "the built-in defaults (Edge, edge fraction 0.5)"
	if ds.Spec.CachePolicyName != "" {
		policy = fmt.Sprintf("CachePolicy %s", ds.Spec.CachePolicyName)
	}
	cond.Message = fmt.Sprintf("its files are checkpointed to %s as %s plans, and read back from there when lost", target.URI, policy)
	return cond, nil
}

// probeTarget lists the first object under a checkpoint target: the bucket exists and the
// keys may list it. An empty prefix is fine: nothing was checkpointed yet.
func probeTarget(ctx context.Context, src understore.Source) error {
	store, err := understore.Open(ctx, src)
	if err != nil {
		return err
	}
	for _, err := range store.List(ctx, "") {
		return err
	}
	return nil
}
