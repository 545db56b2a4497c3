package controllers

import (
	"context"
	"errors"
	"fmt"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

// setRecovery tells the master, for each output of l, what a read of one of its files lost
// with its node does (masterpb.DatasetRecovery): wait as long as the output's CachePolicy says
// (spec.recovery.readWait) for l to write it again, or fail at once once l gave up recomputing
// it; and that what l's pods write is committed per attempt (see lineage_attempts.go). Workers
// ask the master when a read finds a file lost, and when a pod seals a file; the master forgets
// an output for a recomputation, so this is said before every Job of l runs, and again on
// every reconcile that finds it missing. It returns what the master could not be told.
func (r *LineageReconciler) setRecovery(ctx context.Context, l *datav1alpha1.Lineage) error {
	if r.Master == nil {
		return nil
	}
	var errs []error
	failed := ""
	if c := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionRecomputing); c != nil && c.Reason == ReasonRecomputationLimit {
		failed = "Lineage " + l.Name + " gave up recomputing it: " + c.Message
	}
	for _, out := range l.Spec.Outputs {
		ds := &datav1alpha1.Dataset{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: out}, ds); err != nil || !ds.DeletionTimestamp.IsZero() {
			continue // reported by the Ready condition; or forgotten at the master as it goes
		}
		want := &masterpb.DatasetRecovery{WaitSeconds: r.readWaitSeconds(ctx, ds), Failed: failed, CommitPerAttempt: true}
		name := datav1alpha1.MasterDatasetName(l.Namespace, out, string(ds.UID))
		cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
		// An output that held files and that the master no longer knows is lost, or waits for the
		// master's restore: registered now, it would look written and empty. Its recomputation
		// registers it.
		st := outputStatus(l, out)
		mayRegister := st.Bytes == 0 || st.State == datav1alpha1.OutputRecomputing
		err := setRecoveryAtMaster(cctx, r.Master, name, datav1alpha1.MasterDatasetRoot(l.Namespace, out, string(ds.UID)), want, mayRegister)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("telling the master how output %s is written and recovered: %w", out, err))
		}
	}
	return errors.Join(errs...)
}

// readWaitSeconds is the recovery.readWait of ds's CachePolicy in whole seconds (rounded up), or
// the default when ds names none (or one that does not exist: its own status says so).
func (r *LineageReconciler) readWaitSeconds(ctx context.Context, ds *datav1alpha1.Dataset) int64 {
	wait := datav1alpha1.DefaultRecoveryReadWait
	if ds.Spec.CachePolicyName != "" {
		cp := &datav1alpha1.CachePolicy{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: ds.Spec.CachePolicyName}, cp); err == nil {
			wait = cp.Spec.Recovery.ReadWaitOr(wait)
		}
	}
	return int64(math.Ceil(wait.Seconds()))
}

// setRecoveryAtMaster sets the Dataset's recovery at the master unless it is set so already;
// a Dataset the master does not know is registered with it only if mayRegister.
func setRecoveryAtMaster(ctx context.Context, master LineageMaster, name, root string, want *masterpb.DatasetRecovery, mayRegister bool) error {
	ds, err := master.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name, StaleOk: true})
	switch {
	case err == nil && proto.Equal(ds.GetRecovery(), want):
		return nil
	case status.Code(err) == codes.NotFound && !mayRegister:
		return nil
	case err != nil && status.Code(err) != codes.NotFound:
		return err
	}
	_, err = master.SetDatasetRecovery(ctx, &masterpb.SetDatasetRecoveryRequest{Name: name, Root: root, Recovery: want})
	return err
}
