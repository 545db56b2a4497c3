package main

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/testenv"
)

// startAPIServer starts an API server with namespace strata-system; !ok if this machine has none.
func startAPIServer(t *testing.T, g *WithT) (restConfig *rest.Config, c client.Client, scheme *runtime.Scheme, ok bool) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		testenv.Lacking(t, "no KUBEBUILDER_ASSETS, so no API server to elect a leader with: run the tests with `make test`")
		return nil, nil, nil, false
	}
	env := &envtest.Environment{}
	restConfig, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = env.Stop() })
	scheme = runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	g.Expect(datav1alpha1.AddToScheme(scheme)).To(Succeed())
	c, err = client.New(restConfig, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "strata-system"}})).To(Succeed())
	return restConfig, c, scheme, true
}

// replica is one operator process's manager, built with the operator's own options.
type replica struct {
	started chan struct{} // once the manager runs, leader or not
	leading chan struct{} // once it runs what only the leader runs
	stop    context.CancelFunc
	stopped chan struct{} // closed once the manager returned, err
	err     error
}

func startReplica(t *testing.T, g *WithT, restConfig *rest.Config, opts options, scheme *runtime.Scheme) *replica {
	t.Helper()
	cfg := managerOptions(opts, scheme, labels.Everything())
	// Short terms, so that a handover takes seconds here; the operator keeps the defaults.
	lease, renew, retry := 2*time.Second, time.Second, 200*time.Millisecond
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = &lease, &renew, &retry
	stopLeaseEvents, err := useLeaseLock(restConfig, scheme, &cfg)
	g.Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(restConfig, cfg)
	g.Expect(err).NotTo(HaveOccurred())
	r := &replica{started: make(chan struct{}), leading: make(chan struct{}), stopped: make(chan struct{})}
	g.Expect(mgr.Add(everyReplica(func(ctx context.Context) error { close(r.started); <-ctx.Done(); return nil }))).To(Succeed())
	g.Expect(mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { close(r.leading); <-ctx.Done(); return nil }))).To(Succeed())
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.err = mgr.Start(ctx); stopLeaseEvents(); close(r.stopped) }()
	t.Cleanup(func() { cancel(); <-r.stopped })
	return r
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestOneReplicaOfTheOperatorReconcilesAtATime: with leader election as the operator sets it
// up, a second replica waits while the first leads, and takes over as soon as the first stops
// (which gives the Lease back rather than let it expire).
func TestOneReplicaOfTheOperatorReconcilesAtATime(t *testing.T) {
	g := NewWithT(t)
	restConfig, c, scheme, ok := startAPIServer(t, g)
	if !ok {
		return
	}
	opts := options{namespace: "strata-system", leaderElect: true, leaderElectionNamespace: "strata-system", metricsAddr: "0", probeAddr: "0"}

	first := startReplica(t, g, restConfig, opts, scheme)
	g.Eventually(func() bool { return isClosed(first.leading) }).WithTimeout(30*time.Second).Should(BeTrue(), "the first replica leads")
	lease := &coordinationv1.Lease{}
	g.Expect(c.Get(context.Background(), client.ObjectKey{Namespace: "strata-system", Name: leaderElectionID}, lease)).To(Succeed())
	holder := *lease.Spec.HolderIdentity

	second := startReplica(t, g, restConfig, opts, scheme)
	g.Eventually(func() bool { return isClosed(second.started) }).WithTimeout(30 * time.Second).Should(BeTrue())
	// The second replica asks for the Lease every 200 ms from its start, and the first renews
	// it: over many of its tries, it never leads.
	g.Consistently(func() bool { return isClosed(second.leading) }).WithTimeout(2*time.Second).Should(BeFalse(), "two replicas never lead at once")
	g.Expect(c.Get(context.Background(), client.ObjectKeyFromObject(lease), lease)).To(Succeed())
	g.Expect(*lease.Spec.HolderIdentity).To(Equal(holder))

	first.stop()
	<-first.stopped
	g.Expect(first.err).To(Succeed())
	g.Expect(c.Get(context.Background(), client.ObjectKeyFromObject(lease), lease)).To(Succeed())
	g.Expect(lease.Spec.HolderIdentity).To(Or(BeNil(), HaveValue(Not(Equal(holder)))),
		"the first replica gave the Lease back as it stopped: the next need not wait for it to expire")
	g.Eventually(func() bool { return isClosed(second.leading) }).WithTimeout(30*time.Second).Should(BeTrue(), "the second replica takes over")
}

// TestTheOperatorGivesItsLeaseBackAfterARenewalItDidNotSeeLand: stopping cancels a renewal in
// flight that the API server may still apply; the release that follows must give the Lease
// back all the same (client-go's own conflicts, and the next replica waits for the Lease to
// expire), and must not take a Lease another replica holds by then.
func TestTheOperatorGivesItsLeaseBackAfterARenewalItDidNotSeeLand(t *testing.T) {
	g := NewWithT(t)
	restConfig, c, scheme, ok := startAPIServer(t, g)
	if !ok {
		return
	}
	ctx := context.Background()
	opts := ctrl.Options{LeaderElection: true, LeaderElectionID: leaderElectionID, LeaderElectionNamespace: "strata-system"}
	stop, err := useLeaseLock(restConfig, scheme, &opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(stop)
	lock := opts.LeaderElectionResourceLockInterface
	now := metav1.Now()
	g.Expect(lock.Create(ctx, resourcelock.LeaderElectionRecord{
		HolderIdentity: lock.Identity(), LeaseDurationSeconds: 15, AcquireTime: now, RenewTime: now,
	})).To(Succeed())
	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: "strata-system", Name: leaderElectionID}
	landBehindTheLock := func(holder string) {
		t.Helper()
		g.Expect(c.Get(ctx, key, lease)).To(Succeed())
		lease.Spec.HolderIdentity = &holder
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		g.Expect(c.Update(ctx, lease)).To(Succeed())
	}
	release := resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1, AcquireTime: now, RenewTime: now}

	landBehindTheLock(lock.Identity())
	g.Expect(lock.(releasingLock).Interface.Update(ctx, release)).To(MatchError(apierrors.IsConflict, "IsConflict"),
		"client-go's lock alone fails to give the Lease back")
	g.Expect(lock.Update(ctx, release)).To(Succeed())
	g.Expect(c.Get(ctx, key, lease)).To(Succeed())
	g.Expect(lease.Spec.HolderIdentity).To(Or(BeNil(), HaveValue(BeEmpty())), "the Lease was given back")

	landBehindTheLock("another-replica")
	g.Expect(lock.Update(ctx, release)).To(Succeed())
	g.Expect(c.Get(ctx, key, lease)).To(Succeed())
	g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal("another-replica")), "the release leaves another replica's Lease alone")
}
