package controllers

import (
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/master/masterpb"
)

// testWorkerList plays the master's list of workers for the Dataset reconciler's syncs.
type testWorkerList struct {
	mu      sync.Mutex
	workers []*masterpb.Worker
}

func (l *testWorkerList) ListWorkers(context.Context, *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return &masterpb.ListWorkersResponse{Workers: append([]*masterpb.Worker(nil), l.workers...)}, nil
}

func (l *testWorkerList) add(w *masterpb.Worker) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.workers = append(l.workers, w)
}

func (l *testWorkerList) remove(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.workers = slices.DeleteFunc(l.workers, func(w *masterpb.Worker) bool { return w.GetId() == id })
}

// syncingWorker is a worker's data-plane port as the operator meets it: gRPC over mutual TLS
// with a worker's certificate of the test CA, the worker's authorization policy, and a sync
// service whose answers the spec sets.
type syncingWorker struct {
	addr string
	mu   sync.Mutex
	// answer is what the next syncs get.
	answer *workerpb.SyncDatasetResponse
	err    error
	calls  []string // the UIDs asked for
	// listingFrom are the listing_from of each sync asked for.
	listingFrom []string
	// shows is what the worker's mount shows, when asked (DescribeDataset).
	shows *workerpb.DescribeDatasetResponse
	// holds is what it holds of a selection (DescribeDataset with one), and selections the
	// paths of each selection asked for.
	holds      *workerpb.SelectionHeld
	selections [][]string
	// forgotten are the UIDs of the deleted Datasets the worker was told of.
	forgotten []string
	// tree is what its mount shows, for GetListing; nil: it mounts nothing.
	tree []*workerpb.ListedObject
	// kept is the listing it keeps of a Dataset it does not mount any more; nil: none.
	kept []*workerpb.ListedObject
}

// keep makes the worker keep a listing of tree, with no mount.
func (w *syncingWorker) keep(tree ...*workerpb.ListedObject) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.kept = append([]*workerpb.ListedObject{}, tree...)
}

// mount makes the worker's mount show tree (GetListing of a mounted Dataset).
func (w *syncingWorker) mount(tree ...*workerpb.ListedObject) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tree = append([]*workerpb.ListedObject{}, tree...)
}

func (w *syncingWorker) GetListing(req *workerpb.GetListingRequest, stream workerpb.Worker_GetListingServer) error {
	w.mu.Lock()
	tree := w.tree
	if tree == nil && !req.GetMountedOnly() {
		tree = w.kept
	}
	w.mu.Unlock()
	if tree == nil {
		return status.Errorf(codes.NotFound, "no listing of Dataset %s here (mounted only: %v)", req.GetUid(), req.GetMountedOnly())
	}
	return stream.Send(&workerpb.GetListingResponse{TakenUnixNano: time.Now().UnixNano(), Objects: tree})
}

func (w *syncingWorker) SyncDataset(_ context.Context, req *workerpb.SyncDatasetRequest) (*workerpb.SyncDatasetResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if req.GetForget() {
		w.forgotten = append(w.forgotten, req.GetUid())
		return &workerpb.SyncDatasetResponse{}, nil
	}
	w.calls = append(w.calls, req.GetUid())
	w.listingFrom = append(w.listingFrom, req.GetListingFrom())
	return w.answer, w.err
}

func (w *syncingWorker) DescribeDataset(_ context.Context, req *workerpb.DescribeDatasetRequest) (*workerpb.DescribeDatasetResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if req.GetSelection() == nil {
		return w.shows, nil
	}
	w.selections = append(w.selections, req.GetSelection().GetPaths())
	resp := proto.Clone(w.shows).(*workerpb.DescribeDatasetResponse)
	resp.Selected = w.holds
	return resp, nil
}

// hold makes the worker's mount say it holds held of any selection.
func (w *syncingWorker) hold(held *workerpb.SelectionHeld) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.shows.Mounted = true
	w.holds = held
}

func (w *syncingWorker) selectionsAsked() [][]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.selections)
}

func (w *syncingWorker) show(files, bytes int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.shows = &workerpb.DescribeDatasetResponse{Mounted: true, Files: files, Bytes: bytes}
}

func (w *syncingWorker) forgottenUIDs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.forgotten)
}

func (w *syncingWorker) listingsFrom() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.listingFrom)
}

func (w *syncingWorker) set(answer *workerpb.SyncDatasetResponse, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.answer, w.err = answer, err
}

func (w *syncingWorker) callCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.calls)
}

type listingService struct {
	workerpb.UnimplementedWorkerServer
	w *syncingWorker
}

func (s listingService) GetListing(req *workerpb.GetListingRequest, stream workerpb.Worker_GetListingServer) error {
	return s.w.GetListing(req, stream)
}

type syncService struct {
	workerpb.UnimplementedDatasetSyncServer
	w *syncingWorker
}

func (s syncService) SyncDataset(ctx context.Context, req *workerpb.SyncDatasetRequest) (*workerpb.SyncDatasetResponse, error) {
	return s.w.SyncDataset(ctx, req)
}

func (s syncService) DescribeDataset(ctx context.Context, req *workerpb.DescribeDatasetRequest) (*workerpb.DescribeDatasetResponse, error) {
	return s.w.DescribeDataset(ctx, req)
}

// startSyncingWorker serves a worker of pool on node until the spec ends, and lists it.
func startSyncingWorker(pool, node string) *syncingWorker {
	creds := testCA.Credentials(GinkgoT(), pki.Worker(pool, node))
	authorizer, err := authz.New("worker", dataplane.Policy, nil, logr.Discard())
	Expect(err).NotTo(HaveOccurred())
	srv := grpc.NewServer(append([]grpc.ServerOption{creds.ServerOption()}, authorizer.ServerOptions()...)...)
	w := &syncingWorker{answer: &workerpb.SyncDatasetResponse{}, shows: &workerpb.DescribeDatasetResponse{}}
	workerpb.RegisterDatasetSyncServer(srv, syncService{w: w})
	workerpb.RegisterWorkerServer(srv, listingService{w: w})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis) // until Stop
	}()
	DeferCleanup(func() { srv.Stop(); <-served })
	w.addr = lis.Addr().String()
	syncWorkers.add(&masterpb.Worker{Id: pool + "/" + node, Address: w.addr, Node: node, State: masterpb.WorkerState_WORKER_STATE_ALIVE})
	return w
}

var _ = Describe("Syncing a Dataset's mounts with its source", func() {
	var namespace, poolName string

	BeforeEach(func() {
		namespace, poolName = newTenant("sync-", "")
	})

	dataset := func(name string) *datav1alpha1.Dataset {
		ds := s3DatasetOf(namespace, name, poolName, map[string]int{"a.bin": 1000})
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		// Served (no CSI driver in envtest is the only thing missing): syncs may run.
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Files).To(BeEquivalentTo(1))
		}).Should(Succeed())
		return ds
	}

	request := func(ds *datav1alpha1.Dataset, value string) {
		patch := client.MergeFrom(ds.DeepCopy())
		if ds.Annotations == nil {
			ds.Annotations = map[string]string{}
		}
		ds.Annotations[datav1alpha1.AnnotationSyncRequested] = value
		Expect(k8sClient.Patch(ctx, ds, patch)).To(Succeed())
	}

	syncedCondition := func(ds *datav1alpha1.Dataset, status metav1.ConditionStatus) metav1.Condition {
		var cond metav1.Condition
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			c := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionSynced)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(status))
			cond = *c
		}).Should(Succeed())
		return cond
	}

	It("tells every worker of the pool to drop its listing of a Dataset that is deleted", func() {
		workers := []*syncingWorker{startSyncingWorker(poolName, "node-a"), startSyncingWorker(poolName, "node-b")}
		other := startSyncingWorker("pool-of-someone-else-"+namespace, "node-a")
		ds := dataset("deleted")
		Expect(k8sClient.Delete(ctx, ds)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), &datav1alpha1.Dataset{}))
		}).Should(BeTrue(), "the deletion is done")
		for _, w := range workers {
			// Told once, or again by a second pass of the deletion: forgetting is idempotent.
			Expect(w.forgottenUIDs()).To(And(Not(BeEmpty()), HaveEach(Equal(string(ds.UID)))))
		}
		Expect(other.forgottenUIDs()).To(BeEmpty(), "no worker of another pool")
	})

	It("syncs every worker's mount when a user asks, one listing for all, and records what changed", func() {
		early := startSyncingWorker(poolName, "node-0") // asked first (ids are sorted), and mounts nothing
		mounting := startSyncingWorker(poolName, "node-a")
		idle := startSyncingWorker(poolName, "node-b")
		also := startSyncingWorker(poolName, "node-c")
		other := startSyncingWorker("pool-of-someone-else-"+namespace, "node-a")
		ds := dataset("on-request")
		Expect(meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionSynced)).To(BeNil(), "no sync before one is asked for")
		Expect(mounting.callCount()).To(BeZero())

		mounting.set(&workerpb.SyncDatasetResponse{Mounted: true, Added: 2, Removed: 1, Changed: 3, Files: 4, Bytes: 4000}, nil)
		also.set(&workerpb.SyncDatasetResponse{Mounted: true, Added: 2, Removed: 1, Changed: 3, Files: 4, Bytes: 4000}, nil)
		mounting.show(4, 4000) // what its mount shows from then on
		s3.Put(GinkgoT(), "datasets", namespace+"/on-request/b.bin", make([]byte, 500))
		request(ds, "1")
		cond := syncedCondition(ds, metav1.ConditionTrue)
		Expect(cond.Reason).To(Equal(ReasonSynced))
		Expect(cond.Message).To(ContainSubstring("on 2 node(s) that mount the Dataset: 2 file(s) added, 1 removed, 3 changed"))
		Expect(ds.Status.Sync).NotTo(BeNil())
		Expect(ds.Status.Sync.Request).To(Equal("1"))
		Expect(ds.Status.Sync.Mounts).To(BeEquivalentTo(2))
		Expect([]int64{ds.Status.Sync.Added, ds.Status.Sync.Removed, ds.Status.Sync.Changed}).To(Equal([]int64{2, 1, 3}))
		Expect(ds.Status.Sync.LastSyncTime).NotTo(BeNil())
		Expect(mounting.calls).To(Equal([]string{string(ds.UID)}))
		Expect(idle.callCount()).To(Equal(1), "every worker of the pool is asked")
		Expect(other.callCount()).To(BeZero(), "no worker of another pool")
		Expect(mounting.listingsFrom()).To(Equal([]string{""}), "the first worker that mounts the Dataset lists the source")
		Expect(idle.listingsFrom()).To(Equal([]string{mounting.addr}), "the others take its listing")
		Expect(also.listingsFrom()).To(Equal([]string{mounting.addr}))
		Expect(early.listingsFrom()).To(Equal([]string{"", mounting.addr}),
			"a worker asked before the one that lists is asked again with its listing, to drop what it holds of replaced versions")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect([]int64{ds.Status.Files, ds.Status.TotalBytes}).To(Equal([]int64{4, 4000}),
				"the status counts the tree the mounts show after the sync (the source, listed by the operator, has 2 files)")
		}).Should(Succeed())
		Eventually(func() []string { return eventMessages(namespace, ds.Name, ReasonSynced) }).Should(ContainElement(cond.Message))

		By("the same request is answered once")
		Consistently(mounting.callCount, "2s").Should(Equal(1))
	})

	It("counts the tree the mounts show, not a later listing of the operator's, once a node mounts the Dataset", func() {
		w := startSyncingWorker(poolName, "node-a")
		ds := dataset("counted")
		Expect(ds.Status.Files).To(BeEquivalentTo(1), "no mount yet: the operator's listing")
		w.show(7, 7000)
		s3.Put(GinkgoT(), "datasets", namespace+"/counted/later.bin", make([]byte, 10))
		patch := client.MergeFrom(ds.DeepCopy())
		ds.Annotations = map[string]string{"poke": "1"} // a reconcile now, as the next periodic one would
		Expect(k8sClient.Patch(ctx, ds, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect([]int64{ds.Status.Files, ds.Status.TotalBytes}).To(Equal([]int64{7, 7000}))
		}).Should(Succeed())
		Expect(ds.Status.Size).To(Equal("6.8Ki"))
	})

	It("says which worker failed, keeps the request open, and answers it once the worker can", func() {
		w := startSyncingWorker(poolName, "node-a")
		ds := dataset("failing")
		w.set(nil, status.Error(codes.FailedPrecondition, "syncing Dataset x: the bucket does not exist"))
		request(ds, "first")
		cond := syncedCondition(ds, metav1.ConditionFalse)
		Expect(cond.Reason).To(Equal(ReasonSyncFailed))
		Expect(cond.Message).To(And(ContainSubstring("worker "+poolName+"/node-a"), ContainSubstring("the bucket does not exist"),
			ContainSubstring("the mounts keep the tree they had")))
		Expect(ds.Status.Sync).To(BeNil(), "nothing was synced")
		Eventually(func() []string { return eventMessages(namespace, ds.Name, ReasonSyncFailed) }).Should(ContainElement(cond.Message))

		w.set(&workerpb.SyncDatasetResponse{Mounted: true}, nil)
		request(ds, "second")
		syncedCondition(ds, metav1.ConditionTrue)
		Expect(ds.Status.Sync.Request).To(Equal("second"))
	})

	It("is refused to any caller but the operator", func() {
		w := startSyncingWorker(poolName, "node-a")
		for _, id := range []pki.Identity{pki.Worker(poolName, "node-b"), pki.CSINode("node-a"), pki.ClaimServer(namespace, "srv")} {
			conn, err := grpc.NewClient(w.addr, testCA.Credentials(GinkgoT(), id).DialOption(pki.RoleWorker))
			Expect(err).NotTo(HaveOccurred())
			_, err = workerpb.NewDatasetSyncClient(conn).SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: "x"})
			Expect(status.Code(err)).To(Equal(codes.PermissionDenied), "called as %s", id)
			_, err = workerpb.NewDatasetSyncClient(conn).DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: "x"})
			Expect(status.Code(err)).To(Equal(codes.PermissionDenied), "described as %s", id)
			Expect(conn.Close()).To(Succeed())
		}
		Expect(w.callCount()).To(BeZero())
	})

	It("refuses a sync on an output and an interval under 30s", func() {
		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "too-often", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Source:       &datav1alpha1.DatasetSource{URI: "s3://datasets/x/"},
				TierPoolName: poolName,
				Sync:         &datav1alpha1.DatasetSync{Interval: &metav1.Duration{Duration: 10 * time.Second}},
			},
		}
		Expect(k8sClient.Create(ctx, ds)).To(MatchError(ContainSubstring("spec.sync.interval must be at least 30s")))
		ds.Spec.Sync.Interval.Duration = time.Minute
		ds.Spec.Source, ds.Spec.Lineage = nil, &datav1alpha1.LineageReference{Name: "l"}
		Expect(k8sClient.Create(ctx, ds)).To(MatchError(ContainSubstring("spec.sync only applies to a Dataset with spec.source")))
	})
})

var _ = DescribeTable("when a Dataset's sync is due",
	func(interval time.Duration, annotation string, last *datav1alpha1.DatasetSyncStatus, sinceCreation time.Duration, wantDue bool, wantNextIn time.Duration) {
		now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
		ds := &datav1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.Time{Time: now.Add(-sinceCreation)}}}
		if annotation != "" {
			ds.Annotations = map[string]string{datav1alpha1.AnnotationSyncRequested: annotation}
		}
		if interval > 0 {
			ds.Spec.Sync = &datav1alpha1.DatasetSync{Interval: &metav1.Duration{Duration: interval}}
		}
		ds.Status.Sync = last
		due, next := syncDue(ds, now)
		Expect(due).To(Equal(wantDue))
		if wantNextIn == 0 {
			Expect(next.IsZero()).To(BeTrue())
		} else {
			Expect(next.Sub(now)).To(Equal(wantNextIn))
		}
	},
	Entry("no interval, no request", time.Duration(0), "", nil, time.Hour, false, time.Duration(0)),
	Entry("a first request", time.Duration(0), "1", nil, time.Hour, true, time.Duration(0)),
	Entry("a request answered", time.Duration(0), "1", syncedAt(time.Minute, "1"), time.Hour, false, time.Duration(0)),
	Entry("a new request", time.Duration(0), "2", syncedAt(time.Minute, "1"), time.Hour, true, time.Duration(0)),
	Entry("an interval not yet passed since creation", 10*time.Minute, "", nil, 4*time.Minute, false, 6*time.Minute),
	Entry("an interval passed since creation", 10*time.Minute, "", nil, 11*time.Minute, true, -time.Minute),
	Entry("an interval passed since the last sync", 10*time.Minute, "", syncedAt(12*time.Minute, ""), time.Hour, true, -2*time.Minute),
	Entry("an interval not yet passed since the last sync", 10*time.Minute, "", syncedAt(3*time.Minute, ""), time.Hour, false, 7*time.Minute),
)

// syncedAt is the status of a sync that ended ago before 2026-11-28 12:00 UTC, for request.
func syncedAt(ago time.Duration, request string) *datav1alpha1.DatasetSyncStatus {
	t := metav1.NewTime(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).Add(-ago))
	return &datav1alpha1.DatasetSyncStatus{LastSyncTime: &t, Request: request}
}
