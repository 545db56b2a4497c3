package controllers

import (
	"context"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

// setRecovery tells the master, for each written output of l, what a read of one of its files
// lost with its node does (masterpb.DatasetRecovery): wait as long as the output's CachePolicy
// says (spec.recovery.readWait) for l to write it again, or fail at once once l gave up
// recomputing it. Workers ask the master when a read finds a file lost; the master forgets an
// output for a recomputation, so this is said again on every reconcile that finds it missing.
// A master that cannot be reached is tried again on the next reconcile.
func (r *LineageReconciler) setRecovery(ctx context.Context, l *datav1alpha1.Lineage) {
	if r.Master == nil {
		return
	}
	failed := ""
	if c := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionRecomputing); c != nil && c.Reason == ReasonRecomputationLimit {
		failed = "Lineage " + l.Name + " gave up recomputing it: " + c.Message
	}
	for _, out := range l.Spec.Outputs {
		ds := &datav1alpha1.Dataset{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: out}, ds); err != nil || !ds.DeletionTimestamp.IsZero() {
			continue // reported by the Ready condition; or forgotten at the master as it goes
		}
		want := &masterpb.DatasetRecovery{WaitSeconds: r.readWaitSeconds(ctx, ds), Failed: failed}
		name := datav1alpha1.MasterDatasetName(l.Namespace, out, string(ds.UID))
		cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
		err := setRecoveryAtMaster(cctx, r.Master, name, datav1alpha1.MasterDatasetRoot(l.Namespace, out, string(ds.UID)), want)
		cancel()
		if err != nil {
			ctrl.LoggerFrom(ctx).Info("cannot tell the master how readers of a lost output wait; trying again on the next reconcile",
				"output", out, "error", err.Error())
		}
	}
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

// setRecoveryAtMaster sets the Dataset's recovery at the master unless it is set so already.
func setRecoveryAtMaster(ctx context.Context, master LineageMaster, name, root string, want *masterpb.DatasetRecovery) error {
	ds, err := master.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name, StaleOk: true})
	switch {
	case err == nil && proto.Equal(ds.GetRecovery(), want):
		return nil
	case err != nil && status.Code(err) != codes.NotFound:
		return err
	}
	_, err = master.SetDatasetRecovery(ctx, &masterpb.SetDatasetRecoveryRequest{Name: name, Root: root, Recovery: want})
	return err
}
