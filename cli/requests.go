package cli

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/humanize"
)

// Sync asks the operator to sync the mounts of a Dataset with its source now, and says what
// the sync found.
func (c *CLI) Sync(ctx context.Context, name string) error {
	ds, err := c.dataset(ctx, name)
	if err != nil {
		return err
	}
	if !ds.ReadsStores() {
		return fmt.Errorf("the Dataset %s/%s is written by pods (an output), so it has no source to sync with", ds.Namespace, ds.Name)
	}
	before := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionSynced)
	token, err := c.request(ctx, ds, datav1alpha1.AnnotationSyncRequested, nil)
	if err != nil {
		return err
	}
	c.printf("asked for a sync of Dataset %s/%s; waiting for it…\n", ds.Namespace, ds.Name)
	ds, err = c.await(ctx, ds, func(d *datav1alpha1.Dataset) (bool, error) {
		if d.Status.Sync != nil && d.Status.Sync.Request == token {
			return true, nil
		}
		if now := meta.FindStatusCondition(d.Status.Conditions, datav1alpha1.ConditionSynced); failedAfter(now, before) {
			return false, fmt.Errorf("the sync of Dataset %s/%s failed: %s", d.Namespace, d.Name, now.Message)
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	s := ds.Status.Sync
	if s.Mounts == 0 {
		c.printf("no node mounts the Dataset: the next node to mount it lists the source\n")
		return nil
	}
	c.printf("synced on %d node(s): %d file(s) added, %d removed, %d changed; the Dataset holds %d file(s), %s\n",
		s.Mounts, s.Added, s.Removed, s.Changed, ds.Status.Files, humanize.Bytes(ds.Status.TotalBytes))
	return nil
}

// failedAfter says whether a condition reports a failure that is news since before: it turned
// False, or says something else than it did.
func failedAfter(now, before *metav1.Condition) bool {
	if now == nil || now.Status != metav1.ConditionFalse {
		return false
	}
	return before == nil || before.Status != metav1.ConditionFalse || before.Message != now.Message ||
		now.LastTransitionTime.After(before.LastTransitionTime.Time)
}

// Load asks the operator to read a Dataset once more into the cache (a preload Job), and waits
// until it has.
func (c *CLI) Load(ctx context.Context, name string) error {
	ds, err := c.dataset(ctx, name)
	if err != nil {
		return err
	}
	if !ds.ReadsStores() {
		return fmt.Errorf("the Dataset %s/%s is written by pods (an output): what they write is cached as it is written", ds.Namespace, ds.Name)
	}
	if ready := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionReady); ready == nil || ready.Status != metav1.ConditionTrue {
		why := "the operator has not looked at it yet"
		if ready != nil {
			why = ready.Reason + ": " + ready.Message
		}
		return fmt.Errorf("the Dataset %s/%s cannot be loaded before it is Ready (%s)", ds.Namespace, ds.Name, why)
	}
	token, err := c.request(ctx, ds, datav1alpha1.AnnotationLoadRequested, nil)
	if err != nil {
		return err
	}
	c.printf("asked for a load of Dataset %s/%s; waiting for it (a Job of its namespace reads every file once)…\n", ds.Namespace, ds.Name)
	// A failure counts once the operator took up this request: the condition may still show
	// how an earlier load ended.
	started := false
	ds, err = c.await(ctx, ds, func(d *datav1alpha1.Dataset) (bool, error) {
		cond := meta.FindStatusCondition(d.Status.Conditions, datav1alpha1.ConditionPreloaded)
		if cond == nil {
			return false, nil
		}
		switch cond.Reason {
		case datav1alpha1.ReasonPreloaded:
			return d.Status.LoadRequest == token, nil
		case datav1alpha1.ReasonPreloading:
			started = true
		case datav1alpha1.ReasonPreloadNotAvailable:
			return false, fmt.Errorf("the Dataset %s/%s cannot be loaded: %s", d.Namespace, d.Name, cond.Message)
		case datav1alpha1.ReasonPreloadFailed:
			if started {
				return false, fmt.Errorf("the load of Dataset %s/%s failed: %s", d.Namespace, d.Name, cond.Message)
			}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	c.printf("loaded: every file was read once; the workers hold %s of %s (%s)\n",
		humanize.Bytes(ds.Status.CachedBytes), humanize.Bytes(ds.Status.TotalBytes), cachedShare(ds))
	return nil
}

// cachedShare is the Dataset's cached share, as its status gives it.
func cachedShare(ds *datav1alpha1.Dataset) string {
	if ds.Status.CachedPercentage == "" {
		return "0%"
	}
	return ds.Status.CachedPercentage
}
