// Command operator runs the Strata operator: a controller-runtime manager, leader-elected, with
// the reconcilers of package controllers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/controllers"
	"github.com/strata-cache/strata/controllers/scheduling"
	"github.com/strata-cache/strata/internal/pki"
	masterclient "github.com/strata-cache/strata/master/client"
)

const (
	// leaderElectionID names the Lease the replicas of the operator compete for.
	leaderElectionID = "operator.data.strata.dev"
	// eventSource is the component name on the Events the operator records.
	eventSource = "strata-operator"
)

// options are the command-line flags.
type options struct {
	metricsAddr             string
	probeAddr               string
	leaderElect             bool
	leaderElectionNamespace string
	zap                     zap.Options

	// namespace is the operator's own, where it runs the master.
	namespace string
	// ownerDeployment is the operator's Deployment, which owns what the operator creates in its
	// namespace, so that uninstalling the operator removes it too.
	ownerDeployment string
	master          masterOptions
	worker          workerOptions
	nodeLossGrace   time.Duration
	recomputeClass  string
	// releaseAttempts: let go every pod that carries the attempt finalizer, then exit (the
	// chart's pre-delete hook).
	releaseAttempts bool
	// webhookCertDir holds the Dataset locality webhook's certificate; empty serves none.
	webhookCertDir string
	webhookPort    int
	identity       identityOptions
}

// identityOptions describe Strata's internal CA and the issuer that certifies components.
type identityOptions struct {
	caSecret string
	caBundle string
	// caFromCertManager: cert-manager writes the CA Secret; the operator waits for it.
	caFromCertManager bool
	// issuerAddr is where the issuer listens; issuerService is the Service components reach it
	// through, which its certificate names.
	issuerAddr    string
	issuerService string
	issuerPort    int
	// csiNodeAccount is the CSI node plugin's ServiceAccount; empty certifies no plugin.
	csiNodeAccount string
}

// workerOptions describe the workers' DaemonSets, one per TierPool; the chart's worker.* values
// set them.
type workerOptions struct {
	image      string
	pullPolicy string
}

// masterOptions describe the master StatefulSet; the chart's master.* values set them.
type masterOptions struct {
	image           string
	pullPolicy      string
	replicas        int
	resourcesJSON   string
	storageSize     string
	storageClass    string
	tolerationsJSON string
	backup          controllers.MasterBackupSpec
}

func main() {
	var opts options
	flag.StringVar(&opts.metricsAddr, "metrics-bind-address", ":8080",
		"Address the metrics endpoint (plain HTTP) binds to; 0 disables it.")
	flag.StringVar(&opts.probeAddr, "health-probe-bind-address", ":8081",
		"Address the /healthz and /readyz endpoints bind to.")
	flag.BoolVar(&opts.leaderElect, "leader-elect", true,
		"Elect a leader among the replicas, so that one reconciles at a time.")
	flag.StringVar(&opts.leaderElectionNamespace, "leader-election-namespace", os.Getenv("POD_NAMESPACE"),
		"Namespace of the leader-election Lease; defaults to $POD_NAMESPACE, then to the pod's own namespace.")
	flag.StringVar(&opts.namespace, "namespace", os.Getenv("POD_NAMESPACE"),
		"Namespace the operator runs the master in; defaults to $POD_NAMESPACE.")
	flag.StringVar(&opts.ownerDeployment, "owner-deployment", "",
		"Name of the operator's own Deployment, which then owns the master (garbage-collected with it).")
	flag.StringVar(&opts.master.image, "master-image", "",
		"Image of the master; empty means the operator deploys no master.")
	flag.StringVar(&opts.master.pullPolicy, "master-image-pull-policy", string(corev1.PullIfNotPresent),
		"Pull policy of the master image: Always, IfNotPresent or Never.")
	flag.IntVar(&opts.master.replicas, "master-replicas", 3,
		"Replicas of the master's Raft group: 3 tolerates the loss of one, 5 of two.")
	flag.StringVar(&opts.master.resourcesJSON, "master-resources", "{}",
		`Resources of each master replica, as JSON: {"requests":{"memory":"256Mi"}}.`)
	flag.StringVar(&opts.master.storageSize, "master-storage-size", "",
		"Size of each master replica's PersistentVolumeClaim, such as 10Gi; empty means an emptyDir.")
	flag.StringVar(&opts.master.storageClass, "master-storage-class", "",
		"StorageClass of the master's claims; empty means the cluster's default class.")
	flag.StringVar(&opts.master.tolerationsJSON, "master-tolerations", "[]",
		`Tolerations of the master replicas, as JSON, such as [{"key":"node-role.kubernetes.io/control-plane","effect":"NoSchedule"}].`)
	flag.StringVar(&opts.master.backup.URI, "master-backup-uri", "",
		"S3 folder (s3://bucket/prefix) the master's backups go to; empty takes none.")
	flag.StringVar(&opts.master.backup.Endpoint, "master-backup-endpoint", "",
		"Endpoint of the backups' S3 server (http(s)://host:port); empty means AWS S3.")
	flag.StringVar(&opts.master.backup.Region, "master-backup-region", "", "Region of the backups' bucket.")
	flag.StringVar(&opts.master.backup.SecretName, "master-backup-secret", "",
		"Secret of the operator's namespace with the keys (accessKeyID, secretAccessKey) that may write the backups.")
	flag.DurationVar(&opts.master.backup.Every, "master-backup-every", 0,
		"Time between scheduled backups of the master, such as 6h; 0 takes them on request only (kubectl strata backup).")
	flag.StringVar(&opts.master.backup.RestoreFrom, "master-restore-from", "",
		"A backup under --master-backup-uri, or 'latest', that the master is restored from if it holds nothing (a new install).")
	flag.StringVar(&opts.worker.image, "worker-image", "",
		"Image of the cache worker; empty means the operator deploys no worker.")
	flag.StringVar(&opts.worker.pullPolicy, "worker-image-pull-policy", string(corev1.PullIfNotPresent),
		"Pull policy of the worker image: Always, IfNotPresent or Never.")
	flag.StringVar(&opts.webhookCertDir, "webhook-cert-dir", "",
		"Folder with tls.crt and tls.key for the Dataset locality webhook; empty serves no webhook.")
	flag.IntVar(&opts.webhookPort, "webhook-port", 9443, "Port the Dataset locality webhook serves on.")
	flag.StringVar(&opts.recomputeClass, "recompute-priority-class", controllers.DefaultRecomputeClass,
		"PriorityClass recomputation Jobs start at; they inherit a higher one from the pods that wait for lost data.")
	flag.DurationVar(&opts.nodeLossGrace, "node-loss-grace", controllers.DefaultNodeLossGrace,
		"How long a Node must be NotReady before the master declares its workers lost.")
	flag.StringVar(&opts.identity.caSecret, "ca-secret", "strata-ca",
		"Secret of the operator's namespace holding Strata's internal CA; made on first start.")
	flag.BoolVar(&opts.identity.caFromCertManager, "ca-from-cert-manager", false,
		"Wait for cert-manager to write the CA into --ca-secret (a Certificate of the chart) instead of making one.")
	flag.StringVar(&opts.identity.caBundle, "ca-bundle", "strata-ca-bundle",
		"ConfigMap of the operator's namespace the CA certificate is written to, which components mount to trust it.")
	flag.StringVar(&opts.identity.issuerAddr, "issuer-bind-address", ":9444",
		"Address the certificate issuer listens on (HTTPS).")
	flag.StringVar(&opts.identity.issuerService, "issuer-service", "strata-issuer",
		"Service of the operator's namespace through which components reach the issuer.")
	flag.IntVar(&opts.identity.issuerPort, "issuer-port", 9444, "Port of the issuer's Service.")
	flag.StringVar(&opts.identity.csiNodeAccount, "csi-node-service-account", "",
		"ServiceAccount of the CSI node plugin's pods, which the issuer certifies as the plugin of their node; empty certifies none.")
	flag.BoolVar(&opts.releaseAttempts, "release-attempts-and-exit", false,
		"Take the attempt finalizer off every pod of a Lineage, in every namespace, and exit: run before uninstalling, so that no pod waits for an operator that is gone.")
	opts.zap.BindFlags(flag.CommandLine)
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts.zap)))
	log := ctrl.Log.WithName("setup")

	if err := run(opts); err != nil {
		log.Error(err, "operator stopped")
		os.Exit(1)
	}
}

func run(opts options) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("registering client-go types: %w", err)
	}
	if err := datav1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("registering %s types: %w", datav1alpha1.GroupVersion, err)
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	if opts.releaseAttempts {
		return releaseAttempts(ctx, cfg, scheme)
	}
	// The CA and the operator's own certificate come first: nothing it runs can speak without.
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating the API client: %w", err)
	}
	ids, err := opts.identity.start(ctx, direct, opts.namespace)
	if err != nil {
		return err
	}
	masterSpec, err := opts.masterSpec()
	if err != nil {
		return err
	}
	workerSpec, err := opts.workerSpec(masterSpec)
	if err != nil {
		return err
	}
	workerSpec.TLS = ids.componentTLS
	if masterSpec != nil {
		masterSpec.TLS = ids.componentTLS
	}

	claimServers := labels.SelectorFromSet(labels.Set{"app.kubernetes.io/component": controllers.ClaimServerComponent})
	mgrOpts := managerOptions(opts, scheme, claimServers)
	stopLeaseEvents, err := useLeaseLock(cfg, scheme, &mgrOpts)
	if err != nil {
		return err
	}
	defer stopLeaseEvents()
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}

	pools := &controllers.TierPoolReconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorderFor(eventSource),
		Workers:  workerSpec,
	}

	var workers *controllers.WorkerReconciler
	if workerSpec.Deployed() {
		workers = &controllers.WorkerReconciler{
			Client:    mgr.GetClient(),
			APIReader: mgr.GetAPIReader(),
			Recorder:  mgr.GetEventRecorderFor(eventSource),
			Spec:      workerSpec,
		}
		if err := workers.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the worker controller: %w", err)
		}
	} else {
		ctrl.Log.WithName("setup").Info("no --worker-image: the operator deploys no cache worker, " +
			"and every TierPool reports Ready=False/" + controllers.ReasonWorkersNotDeployed)
	}

	if err := ids.addTo(mgr, masterSpec, workers); err != nil {
		return err
	}

	syncCounter, err := controllers.NewDatasetSyncCounter(crmetrics.Registry)
	if err != nil {
		return err
	}
	reportCounter, err := controllers.NewBlockReportCounter(crmetrics.Registry)
	if err != nil {
		return err
	}
	datasets := &controllers.DatasetReconciler{
		Client:        mgr.GetClient(),
		SyncCounter:   syncCounter,
		ReportCounter: reportCounter,
		Recorder:      mgr.GetEventRecorderFor(eventSource),
		// Preload Jobs and claim servers run the worker binary.
		WorkerImage:    controllers.WorkerImage{Image: workerSpec.Image, ImagePullPolicy: workerSpec.ImagePullPolicy},
		APIReader:      mgr.GetAPIReader(),
		ClaimServerTLS: &controllers.ClaimServerTLS{CA: ids.ca, Client: understore.ClaimClientTLS(ids.creds)},
	}
	var lineageMaster controllers.LineageMaster
	// loadNodes are the pools' workers, asked what DataLoads brought them; none without a master.
	var loadNodes controllers.LoadNodes
	var partitionsMaster controllers.PartitionsMaster
	// restorePending says whether the master is still to be restored from a backup.
	var restorePending func(context.Context) (bool, error)
	if masterSpec != nil {
		if opts.ownerDeployment != "" {
			owner, err := ownerReference(context.Background(), mgr.GetAPIReader(), opts.namespace, opts.ownerDeployment)
			if err != nil {
				return err
			}
			masterSpec.Owner = owner
		}
		if err := (&controllers.MasterReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor(eventSource), Spec: *masterSpec}).SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the master controller: %w", err)
		}
		masters, err := masterclient.New(masterSpec.Addresses(), masterclient.Options{
			Logger: ctrl.Log.WithName("master-client"), DialOptions: []grpc.DialOption{ids.creds.DialOption(pki.RoleMaster)},
		})
		if err != nil {
			return fmt.Errorf("creating the master client: %w", err)
		}
		defer func() { _ = masters.Close() }()
		if err := (&controllers.NodeLossReconciler{
			Client: mgr.GetClient(), Workers: masters, Grace: opts.nodeLossGrace,
		}).SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the node-loss controller: %w", err)
		}
		datasets.Master = masters
		// Workers are spoken to over their data-plane port, which checks the operator's
		// certificate as the operator checks theirs.
		workerPeers := dataplane.NewPeers(ids.creds.DialOption(pki.RoleWorker))
		defer func() { _ = workerPeers.Close() }()
		syncs := &controllers.WorkerSyncs{Workers: masters, Peers: workerPeers}
		datasets.Syncer = syncs
		loadNodes = syncs
		datasets.Reports = &controllers.MasterBlockReports{Master: masters, Trees: syncs}
		pools.Master = masters
		pools.Forgetter = masters
		if err := opts.setUpBackups(mgr, masters, masterSpec.Owner); err != nil {
			return err
		}
		lineageMaster = masters
		partitionsMaster = masters
		backups := opts.master.backup
		backups.Namespace = opts.namespace
		restorePending = func(ctx context.Context) (bool, error) { return backups.RestorePending(ctx, mgr.GetClient()) }
	}
	if err := pools.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the TierPool controller: %w", err)
	}
	if err := (&controllers.CachePolicyReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor(eventSource),
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the CachePolicy controller: %w", err)
	}
	if err := datasets.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Dataset controller: %w", err)
	}
	depth, err := controllers.NewLineageDepthGauge(crmetrics.Registry)
	if err != nil {
		return err
	}
	if err := (&controllers.LineageReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor(eventSource), Master: lineageMaster, Partitions: partitionsMaster, Depth: depth,
		RecomputeClass: opts.recomputeClass, APIReader: mgr.GetAPIReader(), RestorePending: restorePending,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Lineage controller: %w", err)
	}
	if err := (&controllers.DataLoadReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor(eventSource), WorkerImage: datasets.WorkerImage, Nodes: loadNodes,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the DataLoad controller: %w", err)
	}
	if err := (&controllers.ProvisionerReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor(eventSource), Master: datasets.Master,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the volume provisioner: %w", err)
	}

	if opts.webhookCertDir != "" {
		// Served by every replica, leader or not: the API server may call any of them.
		hinter, err := scheduling.NewHinter(mgr.GetClient(), admission.NewDecoder(scheme), crmetrics.Registry)
		if err != nil {
			return err
		}
		mgr.GetWebhookServer().Register(scheduling.Path, &webhook.Admission{Handler: hinter})
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}

	ctrl.Log.WithName("setup").Info("starting manager", "leaderElect", opts.leaderElect,
		"leaderElectionNamespace", opts.leaderElectionNamespace)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

// masterSpec validates the master flags once, at start-up; nil means no master is deployed.
func (o options) masterSpec() (*controllers.MasterSpec, error) {
	if o.master.image == "" {
		if o.master.backup.URI != "" || o.master.backup.RestoreFrom != "" {
			return nil, errors.New("--master-backup-uri and --master-restore-from back up the master the operator deploys: give --master-image too")
		}
		return nil, nil
	}
	if o.namespace == "" {
		return nil, errors.New("--namespace (or $POD_NAMESPACE) is required to deploy the master")
	}
	if err := o.master.backup.Validate(); err != nil {
		return nil, err
	}
	if o.master.replicas < 1 || o.master.replicas%2 == 0 {
		return nil, fmt.Errorf("--master-replicas=%d: use an odd number, such as 3 or 5, so that a majority exists", o.master.replicas)
	}
	policy, err := pullPolicy("--master-image-pull-policy", o.master.pullPolicy)
	if err != nil {
		return nil, err
	}
	spec := &controllers.MasterSpec{
		Namespace:        o.namespace,
		Name:             "strata-master",
		Image:            o.master.image,
		ImagePullPolicy:  policy,
		Replicas:         int32(o.master.replicas),
		StorageClassName: o.master.storageClass,
	}
	if err := json.Unmarshal([]byte(o.master.resourcesJSON), &spec.Resources); err != nil {
		return nil, fmt.Errorf("--master-resources is not a JSON ResourceRequirements: %w", err)
	}
	if err := json.Unmarshal([]byte(o.master.tolerationsJSON), &spec.Tolerations); err != nil {
		return nil, fmt.Errorf("--master-tolerations is not a JSON list of Tolerations: %w", err)
	}
	if o.master.storageSize != "" {
		size, err := resource.ParseQuantity(o.master.storageSize)
		if err != nil {
			return nil, fmt.Errorf("--master-storage-size=%q is not a quantity such as 10Gi: %w", o.master.storageSize, err)
		}
		if size.Cmp(minMasterStorage) < 0 {
			return nil, fmt.Errorf("--master-storage-size=%s (master.persistence.size) is too small: a replica's Raft log alone takes "+
				"segment files of 64 MiB, allocated whole, and two snapshots; give it at least %s", o.master.storageSize, minMasterStorage.String())
		}
		spec.StorageSize = size
	}
	return spec, nil
}

// minMasterStorage is the smallest claim a master replica can work in (see values.yaml).
var minMasterStorage = resource.MustParse("1Gi")

// setUpBackups runs the master's backups when --master-backup-uri names where they go.
func (o options) setUpBackups(mgr ctrl.Manager, master controllers.MasterBackups, owner *metav1.OwnerReference) error {
	spec := o.master.backup
	if spec.URI == "" {
		return nil
	}
	spec.Namespace, spec.Owner = o.namespace, owner
	metrics, err := controllers.NewMasterBackupMetrics(crmetrics.Registry)
	if err != nil {
		return err
	}
	r := &controllers.MasterBackupReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor(eventSource),
		Master: master, Spec: spec, Metrics: metrics,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the master backup controller: %w", err)
	}
	return nil
}

// workerSpec validates the worker flags once, at start-up. Without --worker-image the spec
// deploys nothing, but still says so to the TierPool status. The workers register with the
// master when the operator runs one.
func (o options) workerSpec(master *controllers.MasterSpec) (controllers.WorkerSpec, error) {
	spec := controllers.WorkerSpec{Namespace: o.namespace}
	if o.worker.image == "" {
		return spec, nil
	}
	if o.namespace == "" {
		return spec, errors.New("--namespace (or $POD_NAMESPACE) is required to deploy the workers")
	}
	policy, err := pullPolicy("--worker-image-pull-policy", o.worker.pullPolicy)
	if err != nil {
		return spec, err
	}
	spec.Image = o.worker.image
	spec.ImagePullPolicy = policy
	if master != nil {
		spec.MasterAddresses = master.Addresses()
	}
	return spec, nil
}

// pullPolicy checks the value of an image pull policy flag.
func pullPolicy(flagName, value string) (corev1.PullPolicy, error) {
	policy := corev1.PullPolicy(value)
	switch policy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
		return policy, nil
	default:
		return "", fmt.Errorf("%s=%q: use Always, IfNotPresent or Never", flagName, value)
	}
}

// The operator reads its own Deployment, to own what it makes in its namespace.
// +kubebuilder:rbac:groups=apps,namespace=strata-system,resources=deployments,verbs=get,resourceNames=strata-operator

// ownerReference points at the operator's Deployment, read once at start-up.
func ownerReference(ctx context.Context, reader client.Reader, namespace, name string) (*metav1.OwnerReference, error) {
	deploy := &appsv1.Deployment{}
	if err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, deploy); err != nil {
		return nil, fmt.Errorf("reading the operator's Deployment %s/%s (--owner-deployment): %w", namespace, name, err)
	}
	return &metav1.OwnerReference{
		APIVersion: "apps/v1",
		Kind:       "Deployment",
		Name:       deploy.Name,
		UID:        deploy.UID,
	}, nil
}

// managerOptions are the manager's: what it caches, where it serves, and the leader election
// that lets one replica of the operator at a time reconcile.
func managerOptions(opts options, scheme *runtime.Scheme, claimServers labels.Selector) ctrl.Options {
	return ctrl.Options{
		Scheme: scheme,
		// The operator owns StatefulSets, Services, DaemonSets and ConfigMaps in its own
		// namespace: watch all of them there, and in other namespaces only the objects of the
		// claim servers it runs for pvc:// Datasets, by label.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&appsv1.StatefulSet{}: {Namespaces: map[string]cache.Config{opts.namespace: {}}},
			&corev1.Service{}: {Namespaces: map[string]cache.Config{
				opts.namespace: {}, cache.AllNamespaces: {LabelSelector: claimServers},
			}},
			&appsv1.DaemonSet{}:  {Namespaces: map[string]cache.Config{opts.namespace: {}}},
			&corev1.ConfigMap{}:  {Namespaces: map[string]cache.Config{opts.namespace: {}}},
			&appsv1.Deployment{}: {Label: claimServers},
			&corev1.Pod{}:        {Label: claimServers},
		}},
		Client:                  client.Options{Cache: controllers.SecretClientOptions()},
		Metrics:                 metricsserver.Options{BindAddress: opts.metricsAddr},
		WebhookServer:           webhook.NewServer(webhook.Options{Port: opts.webhookPort, CertDir: opts.webhookCertDir}),
		HealthProbeBindAddress:  opts.probeAddr,
		LeaderElection:          opts.leaderElect,
		LeaderElectionID:        leaderElectionID,
		LeaderElectionNamespace: opts.leaderElectionNamespace,
		// The process exits as soon as the manager stops, so the Lease can be released at once
		// and the next replica takes over without waiting for it to expire (useLeaseLock makes
		// the release hold when a renewal raced it).
		LeaderElectionReleaseOnCancel: true,
	}
}

// releaseAttempts is --release-attempts-and-exit.
func releaseAttempts(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme) error {
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connecting to the API server: %w", err)
	}
	n, err := controllers.ReleaseAllAttemptPods(ctx, c)
	ctrl.Log.WithName("uninstall").Info("let go the pods that waited for the operator to settle what they wrote", "pods", n)
	return err
}
