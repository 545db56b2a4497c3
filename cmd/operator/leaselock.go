package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/leaderelection"
)

// useLeaseLock gives the manager options the operator's Lease lock: controller-runtime's own,
// wrapped in releasingLock. It returns what stops the lock's event recorder, to be called once
// the manager has returned (its last event is the Lease given back).
func useLeaseLock(cfg *rest.Config, scheme *runtime.Scheme, o *ctrl.Options) (stop func(), err error) {
	if !o.LeaderElection {
		return func() {}, nil
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the leader election's event client: %w", err)
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: clientset.CoreV1().Events("")})
	renewDeadline := 10 * time.Second // controller-runtime's default
	if o.RenewDeadline != nil {
		renewDeadline = *o.RenewDeadline
	}
	lock, err := leaderelection.NewResourceLock(cfg, eventRecorders{broadcaster, scheme}, leaderelection.Options{
		LeaderElection:          true,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectionNamespace,
		RenewDeadline:           renewDeadline,
	})
	if err != nil {
		broadcaster.Shutdown()
		return nil, fmt.Errorf("creating the leader election's Lease lock: %w", err)
	}
	o.LeaderElectionResourceLockInterface = releasingLock{lock}
	return broadcaster.Shutdown, nil
}

// eventRecorders records the leader election's events ("became leader") on the Lease, as
// controller-runtime's manager would.
type eventRecorders struct {
	broadcaster record.EventBroadcaster
	scheme      *runtime.Scheme
}

func (e eventRecorders) GetEventRecorderFor(name string) record.EventRecorder {
	return e.broadcaster.NewRecorder(e.scheme, corev1.EventSource{Component: name})
}

// releasingLock is a Lease lock whose release survives a renewal it did not see land.
//
// client-go gives the Lease back (ReleaseOnCancel) by updating the copy of it that its last
// successful renewal returned. Stopping cancels the renewal in flight; the API server may have
// applied it all the same, and then the release conflicts, client-go logs "Failed to release
// lock" and the Lease stays held until it expires (15 s by default) while every other replica
// waits. On that conflict the release reads the Lease again and, if this replica still holds
// it, gives it back.
type releasingLock struct{ resourcelock.Interface }

func (l releasingLock) Update(ctx context.Context, record resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, record)
	// Only the release writes a record without a holder: renewals and acquisitions name one.
	if record.HolderIdentity != "" || !apierrors.IsConflict(err) {
		return err
	}
	current, _, getErr := l.Get(ctx) // also refreshes the lock's copy of the Lease
	if getErr != nil {
		return errors.Join(err, fmt.Errorf("reading the Lease again to give it back: %w", getErr))
	}
	if current.HolderIdentity != l.Identity() {
		return nil // another replica holds it now: there is nothing of this one's to give back
	}
	record.LeaderTransitions = current.LeaderTransitions
	return l.Interface.Update(ctx, record)
}
