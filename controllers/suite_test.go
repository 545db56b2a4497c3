package controllers

import (
	"context"
	"errors"
	"iter"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/controllers/scheduling"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	masterclient "github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/mastertest"
)

// This suite runs the reconcilers in a manager against a real kube-apiserver and etcd (built by
// `make envtest-assets`; `make test` points KUBEBUILDER_ASSETS at them). There is no kubelet:
// the tests create Node objects themselves. Nor a kube-controller-manager: volumeBinder binds
// the claims the operator makes for its volumes.

var (
	testEnv *envtest.Environment
	// k8sClient talks to the API server directly, not through the manager's cache, so that
	// what a test reads is what the server holds.
	k8sClient client.Client
	ctx       context.Context
	cancel    context.CancelFunc
	// s3 is a real MinIO that Datasets of the specs read from: the operator probes a
	// Dataset's source before it serves it.
	s3 *miniotest.Server
	// claimServers are the claim servers of pvc:// Datasets: in envtest no pod runs them, so
	// the specs serve the claim's folder themselves, with the real server.
	claimServers = &testClaimServers{urls: map[string]string{}}
	// workerReconciler serves the pools' checkpoint settings, as the operator does.
	workerReconciler *WorkerReconciler
	// testCA issues the certificates of the components the specs play.
	testCA *pkitest.Authority
	// blockReports counts the block reports the Dataset reconciler answered.
	blockReports *prometheus.CounterVec
	// lineageMaster is a real master the Lineage reconciler reads outputs' state from; specs
	// lose blocks in it to make outputs Lost.
	lineageMaster *masterclient.Client
	// lineageRestorePending is what the Lineage reconciler hears of a restore of the master
	// still to come.
	lineageRestorePending          atomic.Bool
	backedUpMaster, restoredMaster *masterclient.Client
	// lineageDepth is the Lineage reconciler's gauge of uncheckpointed depth, registered alone
	// on lineageDepthRegistry.
	lineageDepth         *prometheus.GaugeVec
	lineageDepthRegistry *prometheus.Registry
	// syncWorkers are the workers the Dataset reconciler's syncs find at "the master": specs
	// add the data-plane servers they run (see dataset_sync_test.go).
	syncWorkers = &testWorkerList{}
)

type testClaimServers struct {
	mu   sync.Mutex
	urls map[string]string
}

// endpoint is the URL of the claim server name of namespace ns, or of a closed port if the
// spec serves none.
func (c *testClaimServers) endpoint(ns, name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := c.urls[ns+"/"+name]; ok {
		return u
	}
	return "https://" + miniotest.ClosedAddr(GinkgoT())
}

// serve serves dir as the claim server name of namespace ns, for token, over mutual TLS with the
// certificate the operator made for it, until the spec ends.
func (c *testClaimServers) serve(ns, name, dir, token string) string {
	store, err := understore.NewLocal(understore.LocalConfig{Dir: dir, AllowedRoots: []string{dir}})
	Expect(err).NotTo(HaveOccurred())
	handler, err := understore.NewClaimServer(store, token, logr.Discard())
	Expect(err).NotTo(HaveOccurred())
	secret := &corev1.Secret{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: claimCertificateSecretName(name)}, secret)).To(Succeed())
	trust, err := pki.PoolFromPEM(secret.Data["ca.crt"])
	Expect(err).NotTo(HaveOccurred())
	creds := pki.NewCredentials(trust)
	Expect(creds.Set(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])).To(Succeed())
	srv := httptest.NewUnstartedServer(handler)
	srv.TLS = understore.ClaimServerTLS(creds)
	srv.StartTLS()
	DeferCleanup(srv.Close)
	DeferCleanup(store.Close)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.urls[ns+"/"+name] = srv.URL
	return srv.URL
}

// hiddenKeysMarker in a source's URI makes its listing end with keys that S3 allows and a
// file system cannot show, which MinIO cannot hold side by side: an object named like a folder
// of others, and a key with an empty element.
const hiddenKeysMarker = "/with-hidden/"

// openSourceWithHiddenKeys opens a source as the operator does, adding those keys to the
// listing of one whose URI has hiddenKeysMarker, and failing the listing of one a spec made
// unreachable (unreachableSources) as a store that does not answer does.
func openSourceWithHiddenKeys(ctx context.Context, src understore.Source) (understore.Store, error) {
	store, err := understore.Open(ctx, src)
	if _, down := unreachableSources.Load(src.URI); err == nil && down {
		return unreachable{store}, nil
	}
	if err != nil || !strings.Contains(src.URI, hiddenKeysMarker) {
		return store, err
	}
	return withHiddenKeys{store}, nil
}

// unreachableSources are the source URIs whose store the specs have "stopped".
var unreachableSources sync.Map

type unreachable struct{ understore.Store }

func (u unreachable) List(context.Context, string) iter.Seq2[understore.ObjectInfo, error] {
	return func(yield func(understore.ObjectInfo, error) bool) {
		yield(understore.ObjectInfo{}, &understore.Error{Op: "list", Store: u.String(), Kind: understore.ErrUnreachable,
			Err: errors.New("dial tcp: connection refused")})
	}
}

type withHiddenKeys struct{ understore.Store }

func (w withHiddenKeys) List(ctx context.Context, prefix string) iter.Seq2[understore.ObjectInfo, error] {
	return func(yield func(understore.ObjectInfo, error) bool) {
		for info, err := range w.Store.List(ctx, prefix) {
			if !yield(info, err) || err != nil {
				return
			}
		}
		for _, extra := range []understore.ObjectInfo{{Path: "dir", Size: 36}, {Path: "two//slashes", Size: 1}} {
			if !yield(extra, nil) {
				return
			}
		}
	}
}

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	// Started here, with the test's own T: mastertest needs a testing.TB.
	lineageMaster = mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	// The backups spec's: one backed up, one restored into.
	backedUpMaster = mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	restoredMaster = mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	RunSpecs(t, "Controllers suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	// Generous: the API server shares two cores with the build; a passing spec returns early.
	SetDefaultEventuallyTimeout(30 * time.Second)
	SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
	ctx, cancel = context.WithCancel(context.Background())
	Expect(miniotest.Binary()).NotTo(BeEmpty(), "no MinIO binary: run `make test` (it builds one) or set STRATA_MINIO")
	s3 = miniotest.Start(GinkgoT())
	s3.MakeBucket(GinkgoT(), "datasets")

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		// The API server calls the manager's webhook server for the configuration of
		// config/webhook, over TLS with certificates envtest makes.
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: []string{filepath.Join("..", "config", "webhook")}},
	}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred(), "starting envtest: is KUBEBUILDER_ASSETS set? run the tests with `make test`")

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(datav1alpha1.AddToScheme(scheme)).To(Succeed())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testMasterSpec.Namespace}})).To(Succeed())

	hooks := testEnv.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		// As cmd/operator: no Secret of another namespace in the cache.
		Client:  client.Options{Cache: SecretClientOptions()},
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: hooks.LocalServingHost, Port: hooks.LocalServingPort, CertDir: hooks.LocalServingCertDir,
		}),
	})
	Expect(err).NotTo(HaveOccurred())
	hinter, err := scheduling.NewHinter(mgr.GetClient(), admission.NewDecoder(scheme), prometheus.NewRegistry())
	Expect(err).NotTo(HaveOccurred())
	mgr.GetWebhookServer().Register(scheduling.Path, &webhook.Admission{Handler: hinter})
	Expect((&TierPoolReconciler{
		Client:    mgr.GetClient(),
		Recorder:  mgr.GetEventRecorderFor("strata-operator"),
		Workers:   testWorkerSpec,
		Forgetter: lineageMaster,
	}).SetupWithManager(mgr)).To(Succeed())
	workerReconciler = &WorkerReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorderFor("strata-operator"),
		Spec:      testWorkerSpec,
	}
	Expect(workerReconciler.SetupWithManager(mgr)).To(Succeed())
	testCA = pkitest.New(GinkgoT())
	blockReports, err = NewBlockReportCounter(prometheus.NewRegistry())
	Expect(err).NotTo(HaveOccurred())
	syncs := &WorkerSyncs{Workers: syncWorkers, Peers: dataplane.NewPeers(
		testCA.Credentials(GinkgoT(), pki.Operator()).DialOption(pki.RoleWorker),
	)}
	Expect((&DatasetReconciler{
		Client:              mgr.GetClient(),
		Recorder:            mgr.GetEventRecorderFor("strata-operator"),
		WorkerImage:         WorkerImage{Image: testWorkerSpec.Image, ImagePullPolicy: corev1.PullIfNotPresent},
		APIReader:           mgr.GetAPIReader(),
		ClaimServerEndpoint: claimServers.endpoint,
		OpenSource:          openSourceWithHiddenKeys,
		// Every reconcile checks that a source answers: specs make sources unreachable.
		ReachCheck:    time.Nanosecond,
		Syncer:        syncs,
		Reports:       &MasterBlockReports{Master: lineageMaster, Trees: syncs},
		ReportCounter: blockReports,
		ClaimServerTLS: &ClaimServerTLS{
			CA: testCA.CA, Client: understore.ClaimClientTLS(testCA.Credentials(GinkgoT(), pki.Operator())),
		},
	}).SetupWithManager(mgr)).To(Succeed())
	Expect((&DataLoadReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("strata-operator"), Nodes: syncs, Refresh: 200 * time.Millisecond,
		WorkerImage: WorkerImage{Image: testWorkerSpec.Image, ImagePullPolicy: corev1.PullIfNotPresent},
	}).SetupWithManager(mgr)).To(Succeed())
	Expect((&MasterReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("strata-operator"), Spec: testMasterSpec}).SetupWithManager(mgr)).To(Succeed())
	Expect((&CachePolicyReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("strata-operator")}).SetupWithManager(mgr)).To(Succeed())
	lineageDepthRegistry = prometheus.NewRegistry()
	lineageDepth, err = NewLineageDepthGauge(lineageDepthRegistry)
	Expect(err).NotTo(HaveOccurred())
	Expect((&LineageReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("strata-operator"), Master: lineageMaster, Partitions: lineageMaster,
		APIReader: mgr.GetAPIReader(), Depth: lineageDepth,
		Refresh:        time.Second,
		RestorePending: func(context.Context) (bool, error) { return lineageRestorePending.Load(), nil },
	}).SetupWithManager(mgr)).To(Succeed())
	Expect((&volumeBinder{Client: mgr.GetClient()}).SetupWithManager(mgr)).To(Succeed())
	Expect((&ProvisionerReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor("strata-operator")}).SetupWithManager(mgr)).To(Succeed())

	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed(), "running the manager")
	}()
})

var _ = AfterSuite(func() {
	if cancel != nil {
		cancel()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// s3DatasetOf is a Dataset of the prefix <namespace>/<name>/ of the suite's MinIO, into which it
// puts the objects given (path → size, zeros), read with the Secret "creds" of the namespace.
// The caller creates it.
func s3DatasetOf(namespace, name, pool string, objects map[string]int) *datav1alpha1.Dataset {
	for p, size := range objects {
		s3.Put(GinkgoT(), "datasets", namespace+"/"+name+"/"+p, make([]byte, size))
	}
	return &datav1alpha1.Dataset{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: datav1alpha1.DatasetSpec{
			Source: &datav1alpha1.DatasetSource{
				URI: "s3://datasets/" + namespace + "/" + name + "/", Endpoint: "http://" + s3.Endpoint,
				SecretRef: &datav1alpha1.SecretReference{Name: "creds"},
			},
			TierPoolName: pool,
		},
	}
}

// awaitCondition waits until obj, read again each time, has the condition condType (of the list
// conditions gives) with reason, and every check of also holds; it returns the condition then.
func awaitCondition[T client.Object](obj T, conditions func(T) []metav1.Condition, condType, reason string, also ...func(Gomega)) metav1.Condition {
	GinkgoHelper()
	var cond metav1.Condition
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		c := meta.FindStatusCondition(conditions(obj), condType)
		g.Expect(c).NotTo(BeNil(), "%s has no %s condition", obj.GetName(), condType)
		g.Expect(c.Reason).To(Equal(reason), "%s", c.Message)
		for _, check := range also {
			check(g)
		}
		cond = *c
	}).Should(Succeed(), "waiting for the %s condition of %s to say %s", condType, obj.GetName(), reason)
	return cond
}

func datasetConditions(ds *datav1alpha1.Dataset) []metav1.Condition   { return ds.Status.Conditions }
func dataLoadConditions(dl *datav1alpha1.DataLoad) []metav1.Condition { return dl.Status.Conditions }
func lineageConditions(l *datav1alpha1.Lineage) []metav1.Condition    { return l.Status.Conditions }

// newTenant makes a namespace (named from prefix) with the Secret "creds" of the suite's MinIO,
// and a TierPool of one memory tier for it (blockSize "" for the default), deleted after the
// spec. It returns the two names.
func newTenant(prefix, blockSize string) (namespace, pool string) {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	tp := &datav1alpha1.TierPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-" + ns.Name},
		Spec: datav1alpha1.TierPoolSpec{Tiers: []datav1alpha1.Tier{{
			Name: "mem", Medium: datav1alpha1.MediumMemory, Paths: []string{"/mnt/strata/mem"}, Quota: resource.MustParse("1Gi"),
		}}},
	}
	if blockSize != "" {
		tp.Spec.BlockSize = resource.MustParse(blockSize)
	}
	Expect(k8sClient.Create(ctx, tp)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, tp))).To(Succeed()) })
	Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: ns.Name},
		Data: map[string][]byte{"accessKeyID": []byte(miniotest.AccessKey), "secretAccessKey": []byte(miniotest.SecretKey)}})).To(Succeed())
	return ns.Name, tp.Name
}

// servedTenant is a namespace of newTenant whose pool makeServable serves: the Datasets of a
// Lineage's spec that name the pool get claims pods can mount, which a Lineage waits for
// before it runs its Job.
func servedTenant(prefix string) (namespace, pool string) {
	GinkgoHelper()
	namespace, pool = newTenant(prefix, "")
	makeServable(pool)
	return namespace, pool
}

// makeServable gives a pool what envtest lacks for its Datasets' claims to be served: the ready
// worker its DaemonSet would report (envtest runs no DaemonSet controller) and Strata's
// CSIDriver, removed after the spec.
func makeServable(pool string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		workers := &appsv1.DaemonSet{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: testWorkerSpec.Namespace, Name: WorkerName(pool)}, workers)).To(Succeed())
		workers.Status.DesiredNumberScheduled, workers.Status.CurrentNumberScheduled = 1, 1
		workers.Status.UpdatedNumberScheduled, workers.Status.NumberReady, workers.Status.NumberAvailable = 1, 1, 1
		g.Expect(k8sClient.Status().Update(ctx, workers)).To(Succeed())
	}).Should(Succeed(), "reporting a ready worker for pool %s", pool)
	driver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: CSIDriverName}}
	Expect(k8sClient.Create(ctx, driver)).To(Succeed())
	DeferCleanup(func() { Expect(k8sClient.Delete(ctx, driver)).To(Succeed()) })
}
