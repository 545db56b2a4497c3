package controllers

import (
	"context"
	"time"

	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// DatasetView is what the mounts of a Dataset show: one tree on every node of its pool (a new
// mount takes the listing another node's mount shows; a sync gives every node the listing one
// worker took), which the Dataset's status counts once a node mounts it.
type DatasetView struct {
	Files, Bytes int64
	// Worker is the worker whose mount was described.
	Worker string
}

// viewMemo remembers, by Dataset UID, the last answer of the workers about what their mounts
// show, so that they are asked about once a reachCheck.
type viewMemo = uidMemo[viewRecord]

type viewRecord struct {
	at time.Time
	// view is nil when no worker mounted the Dataset.
	view *DatasetView
}

// mountedView is what the mounts of a served Dataset show, asked of its pool's workers at most
// once a reachCheck; nil when no node mounts it (or the workers cannot be asked, and never
// answered before), and the status then counts the operator's own listing.
func (r *DatasetReconciler) mountedView(ctx context.Context, ds *datav1alpha1.Dataset) *DatasetView {
	if r.Syncer == nil || !ds.ReadsStores() || ds.Status.PersistentVolumeClaimName == "" {
		return nil
	}
	now := time.Now()
	last, known := r.views.load(ds.UID)
	if known && now.Sub(last.at) < r.reachCheck() {
		return last.view
	}
	view, mounted, err := r.Syncer.DescribeDataset(ctx, ds.Spec.TierPoolName, string(ds.UID))
	if err != nil {
		// Counted again at the next look; meanwhile the last answer stands.
		ctrllog.FromContext(ctx).V(1).Info("could not ask the workers what their mounts of the Dataset show", "error", err.Error())
		return last.view
	}
	rec := viewRecord{at: now}
	if mounted {
		rec.view = &view
	}
	r.views.put(ds.UID, rec)
	return rec.view
}
