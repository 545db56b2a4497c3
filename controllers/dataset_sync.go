package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// Reasons of the Synced condition and events.
const (
	ReasonSynced     = "Synced"
	ReasonSyncFailed = "SyncFailed"
)

// syncRetry is how soon a sync that failed on some node is tried again: the worker may be
// restarting, the source back up.
const syncRetry = 30 * time.Second

// DatasetSyncer asks the workers of a TierPool to sync their mounts of a Dataset with its
// source, and what their mounts show (WorkerSyncs over the workers' data-plane port).
type DatasetSyncer interface {
	SyncDataset(ctx context.Context, pool, uid string) (SyncOutcome, error)
	// DescribeDataset finds a worker of the pool that mounts the Dataset and says what its
	// mount shows; mounted is false when none does.
	DescribeDataset(ctx context.Context, pool, uid string) (view DatasetView, mounted bool, err error)
	// ForgetDataset tells every live worker of the pool that the Dataset is deleted, so that
	// none keeps its listing; it names the workers that could not be told.
	ForgetDataset(ctx context.Context, pool, uid string) error
}

// SyncOutcome is what the workers of a pool answered to a sync.
type SyncOutcome struct {
	// Mounts counts the workers that mount the Dataset and synced it.
	Mounts int32
	// Added, Removed and Changed are the largest counts any mount reported: mounts list the
	// same source at nearly the same time, so they agree but for changes made meanwhile.
	Added, Removed, Changed int64
	// Failures are the workers that could not sync, each with why.
	Failures []string
	// View is the tree every mount shows after the sync: one worker listed the source, the
	// others took its listing. Nil when no worker mounts the Dataset.
	View *DatasetView
}

// NewDatasetSyncCounter registers the counter of Dataset syncs on reg.
func NewDatasetSyncCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_operator_dataset_syncs_total",
		Help: "Syncs of Datasets' mounts with their sources the operator ran, by result: synced (every node's mount) or failed (some node kept its tree).",
	}, []string{"result"})
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("registering the Dataset sync counter: %w", err)
	}
	return c, nil
}

// syncDue says whether a Dataset's mounts must sync now (a new request in its annotation, or
// its interval passed since the last sync, or since its creation), and when the next interval
// sync is due (zero if it has none).
func syncDue(ds *datav1alpha1.Dataset, now time.Time) (due bool, next time.Time) {
	st := ds.Status.Sync
	if req := ds.Annotations[datav1alpha1.AnnotationSyncRequested]; req != "" && (st == nil || st.Request != req) {
		due = true
	}
	if ds.Spec.Sync == nil || ds.Spec.Sync.Interval == nil || ds.Spec.Sync.Interval.Duration <= 0 {
		return due, time.Time{}
	}
	last := ds.CreationTimestamp.Time
	if st != nil && st.LastSyncTime != nil {
		last = st.LastSyncTime.Time
	}
	next = last.Add(ds.Spec.Sync.Interval.Duration)
	return due || !now.Before(next), next
}

// syncMounts runs a sync of the Dataset's mounts if one is due, records it in the status, the
// Synced condition and an event, and returns when to look again for the next (0 for never).
// It reports whether the mounts changed, so that the source is probed afresh.
func (r *DatasetReconciler) syncMounts(ctx context.Context, ds *datav1alpha1.Dataset) (requeue time.Duration, synced bool) {
	now := time.Now()
	due, next := syncDue(ds, now)
	if !next.IsZero() && next.After(now) {
		requeue = next.Sub(now)
	}
	if !due {
		return requeue, false
	}
	if r.Syncer == nil {
		setSyncFailed(ds, "the operator runs without a master, so it knows no workers to sync: install Strata with its master (the chart's default)")
		return 0, false
	}
	out, err := r.Syncer.SyncDataset(ctx, ds.Spec.TierPoolName, string(ds.UID))
	if err != nil {
		out.Failures = append(out.Failures, err.Error())
	}
	if len(out.Failures) > 0 {
		r.countSync("failed")
		msg := fmt.Sprintf("the last sync failed, so the mounts keep the tree they had; it is tried again every %s: %s",
			syncRetry, strings.Join(out.Failures, "; "))
		if changed := setSyncFailed(ds, msg); changed {
			r.Recorder.Event(ds, corev1.EventTypeWarning, ReasonSyncFailed, msg)
		}
		return syncRetry, false
	}
	r.countSync("synced")
	r.views.put(ds.UID, viewRecord{at: now, view: out.View})
	req := ds.Annotations[datav1alpha1.AnnotationSyncRequested]
	msg := setSynced(ds, out, req, now)
	if out.Added+out.Removed+out.Changed > 0 || req != "" {
		r.Recorder.Event(ds, corev1.EventTypeNormal, ReasonSynced, msg)
	}
	if ds.Spec.Sync != nil && ds.Spec.Sync.Interval != nil && ds.Spec.Sync.Interval.Duration > 0 {
		requeue = ds.Spec.Sync.Interval.Duration
	}
	return requeue, true
}

func (r *DatasetReconciler) countSync(result string) {
	if r.SyncCounter != nil {
		r.SyncCounter.WithLabelValues(result).Inc()
	}
}

// merge adds one mount's answer to a pool's.
func (o *SyncOutcome) merge(added, removed, changed int64) {
	o.add(SyncOutcome{Mounts: 1, Added: added, Removed: removed, Changed: changed})
}

// add adds the answers of other workers of the pool.
func (o *SyncOutcome) add(p SyncOutcome) {
	o.Mounts += p.Mounts
	o.Added, o.Removed, o.Changed = max(o.Added, p.Added), max(o.Removed, p.Removed), max(o.Changed, p.Changed)
	o.Failures = append(o.Failures, p.Failures...)
}

// syncEach calls sync for every worker, concurrently, and gathers the answers: the workers'
// failures are named by worker, in order.
func syncEach(ctx context.Context, workers []string, syncOne func(ctx context.Context, worker string) (mounted bool, added, removed, changed int64, err error)) SyncOutcome {
	var (
		mu  sync.Mutex
		out SyncOutcome
		wg  sync.WaitGroup
	)
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mounted, added, removed, changed, err := syncOne(ctx, w)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				out.Failures = append(out.Failures, fmt.Sprintf("worker %s: %v", w, err))
			case mounted:
				out.merge(added, removed, changed)
			}
		}()
	}
	wg.Wait()
	slices.Sort(out.Failures)
	return out
}
