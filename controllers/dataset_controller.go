package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/master/masterpb"
)

const (
	// DatasetFinalizer keeps a Dataset until its volume is removed and no Lineage still needs it.
	DatasetFinalizer = "data.strata.dev/dataset"
	// CSIDriverName is the name of Strata's CSI driver.
	CSIDriverName = "csi.strata.dev"

	// datasetVolumeCapacity is the nominal size of a Dataset's volume: the CSI driver serves
	// whatever the Dataset holds, and Kubernetes needs some capacity to bind a claim.
	datasetVolumeCapacity = "1Ti"

	// dependentsRecheck is how often a deletion that waits for dependents looks again.
	dependentsRecheck = 30 * time.Second
)

// Reasons of the Dataset conditions, each a thing the user can act on.
const (
	ReasonSecretNotFound       = "SecretNotFound"
	ReasonSecretIncomplete     = "SecretIncomplete"
	ReasonClaimNotFound        = "ClaimNotFound"
	ReasonTierPoolNotFound     = "TierPoolNotFound"
	ReasonFileSourceNotAllowed = "FileSourceNotAllowed"
	ReasonCachePolicyNotFound  = "CachePolicyNotFound"
	ReasonCachePolicyInvalid   = "CachePolicyInvalid"
	ReasonLineageNotFound      = "LineageNotFound"
	ReasonLineageMismatch      = "NotALineageOutput"
	ReasonSourceValid          = "SourceValid"
	ReasonNoCSIDriver          = "CSIDriverNotInstalled"
	ReasonNoReadyWorkers       = "NoReadyWorkers"
	ReasonVolumeReady          = "VolumeReady"
	ReasonClaimNotBound        = "ClaimNotBound"
	ReasonDeletionBlocked      = "DeletionBlocked"
	// ReasonObjectsLeftOut is the Warning event of a source with objects the tree cannot show.
	ReasonObjectsLeftOut = "ObjectsLeftOut"
	// ReasonListingsKept is the Warning event of a deleted Dataset whose listing some workers
	// could not be told to drop.
	ReasonListingsKept = "ListingsKept"
)

// ConditionDeletionBlocked is True while a deleted Dataset waits for its dependents.
const ConditionDeletionBlocked = "DeletionBlocked"

// DatasetReconciler checks what a Dataset refers to, gives it a PersistentVolume and a claim of
// its name that pods mount, and reports honestly whether the claim can be served.
type DatasetReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// Master, when the operator runs one, forgets a deleted Dataset's files and blocks.
	Master DatasetMetadata
	// WorkerImage is the image of the pods the operator runs in Datasets' namespaces: preload
	// Jobs and the claim servers of pvc:// sources.
	WorkerImage WorkerImage
	// APIReader reads what the operator does not cache: objects of tenants' namespaces that
	// stand where a claim server's should.
	APIReader client.Reader
	// ClaimServerEndpoint, if set, replaces ClaimServerEndpoint: tests reach claim servers
	// outside a cluster's DNS.
	ClaimServerEndpoint func(namespace, name string) string
	// ClaimServerTLS certifies claim servers and probes them; nil serves no pvc:// source.
	ClaimServerTLS *ClaimServerTLS
	// OpenSource, if set, replaces understore.Open for the probe of a source: tests list keys
	// that S3 allows and their MinIO cannot hold (an object beside a folder of its name).
	OpenSource func(context.Context, understore.Source) (understore.Store, error)
	// Syncer syncs the workers' mounts of a Dataset with its source (spec.sync, or the
	// sync-requested annotation); nil, with no master, fails every sync and says why.
	Syncer DatasetSyncer
	// Reports makes the block reports users ask for (the block-report-requested annotation);
	// nil, with no master, answers each with why there is none.
	Reports BlockReporter
	// ReportCounter, if set, counts the block reports by result.
	ReportCounter *prometheus.CounterVec
	// SyncCounter, if set, counts the syncs by result.
	SyncCounter *prometheus.CounterVec
	// ReachCheck is how often a source whose listing stands is checked to answer at all
	// (0: every minute), so that an outage shows in the status.
	ReachCheck time.Duration

	// probes remembers the last successful probe of each Dataset's source (see probeSource),
	// targetProbes of each output's checkpoint target (see checkpointTargetCondition).
	probes, targetProbes probeMemo
	// views remembers what each Dataset's mounts showed when last asked (see mountedView).
	views viewMemo
}

// DatasetMetadata is the part of the master the Dataset reconciler talks to.
type DatasetMetadata interface {
	GetDatasetUsage(ctx context.Context, req *masterpb.GetDatasetUsageRequest) (*masterpb.DatasetUsage, error)
	DeleteDataset(ctx context.Context, name string) (*masterpb.DeleteDatasetResponse, error)
	// The Lineage reconciler closes the outputs a Job wrote (see completeAtMaster).
	RegisterDataset(ctx context.Context, req *masterpb.RegisterDatasetRequest) (*masterpb.Dataset, error)
	GetDataset(ctx context.Context, req *masterpb.GetDatasetRequest) (*masterpb.Dataset, error)
	CompleteDataset(ctx context.Context, name string) (*masterpb.Dataset, error)
}

// masterCallTimeout bounds one call to the master from a reconcile.
const masterCallTimeout = 10 * time.Second

// usageRefresh is how often a served Dataset's cached bytes are read from the master: often
// enough that `kubectl get datasets` follows a warm-up, rarely enough to cost the master little.
const usageRefresh = 30 * time.Second

// +kubebuilder:rbac:groups=data.strata.dev,resources=datasets,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=data.strata.dev,resources=datasets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=data.strata.dev,resources=datasets/finalizers,verbs=update
// +kubebuilder:rbac:groups=data.strata.dev,resources=lineages;cachepolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=storage.k8s.io,resources=csidrivers,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create;update
// +kubebuilder:rbac:groups="",resources=serviceaccounts/token,verbs=create
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update

// Reconcile runs the deletion or the normal path of one Dataset.
func (r *DatasetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ds := &datav1alpha1.Dataset{}
	if err := r.Client.Get(ctx, req.NamespacedName, ds); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !ds.DeletionTimestamp.IsZero() {
		r.probes.forget(ds.UID)
		r.views.forget(ds.UID)
		return r.reconcileDelete(ctx, ds)
	}
	if !controllerutil.ContainsFinalizer(ds, DatasetFinalizer) {
		// Added before anything is created for the Dataset, so nothing can outlive it. The
		// reconcile goes on: a finalizer bumps no generation, so its update event is filtered.
		patch := client.MergeFrom(ds.DeepCopy())
		controllerutil.AddFinalizer(ds, DatasetFinalizer)
		if err := r.Client.Patch(ctx, ds, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer to Dataset %s/%s: %w", ds.Namespace, ds.Name, err)
		}
	}

	// Whatever this pass found is recorded, even when a later step fails: a sync that ran is
	// not run again, a condition computed is not lost.
	before := ds.DeepCopy()
	result, err := r.reconcileServing(ctx, ds)
	if _, perr := r.patchStatus(ctx, before, ds); perr != nil {
		return ctrl.Result{}, errors.Join(err, perr)
	}
	r.recordTransitions(before, ds)
	return result, err
}

// patchStatus writes ds's status if it differs from before's, and reports whether it did.
func (r *DatasetReconciler) patchStatus(ctx context.Context, before, ds *datav1alpha1.Dataset) (bool, error) {
	if apiequality.Semantic.DeepEqual(before.Status, ds.Status) {
		return false, nil
	}
	if err := r.Client.Status().Patch(ctx, ds, client.MergeFrom(before)); err != nil {
		return false, fmt.Errorf("patching status of Dataset %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	return true, nil
}

// reconcileServing checks a Dataset that is not being deleted, gives it what it needs to be
// served and computes its status in ds; the caller writes the status.
func (r *DatasetReconciler) reconcileServing(ctx context.Context, ds *datav1alpha1.Dataset) (ctrl.Result, error) {
	// outage is a source unreachable after the Dataset was served: not a problem of its own.
	var outage *problem
	pool, problem, err := r.checkReferences(ctx, ds)
	if err != nil {
		return ctrl.Result{}, err
	}
	var access *sourceAccess
	if problem == nil {
		if access, problem, err = r.accessSource(ctx, ds); err != nil {
			return ctrl.Result{}, err
		}
	}
	// A sync runs before the probe, so that the status counts the tree the mounts now show.
	var syncRequeue time.Duration
	if problem == nil && ds.ReadsStores() {
		var synced bool
		if syncRequeue, synced = r.syncMounts(ctx, ds); synced {
			r.probes.forget(ds.UID)
		}
	}
	var summary *sourceSummary
	if problem == nil {
		if problem, summary, err = r.probeSource(ctx, ds, access); err != nil {
			return ctrl.Result{}, err
		}
		if problem != nil && problem.reason == ReasonSourceUnreachable && ds.Status.PersistentVolumeClaimName != "" {
			// Served before: what the nodes cache is served still (see cacheworker/listings),
			// so the Dataset stays Ready and SourceReachable says what is wrong.
			outage, problem = problem, nil
		}
	}
	var ready *metav1.Condition
	if problem == nil {
		if err := r.ensureVolume(ctx, ds, pool, access); err != nil {
			return ctrl.Result{}, err
		}
		if ready, err = r.servingCondition(ctx, ds, pool); err != nil {
			return ctrl.Result{}, err
		}
	}
	var preloaded *metav1.Condition
	if problem == nil && ready.Status == metav1.ConditionTrue {
		if preloaded, err = r.preloadCondition(ctx, ds); err != nil {
			return ctrl.Result{}, err
		}
	}
	setDatasetStatus(ds, problem, ready, preloaded)
	var target *metav1.Condition
	if ds.Spec.Lineage != nil && problem == nil {
		l := &datav1alpha1.Lineage{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: ds.Spec.Lineage.Name}, l); err == nil {
			setOutputPhase(ds, outputState(l, ds.Name))
		}
		if target, err = r.checkpointTargetCondition(ctx, ds); err != nil {
			return ctrl.Result{}, err
		}
	}
	setCheckpointTarget(ds, target)
	setSourceSummary(ds, summary)
	if problem == nil {
		setMountedView(ds, r.mountedView(ctx, ds))
	}
	ds.Status.MountPaths = mountPaths(ds)
	setSourceReachable(ds, summary, outage, problem)
	if err := r.answerBlockReport(ctx, ds, pool, problem); err != nil {
		return ctrl.Result{}, err
	}
	var result ctrl.Result
	switch {
	case target != nil && target.Status != metav1.ConditionTrue:
		// The bucket may be created, the keys fixed, the endpoint come up.
		if r.Master != nil {
			r.refreshUsage(ctx, ds)
		}
		result.RequeueAfter = sourceRecheck
		if secretProblem(target.Reason) {
			result.RequeueAfter = secretRecheck
		}
	case problem != nil && secretProblem(problem.reason):
		result.RequeueAfter = secretRecheck
	case problem != nil && problem.reason == ReasonSourceUnreachable && readsClaims(ds):
		result.RequeueAfter = claimServerRecheck
	case problem != nil && isSourceProblem(problem.reason):
		// A source that failed its probe may be fixed where the operator cannot see it (the
		// endpoint comes up, the bucket is created): look again.
		result.RequeueAfter = sourceRecheck
	case problem == nil && r.Master != nil:
		r.refreshUsage(ctx, ds)
		result.RequeueAfter = usageRefresh
	}
	if access != nil && !access.renewAt.IsZero() {
		result.RequeueAfter = sooner(result.RequeueAfter, max(time.Until(access.renewAt), time.Second))
	}
	result.RequeueAfter = sooner(result.RequeueAfter, syncRequeue)
	if outage != nil {
		// Look again soon: the source coming back is news.
		result.RequeueAfter = sooner(result.RequeueAfter, r.reachCheck())
	}
	return result, nil
}

// sooner is the sooner of two requeue delays, 0 meaning none.
func sooner(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// secretProblem says whether a reason is fixed in the Dataset's Secret (keys missing, or
// refused) or ServiceAccount, which the operator does not watch: such a Dataset is looked at
// every secretRecheck.
func secretProblem(reason string) bool {
	switch reason {
	case ReasonSecretNotFound, ReasonSecretIncomplete, ReasonSourceAccessDenied, ReasonCheckpointAccessDenied,
		ReasonServiceAccountNotFound, ReasonWebIdentityUnsafe:
		return true
	}
	return false
}

func isSourceProblem(reason string) bool {
	switch reason {
	case ReasonSourceAccessDenied, ReasonSourceNotFound, ReasonSourceUnreachable, ReasonSourceEmpty, ReasonSourceNotListable, ReasonClaimServerNotReady:
		return true
	}
	return false
}

// problem is what the user must fix before a Dataset can be served.
type problem struct {
	reason, message string
}

// checkReferences checks every object a Dataset names. It returns the Dataset's TierPool and
// the first problem found.
func (r *DatasetReconciler) checkReferences(ctx context.Context, ds *datav1alpha1.Dataset) (*datav1alpha1.TierPool, *problem, error) {
	pool := &datav1alpha1.TierPool{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: ds.Spec.TierPoolName}, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &problem{ReasonTierPoolNotFound, fmt.Sprintf(
				"TierPool %q does not exist: ask a cluster administrator to create it, or set spec.tierPoolName to one of `kubectl get tierpools`",
				ds.Spec.TierPoolName)}, nil
		}
		return nil, nil, fmt.Errorf("reading TierPool %s: %w", ds.Spec.TierPoolName, err)
	}
	if name := ds.Spec.CachePolicyName; name != "" {
		cp := &datav1alpha1.CachePolicy{}
		if found, err := r.exists(ctx, cp, ds.Namespace, name); err != nil || !found {
			return pool, &problem{ReasonCachePolicyNotFound, fmt.Sprintf(
				"CachePolicy %q does not exist in namespace %s: create it, or remove spec.cachePolicyName to use the defaults", name, ds.Namespace)}, err
		}
		if why := pinnedPathsProblem(cp.Spec.PinnedPaths); why != "" {
			return pool, &problem{ReasonCachePolicyInvalid, fmt.Sprintf("CachePolicy %q: %s: fix the pattern", name, why)}, nil
		}
	}
	var p *problem
	var err error
	if ds.Spec.Lineage != nil {
		p, err = r.checkLineage(ctx, ds)
	} else {
		p, err = r.checkSource(ctx, ds, pool)
	}
	return pool, p, err
}

func (r *DatasetReconciler) exists(ctx context.Context, obj client.Object, namespace, name string) (bool, error) {
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %T %s/%s: %w", obj, namespace, name, err)
	}
	return true, nil
}

func (r *DatasetReconciler) checkLineage(ctx context.Context, ds *datav1alpha1.Dataset) (*problem, error) {
	lineage := &datav1alpha1.Lineage{}
	if found, err := r.exists(ctx, lineage, ds.Namespace, ds.Spec.Lineage.Name); err != nil || !found {
		return &problem{ReasonLineageNotFound, fmt.Sprintf(
			"Lineage %q does not exist in namespace %s: create it with this Dataset in spec.outputs", ds.Spec.Lineage.Name, ds.Namespace)}, err
	}
	for _, out := range lineage.Spec.Outputs {
		if out == ds.Name {
			return nil, nil
		}
	}
	return &problem{ReasonLineageMismatch, fmt.Sprintf(
		"Lineage %q does not list %q in spec.outputs: add it there, or point spec.lineage at the Lineage that writes this Dataset",
		lineage.Name, ds.Name)}, nil
}

// requiredSecretKeys are the keys a source's Secret must hold, by URI scheme.
var requiredSecretKeys = map[string][]string{
	"s3": {"accessKeyID", "secretAccessKey"},
}

// checkSource checks each store a Dataset reads: its Secret, its claim, its path.
func (r *DatasetReconciler) checkSource(ctx context.Context, ds *datav1alpha1.Dataset, pool *datav1alpha1.TierPool) (*problem, error) {
	for _, ref := range datasetStores(ds) {
		if p, err := r.checkStore(ctx, ds, pool, ref); p != nil || err != nil {
			return p, err
		}
	}
	return nil, nil
}

func (r *DatasetReconciler) checkStore(ctx context.Context, ds *datav1alpha1.Dataset, pool *datav1alpha1.TierPool, ref storeRef) (*problem, error) {
	src := ref.src
	scheme, rest, _ := strings.Cut(src.URI, "://")
	if src.SecretRef != nil {
		secret := &corev1.Secret{}
		if found, err := r.exists(ctx, secret, ds.Namespace, src.SecretRef.Name); err != nil || !found {
			return &problem{ReasonSecretNotFound, ref.inMount() + fmt.Sprintf(
				"Secret %q does not exist in namespace %s: create it with the keys %s", src.SecretRef.Name, ds.Namespace,
				strings.Join(keysOrAny(requiredSecretKeys[scheme]), " and "))}, err
		}
		var missing []string
		for _, key := range requiredSecretKeys[scheme] {
			if len(secret.Data[key]) == 0 {
				missing = append(missing, key)
			}
		}
		if len(missing) > 0 {
			return &problem{ReasonSecretIncomplete, ref.inMount() + fmt.Sprintf(
				"Secret %q in namespace %s has no %s: add %s to it", src.SecretRef.Name, ds.Namespace,
				strings.Join(missing, " or "), strings.Join(missing, " and "))}, nil
		}
	}
	switch scheme {
	case "pvc":
		claim, _, _ := strings.Cut(rest, "/")
		if claim == ds.Name {
			return &problem{ReasonClaimNotFound, fmt.Sprintf(
				"pvc://%s names the claim Strata makes for this Dataset itself: a Dataset cannot be its own source; name the claim that holds the data", claim)}, nil
		}
		if found, err := r.exists(ctx, &corev1.PersistentVolumeClaim{}, ds.Namespace, claim); err != nil || !found {
			return &problem{ReasonClaimNotFound, fmt.Sprintf(
				"PersistentVolumeClaim %q does not exist in namespace %s: a pvc:// source reads a claim of the Dataset's own namespace", claim, ds.Namespace)}, err
		}
	case "file":
		if !underAnyRoot("/"+strings.TrimLeft(rest, "/"), pool.Spec.FileSourceRoots) {
			return &problem{ReasonFileSourceNotAllowed, ref.inMount() + fmt.Sprintf(
				"%s is not under any of TierPool %q's spec.fileSourceRoots %v: ask a cluster administrator to allow it, or copy the data to S3",
				src.URI, pool.Name, pool.Spec.FileSourceRoots)}, nil
		}
	}
	return nil, nil
}

func keysOrAny(keys []string) []string {
	if len(keys) == 0 {
		return []string{"the credentials its under-store needs"}
	}
	return keys
}

// underAnyRoot says whether the clean absolute path p lies under one of roots.
func underAnyRoot(p string, roots []string) bool {
	for _, root := range roots {
		root = strings.TrimSuffix(root, "/")
		if p == root || strings.HasPrefix(p, root+"/") {
			return !strings.Contains(p, "/../") && !strings.HasSuffix(p, "/..")
		}
	}
	return false
}

// volumeName is cluster-unique and stable for the life of the Dataset.
func volumeName(ds *datav1alpha1.Dataset) string { return "strata-" + string(ds.UID) }

// poolAffinity keeps the pods that mount a Dataset on the nodes of its TierPool: only there does
// a worker of the pool run to serve the Dataset, and a pod scheduled elsewhere would wait for a
// mount that never comes. Nil when the pool selects every node.
func poolAffinity(pool *datav1alpha1.TierPool) *corev1.VolumeNodeAffinity {
	if len(pool.Spec.NodeSelector) == 0 {
		return nil
	}
	var match []corev1.NodeSelectorRequirement
	for _, key := range slices.Sorted(maps.Keys(pool.Spec.NodeSelector)) {
		match = append(match, corev1.NodeSelectorRequirement{
			Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{pool.Spec.NodeSelector[key]},
		})
	}
	return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: match}},
	}}
}

// volumeAttributes are what the CSI node plugin needs to serve the Dataset on a pod's node.
func volumeAttributes(ds *datav1alpha1.Dataset, access *sourceAccess) map[string]string {
	attrs := map[string]string{
		datav1alpha1.VolumeAttributeNamespace: ds.Namespace,
		datav1alpha1.VolumeAttributeDataset:   ds.Name,
		datav1alpha1.VolumeAttributeUID:       string(ds.UID),
		datav1alpha1.VolumeAttributePool:      ds.Spec.TierPoolName,
	}
	if ds.Spec.Lineage != nil {
		attrs[datav1alpha1.VolumeAttributeOutput] = "true"
	}
	if access != nil && len(access.mounts) > 0 {
		attrs[datav1alpha1.VolumeAttributeMounts] = datav1alpha1.EncodeVolumeMounts(access.volumeMounts())
	} else if access != nil {
		src := access.source
		attrs[datav1alpha1.VolumeAttributeSourceURI] = src.URI
		if src.Endpoint != "" {
			attrs[datav1alpha1.VolumeAttributeSourceEndpoint] = src.Endpoint
		}
		if src.Region != "" {
			attrs[datav1alpha1.VolumeAttributeSourceRegion] = src.Region
		}
	}
	return attrs
}

// ensureVolume creates the Dataset's PersistentVolume and the claim, of the Dataset's name,
// pre-bound to it. Both exist once and are never updated: their specs are immutable.
func (r *DatasetReconciler) ensureVolume(ctx context.Context, ds *datav1alpha1.Dataset, pool *datav1alpha1.TierPool, access *sourceAccess) error {
	mode := corev1.ReadOnlyMany
	if ds.Spec.Lineage != nil {
		mode = corev1.ReadWriteMany // written by its Lineage's Job, then immutable
	}
	capacity := resource.MustParse(datasetVolumeCapacity)
	empty := ""
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: volumeName(ds), Labels: datasetLabels(ds)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: capacity},
			AccessModes: []corev1.PersistentVolumeAccessMode{mode},
			// The data lives in the under-store and the cache; the operator deletes the volume
			// itself when the Dataset goes.
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              empty,
			ClaimRef: &corev1.ObjectReference{
				APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: ds.Namespace, Name: ds.Name,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver:           CSIDriverName,
				VolumeHandle:     ds.Namespace + "/" + ds.Name + "/" + string(ds.UID),
				ReadOnly:         mode == corev1.ReadOnlyMany,
				VolumeAttributes: volumeAttributes(ds, access),
			}},
		},
	}
	pv.Spec.NodeAffinity = poolAffinity(pool)
	if access != nil && access.secretName != "" {
		// The kubelet reads this Secret, of the Dataset's own namespace, and hands it to the
		// node plugin at publish time.
		pv.Spec.CSI.NodePublishSecretRef = &corev1.SecretReference{Name: access.secretName, Namespace: ds.Namespace}
	}
	if err := r.Client.Create(ctx, pv); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating PersistentVolume %s for Dataset %s/%s: %w", pv.Name, ds.Namespace, ds.Name, err)
	}

	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: ds.Name, Namespace: ds.Namespace, Labels: datasetLabels(ds)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{mode},
			StorageClassName: &empty,
			VolumeName:       pv.Name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: capacity}},
		},
	}
	if err := controllerutil.SetControllerReference(ds, pvc, r.Client.Scheme()); err != nil {
		return fmt.Errorf("owning claim %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	existing := &corev1.PersistentVolumeClaim{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(pvc), existing)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, pvc); err != nil {
			return fmt.Errorf("creating claim %s/%s: %w", ds.Namespace, ds.Name, err)
		}
	case err != nil:
		return fmt.Errorf("reading claim %s/%s: %w", ds.Namespace, ds.Name, err)
	case !metav1.IsControlledBy(existing, ds):
		return fmt.Errorf("a PersistentVolumeClaim %s/%s that this Dataset does not own is in the way: rename the Dataset or delete the claim", ds.Namespace, ds.Name)
	}
	ds.Status.PersistentVolumeClaimName = pvc.Name
	return nil
}

// childName is the name of an object made for a Dataset: the Dataset's name with suffix,
// the name shortened so that the whole fits a label value (63 characters).
func childName(ds *datav1alpha1.Dataset, suffix string) string { return objectName(ds.Name, suffix) }

// objectName is name with suffix, name shortened so that the whole fits a label value (63
// characters): the name of an object made for another.
func objectName(name, suffix string) string {
	if limit := 63 - len(suffix); len(name) > limit {
		name = strings.TrimRight(name[:limit], "-.")
	}
	return name + suffix
}

func datasetLabels(ds *datav1alpha1.Dataset) map[string]string {
	return map[string]string{
		"app.kubernetes.io/part-of":    "strata",
		"app.kubernetes.io/managed-by": "strata-operator",
		datasetLabel:                   ds.Name,
	}
}

// servingCondition says whether pods can read the Dataset through its claim now, and if not,
// what is missing in the cluster.
func (r *DatasetReconciler) servingCondition(ctx context.Context, ds *datav1alpha1.Dataset, pool *datav1alpha1.TierPool) (*metav1.Condition, error) {
	cond := &metav1.Condition{Type: datav1alpha1.ConditionReady, Status: metav1.ConditionFalse}
	if found, err := r.exists(ctx, &storagev1.CSIDriver{}, "", CSIDriverName); err != nil {
		return nil, err
	} else if !found {
		cond.Reason = ReasonNoCSIDriver
		cond.Message = fmt.Sprintf("claim %s exists, but the CSI driver %s that serves it is not installed: install Strata's CSI driver (its chart)", ds.Name, CSIDriverName)
		return cond, nil
	}
	if pool.Status.ReadyWorkers == 0 {
		cond.Reason = ReasonNoReadyWorkers
		cond.Message = fmt.Sprintf("claim %s exists, but TierPool %q has no ready cache worker to serve it: see `kubectl describe tierpool %s`",
			ds.Name, pool.Name, pool.Name)
		return cond, nil
	}
	// A pod scheduled before its claim is bound is put back by the scheduler with a growing
	// back-off ("unbound immediate PersistentVolumeClaims"), so Ready waits for the binding
	// that the kube-controller-manager makes between the claim and the volume made for it.
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: ds.Status.PersistentVolumeClaimName}, pvc); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading claim %s/%s: %w", ds.Namespace, ds.Status.PersistentVolumeClaimName, err)
	}
	if pvc.Status.Phase != corev1.ClaimBound {
		cond.Reason = ReasonClaimNotBound
		cond.Message = fmt.Sprintf("claim %s is %s, not yet bound to volume %s: Kubernetes' volume binder (in kube-controller-manager) binds it, usually within seconds; "+
			"if it stays so, see `kubectl -n %s describe pvc %s`",
			ds.Name, cmp.Or(string(pvc.Status.Phase), "new"), volumeName(ds), ds.Namespace, ds.Name)
		return cond, nil
	}
	cond.Status = metav1.ConditionTrue
	cond.Reason = ReasonVolumeReady
	cond.Message = fmt.Sprintf("pods can mount claim %s", ds.Name)
	return cond, nil
}

// reconcileDelete keeps the Dataset while a Lineage that reads it has outputs that would be
// lost with it, then removes its claim and volume and lets it go.
func (r *DatasetReconciler) reconcileDelete(ctx context.Context, ds *datav1alpha1.Dataset) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ds, DatasetFinalizer) {
		return ctrl.Result{}, nil
	}
	if blocker, err := r.uncheckpointedDependent(ctx, ds); err != nil {
		return ctrl.Result{}, err
	} else if blocker != "" {
		before := ds.DeepCopy()
		setDeletionBlocked(ds, blocker)
		if patched, err := r.patchStatus(ctx, before, ds); err != nil {
			return ctrl.Result{}, err
		} else if patched {
			r.Recorder.Event(ds, corev1.EventTypeWarning, ReasonDeletionBlocked, blocker)
		}
		return ctrl.Result{RequeueAfter: dependentsRecheck}, nil
	}

	if err := r.forgetMetadata(ctx, ds); err != nil {
		// Retried: a Dataset whose metadata the master still holds would leave its files
		// listed there for good. The condition says what the deletion waits for.
		before := ds.DeepCopy()
		setDeletionBlocked(ds, err.Error())
		if patched, perr := r.patchStatus(ctx, before, ds); perr != nil {
			return ctrl.Result{}, errors.Join(err, perr)
		} else if patched {
			r.Recorder.Event(ds, corev1.EventTypeWarning, ReasonDeletionBlocked, err.Error())
		}
		return ctrl.Result{}, err
	}

	r.forgetListings(ctx, ds)

	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: ds.Name, Namespace: ds.Namespace}}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err == nil && metav1.IsControlledBy(pvc, ds) {
		if err := r.Client.Delete(ctx, pvc); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("deleting claim %s/%s: %w", ds.Namespace, ds.Name, err)
		}
	} else if client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("reading claim %s/%s: %w", ds.Namespace, ds.Name, err)
	}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: volumeName(ds)}}
	if err := r.Client.Delete(ctx, pv); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("deleting PersistentVolume %s: %w", pv.Name, err)
	}
	patch := client.MergeFrom(ds.DeepCopy())
	controllerutil.RemoveFinalizer(ds, DatasetFinalizer)
	return ctrl.Result{}, r.Client.Patch(ctx, ds, patch)
}

// forgetListings tells the workers of a deleted Dataset's pool to drop the listings they keep
// of its source (a listing of a million objects is 92 MB on a node's disk). A worker that
// cannot be told keeps its copy, which no mount reads again: said in the log and an event, not
// worth holding the deletion for.
func (r *DatasetReconciler) forgetListings(ctx context.Context, ds *datav1alpha1.Dataset) {
	if r.Syncer == nil || !ds.ReadsStores() {
		return
	}
	if err := r.Syncer.ForgetDataset(ctx, ds.Spec.TierPoolName, string(ds.UID)); err != nil {
		ctrl.LoggerFrom(ctx).Info("some workers keep the listing of the deleted Dataset's source", "error", err.Error())
		r.Recorder.Eventf(ds, corev1.EventTypeWarning, ReasonListingsKept,
			"some workers of TierPool %s could not be told to drop their listing of the Dataset's source; it stays on their nodes' disks: %v",
			ds.Spec.TierPoolName, err)
	}
}

// refreshUsage reads from the master what the workers hold of the Dataset. A master that does
// not answer leaves the last figures: they are a view, not a decision.
func (r *DatasetReconciler) refreshUsage(ctx context.Context, ds *datav1alpha1.Dataset) {
	name := datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID))
	cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	usage, err := r.Master.GetDatasetUsage(cctx, &masterpb.GetDatasetUsageRequest{Name: name, StaleOk: true})
	switch {
	case status.Code(err) == codes.NotFound:
		// No worker has cached a block of it yet.
		usage = &masterpb.DatasetUsage{}
	case err != nil:
		ctrl.LoggerFrom(ctx).Info("cannot read the Dataset's cached bytes from the master; keeping the last figures", "error", err.Error())
		return
	}
	setUsage(ds, usage)
}

// forgetMetadata deletes the Dataset's files and blocks from the master (the workers registered
// them as they cached its blocks); a Dataset the master never knew is forgotten already.
func (r *DatasetReconciler) forgetMetadata(ctx context.Context, ds *datav1alpha1.Dataset) error {
	return forgetAtMaster(ctx, r.Master, datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID)))
}

// forgetAtMaster makes the master forget the files of the dataset it knows as name, and with
// them their blocks, which the workers then drop. One it does not know is forgotten already;
// without a master there is nothing to forget.
func forgetAtMaster(ctx context.Context, master DatasetMetadata, name string) error {
	if master == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	resp, err := master.DeleteDataset(ctx, name)
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("waiting for the master to forget the Dataset's files (%s): %w", name, err)
	}
	ctrl.LoggerFrom(ctx).Info("the master forgot the Dataset's files", "dataset", name, "files", resp.GetFilesDeleted())
	return nil
}

// uncheckpointedDependent names a Lineage that reads ds and has an output not yet checkpointed,
// or returns "" when nothing depends on ds any more.
func (r *DatasetReconciler) uncheckpointedDependent(ctx context.Context, ds *datav1alpha1.Dataset) (string, error) {
	lineages := &datav1alpha1.LineageList{}
	if err := r.Client.List(ctx, lineages, client.InNamespace(ds.Namespace)); err != nil {
		return "", fmt.Errorf("listing Lineages in %s: %w", ds.Namespace, err)
	}
	for _, l := range lineages.Items {
		if !contains(l.Spec.Inputs, ds.Name) {
			continue
		}
		for _, out := range l.Spec.Outputs {
			if outputState(&l, out) != datav1alpha1.OutputCheckpointed {
				return fmt.Sprintf("Lineage %s reads this Dataset and its output %s is not checkpointed yet: deletion waits, "+
					"since the output could not be recomputed without it (delete Lineage %s to give it up)", l.Name, out, l.Name), nil
			}
		}
	}
	return "", nil
}

func outputState(l *datav1alpha1.Lineage, name string) datav1alpha1.OutputState {
	return outputStatus(l, name).State
}

// outputStatus is what l's status says of its output name; Pending when it says nothing.
func outputStatus(l *datav1alpha1.Lineage, name string) datav1alpha1.LineageOutputStatus {
	for _, o := range l.Status.Outputs {
		if o.Name == name {
			return o
		}
	}
	return datav1alpha1.LineageOutputStatus{Name: name, State: datav1alpha1.OutputPending}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// recordTransitions records an Event when the Ready condition changes.
func (r *DatasetReconciler) recordTransitions(before, after *datav1alpha1.Dataset) {
	for _, t := range []string{datav1alpha1.ConditionReady, datav1alpha1.ConditionCheckpointTargetReachable} {
		was := findCondition(before.Status.Conditions, t)
		now := findCondition(after.Status.Conditions, t)
		if now == nil || (was != nil && was.Status == now.Status && was.Reason == now.Reason) {
			continue
		}
		eventType := corev1.EventTypeNormal
		if now.Status != metav1.ConditionTrue {
			eventType = corev1.EventTypeWarning
		}
		r.Recorder.Event(after, eventType, now.Reason, now.Message)
	}
	if n := after.Status.LeftOutObjects; n > 0 && n != before.Status.LeftOutObjects {
		var named []string
		for _, o := range after.Status.LeftOut {
			named = append(named, fmt.Sprintf("%q (%s)", o.Key, o.Reason))
		}
		r.Recorder.Eventf(after, corev1.EventTypeWarning, ReasonObjectsLeftOut,
			"%d object(s) of %s cannot be shown in the Dataset's tree, so its mounts leave them out: %s; rename them in the source, or see status.leftOut",
			n, describeStores(after), strings.Join(named, ", "))
	}
}

func findCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// SetupWithManager runs the reconciler on Dataset changes and on changes of what a Dataset
// refers to: its TierPool, Lineage, claim, and the CSI driver. Its Secret is not watched (the
// operator watches no tenant's Secrets): a Dataset whose Secret is missing or incomplete is
// looked at again every secretRecheck.
func (r *DatasetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("dataset").
		For(&datav1alpha1.Dataset{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&corev1.PersistentVolumeClaim{}).
		Owns(&batchv1.Job{}).
		Owns(&appsv1.Deployment{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(claimServerPodDataset)).
		Watches(&datav1alpha1.Lineage{}, handler.EnqueueRequestsFromMapFunc(r.datasetsInNamespace)).
		Watches(&datav1alpha1.CachePolicy{}, handler.EnqueueRequestsFromMapFunc(r.datasetsInNamespace)).
		Watches(&datav1alpha1.TierPool{}, handler.EnqueueRequestsFromMapFunc(r.allDatasets)).
		Watches(&storagev1.CSIDriver{}, handler.EnqueueRequestsFromMapFunc(r.allDatasets)).
		Complete(r)
}

// datasetsInNamespace maps an object to the Datasets of its namespace: few enough per namespace
// that rechecking them all is cheaper than indexing which one refers to what.
func (r *DatasetReconciler) datasetsInNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.datasets(ctx, client.InNamespace(obj.GetNamespace()))
}

func (r *DatasetReconciler) allDatasets(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.datasets(ctx)
}

func (r *DatasetReconciler) datasets(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	list := &datav1alpha1.DatasetList{}
	if err := r.Client.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing Datasets to map an event")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, ds := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ds.Namespace, Name: ds.Name}})
	}
	return reqs
}
