package controllers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/master/masterpb"
)

// MasterBackups is the master as the backup controller uses it (master/client.Client).
type MasterBackups interface {
	Backup(ctx context.Context) (*masterpb.BackupHeader, io.ReadCloser, error)
	Restore(ctx context.Context, r io.Reader) (*masterpb.RestoreResponse, error)
}

// MasterBackupSpec says where the master's backups go, how often, and which one a new install
// starts from: the chart's master.backup values.
type MasterBackupSpec struct {
	// Namespace is the operator's, which holds the Secret and the record ConfigMap.
	Namespace string
	// URI (s3://bucket/prefix), Endpoint and Region name the store of the backups.
	URI, Endpoint, Region string
	// SecretName is a Secret of Namespace with the store's keys, as a Dataset's (accessKeyID and
	// secretAccessKey, or webIdentityToken and roleARN).
	SecretName string
	// Every is the time between scheduled backups; 0 takes them on request only.
	Every time.Duration
	// RestoreFrom is a backup's name under URI, or "latest", that an empty master is restored
	// from once, before any backup is taken; empty restores nothing.
	RestoreFrom string
	// Owner, if set, owns the record ConfigMap (the operator's Deployment).
	Owner *metav1.OwnerReference
}

// RestoreLatest asks for the newest backup under the store.
const RestoreLatest = "latest"

// A backup's object name is its UTC time, so that names sort as times do.
const (
	backupNamePrefix = "strata-master-"
	backupNameSuffix = ".backup"
	backupTimeLayout = "20060102T150405Z"
)

var backupName = regexp.MustCompile(`^strata-master-[0-9]{8}T[0-9]{6}Z\.backup$`)

// RestorePending says whether the master is still to be restored from a backup: one is asked
// for (RestoreFrom), and the record shows no restore yet, neither made nor refused. Until then
// the master may lack what pods wrote before, and nothing it lacks counts as lost.
func (s MasterBackupSpec) RestorePending(ctx context.Context, c client.Reader) (bool, error) {
	if s.RestoreFrom == "" {
		return false, nil
	}
	cm := &corev1.ConfigMap{}
	err := c.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: datav1alpha1.MasterBackupsConfigMap}, cm)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil // made by the backup reconciler before it restores
	case err != nil:
		return false, fmt.Errorf("reading the record of the master's restore (ConfigMap %s/%s): %w", s.Namespace, datav1alpha1.MasterBackupsConfigMap, err)
	}
	return cm.Data[datav1alpha1.BackupKeyRestore] == "", nil
}

// Validate checks the spec at start-up, naming the flags to fix.
func (s MasterBackupSpec) Validate() error {
	if s.URI == "" {
		if s.RestoreFrom != "" || s.Every != 0 {
			return errors.New("--master-backup-every and --master-restore-from need --master-backup-uri, the s3:// folder of the backups")
		}
		return nil
	}
	if !strings.HasPrefix(s.URI, "s3://") {
		return fmt.Errorf("--master-backup-uri=%q: backups go to S3, give s3://bucket/prefix", s.URI)
	}
	if s.SecretName == "" {
		return errors.New("--master-backup-secret is required: a Secret of the operator's namespace with accessKeyID and secretAccessKey that may write under --master-backup-uri")
	}
	if s.Every < 0 || (s.Every > 0 && s.Every < time.Minute) {
		return fmt.Errorf("--master-backup-every=%s: give 0 (on request only) or at least 1m", s.Every)
	}
	if s.RestoreFrom != "" && s.RestoreFrom != RestoreLatest && !backupName.MatchString(s.RestoreFrom) {
		return fmt.Errorf("--master-restore-from=%q: give %q or a backup's name, such as strata-master-20261130T020000Z.backup", s.RestoreFrom, RestoreLatest)
	}
	return nil
}

const (
	// backupRetryAfterError is how soon a failed scheduled backup is tried again.
	backupRetryAfterError = time.Minute
	// restoreRetry is how soon a failed restore is: a new install's master takes a while to
	// answer (its replicas start, elect, and their names are published).
	restoreRetry = 10 * time.Second
	// backupTimeout bounds one backup or restore: a transfer of gigabytes at tens of MB/s.
	backupTimeout = 30 * time.Minute
)

// Event reasons of the record ConfigMap.
const (
	ReasonBackedUp        = "BackedUp"
	ReasonBackupFailed    = "BackupFailed"
	ReasonRestored        = "Restored"
	ReasonRestoreFailed   = "RestoreFailed"
	ReasonRestoreNotTaken = "RestoreNotTaken"
)

// MasterBackupMetrics are the backup controller's.
type MasterBackupMetrics struct {
	Backups     *prometheus.CounterVec
	LastSuccess prometheus.Gauge
	LastBytes   prometheus.Gauge
}

// NewMasterBackupMetrics registers the backup controller's metrics with reg.
func NewMasterBackupMetrics(reg prometheus.Registerer) (*MasterBackupMetrics, error) {
	m := &MasterBackupMetrics{
		Backups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_operator_master_backups_total",
			Help: "Backups of the master the operator took, by result (succeeded, failed).",
		}, []string{"result"}),
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "strata_operator_master_backup_last_success_timestamp_seconds",
			Help: "When the last successful backup of the master was taken (Unix time); alert when it is older than the schedule allows.",
		}),
		LastBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "strata_operator_master_backup_last_bytes",
			Help: "The size of the last successful backup of the master.",
		}),
	}
	for _, c := range []prometheus.Collector{m.Backups, m.LastSuccess, m.LastBytes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the master backup metrics: %w", err)
		}
	}
	return m, nil
}

// MasterBackupReconciler backs the master up to S3 on a schedule and on request, and restores a
// new install's empty master from a backup once. Its record is the ConfigMap
// datav1alpha1.MasterBackupsConfigMap of its namespace, which it creates: `kubectl get configmap
// strata-master-backups -o yaml` shows the last backup, the last failure and the restore, and
// its events say the same as they happen.
type MasterBackupReconciler struct {
	client.Client
	// APIReader reads the store's Secret, which the manager does not cache.
	APIReader client.Reader
	Recorder  record.EventRecorder
	Master    MasterBackups
	Spec      MasterBackupSpec
	Metrics   *MasterBackupMetrics
	// Now is time.Now unless a test sets it.
	Now func() time.Time
	// OpenStore is understore.Open unless a test sets it.
	OpenStore func(context.Context, understore.Source) (understore.Store, error)
}

// The operator keeps the backups' record in a ConfigMap of its namespace, and reads the store's
// Secret there.
// +kubebuilder:rbac:groups="",namespace=strata-system,resources=configmaps,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=strata-system,resources=secrets,verbs=get

func (r *MasterBackupReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *MasterBackupReconciler) key() types.NamespacedName {
	return types.NamespacedName{Namespace: r.Spec.Namespace, Name: datav1alpha1.MasterBackupsConfigMap}
}

// Reconcile restores the master if it must and has not, then takes a backup when one is due.
func (r *MasterBackupReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	cm := &corev1.ConfigMap{}
	if err := r.Get(ctx, r.key(), cm); apierrors.IsNotFound(err) {
		return ctrl.Result{}, r.createRecord(ctx)
	} else if err != nil {
		return ctrl.Result{}, err
	}
	// After a restart of the operator, the gauge says what the record does, not "never".
	if last, err := time.Parse(time.RFC3339, cm.Data[datav1alpha1.BackupKeyLastTime]); err == nil {
		r.Metrics.LastSuccess.Set(float64(last.Unix()))
		if size, err := strconv.ParseInt(cm.Data[datav1alpha1.BackupKeyLastBytes], 10, 64); err == nil {
			r.Metrics.LastBytes.Set(float64(size))
		}
	}

	if r.Spec.RestoreFrom != "" && cm.Data[datav1alpha1.BackupKeyRestore] == "" {
		note, err := r.restore(ctx, cm)
		if err != nil {
			// No backup is taken before the restore: it would be of the empty master, and
			// become the latest.
			log.Error(err, "restoring the master")
			r.Recorder.Event(cm, corev1.EventTypeWarning, ReasonRestoreFailed, err.Error())
			return ctrl.Result{RequeueAfter: restoreRetry}, r.record(ctx, cm, map[string]string{
				datav1alpha1.BackupKeyFailure: "restore: " + err.Error(), datav1alpha1.BackupKeyFailureTime: r.now().UTC().Format(time.RFC3339),
			}, "")
		}
		// Then the schedule, if any, from the next reconcile.
		return ctrl.Result{Requeue: true}, r.record(ctx, cm, map[string]string{datav1alpha1.BackupKeyRestore: note}, "")
	}

	due, next := backupDue(cm, r.Spec.Every, r.now())
	if !due {
		if next.IsZero() {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{RequeueAfter: next.Sub(r.now())}, nil
	}
	request := cm.Annotations[datav1alpha1.AnnotationBackupRequested]
	started := r.now()
	name, header, size, err := r.backup(ctx, started)
	if err != nil {
		r.Metrics.Backups.WithLabelValues("failed").Inc()
		log.Error(err, "backing the master up")
		r.Recorder.Event(cm, corev1.EventTypeWarning, ReasonBackupFailed, err.Error())
		return ctrl.Result{RequeueAfter: backupRetryAfterError}, r.record(ctx, cm, map[string]string{
			datav1alpha1.BackupKeyResult: datav1alpha1.BackupFailed, datav1alpha1.BackupKeyFailure: err.Error(), datav1alpha1.BackupKeyFailureTime: started.UTC().Format(time.RFC3339),
		}, request)
	}
	r.Metrics.Backups.WithLabelValues("succeeded").Inc()
	r.Metrics.LastSuccess.Set(float64(started.Unix()))
	r.Metrics.LastBytes.Set(float64(size))
	msg := fmt.Sprintf("backed the master up to %s/%s: %d bytes, up to Raft index %d, in %s",
		strings.TrimSuffix(r.Spec.URI, "/"), name, size, header.GetIndex(), r.now().Sub(started).Round(time.Millisecond))
	log.Info(msg)
	r.Recorder.Event(cm, corev1.EventTypeNormal, ReasonBackedUp, msg)
	err = r.record(ctx, cm, map[string]string{
		datav1alpha1.BackupKeyResult:    datav1alpha1.BackupSucceeded,
		datav1alpha1.BackupKeyLast:      name,
		datav1alpha1.BackupKeyLastTime:  started.UTC().Format(time.RFC3339),
		datav1alpha1.BackupKeyLastIndex: strconv.FormatUint(header.GetIndex(), 10),
		datav1alpha1.BackupKeyLastBytes: strconv.FormatInt(size, 10),
	}, request)
	if err != nil || r.Spec.Every == 0 {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: r.Spec.Every}, nil
}

// backupDue says whether a backup must be taken now (a new request, or the schedule), and when
// the next scheduled one is (zero if none is). A failure is retried after a minute.
func backupDue(cm *corev1.ConfigMap, every time.Duration, now time.Time) (due bool, next time.Time) {
	if req := cm.Annotations[datav1alpha1.AnnotationBackupRequested]; req != "" && req != cm.Data[datav1alpha1.BackupKeyHandled] {
		return true, time.Time{}
	}
	if every == 0 {
		return false, time.Time{}
	}
	last, _ := time.Parse(time.RFC3339, cm.Data[datav1alpha1.BackupKeyLastTime])
	next = last.Add(every)
	if cm.Data[datav1alpha1.BackupKeyResult] == datav1alpha1.BackupFailed {
		failed, _ := time.Parse(time.RFC3339, cm.Data[datav1alpha1.BackupKeyFailureTime])
		next = failed.Add(min(every, backupRetryAfterError))
	}
	if !now.Before(next) {
		return true, time.Time{}
	}
	return false, next
}

// createRecord makes the record ConfigMap, which says where backups go and how often.
func (r *MasterBackupReconciler) createRecord(ctx context.Context) error {
	schedule := "on request only (kubectl strata backup)"
	if r.Spec.Every > 0 {
		schedule = "every " + r.Spec.Every.String() + ", and on request (kubectl strata backup)"
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: r.Spec.Namespace, Name: datav1alpha1.MasterBackupsConfigMap,
			Labels: map[string]string{"app.kubernetes.io/name": "strata-master", "app.kubernetes.io/component": "master-backups"},
		},
		Data: map[string]string{datav1alpha1.BackupKeyStore: r.Spec.URI, datav1alpha1.BackupKeySchedule: schedule},
	}
	if r.Spec.Owner != nil {
		cm.OwnerReferences = []metav1.OwnerReference{*r.Spec.Owner}
	}
	if err := r.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the ConfigMap %s/%s that records the master's backups: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}

// record merges data into the ConfigMap, and marks request handled if it is not empty.
func (r *MasterBackupReconciler) record(ctx context.Context, cm *corev1.ConfigMap, data map[string]string, request string) error {
	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	for k, v := range data {
		cm.Data[k] = v
	}
	if request != "" {
		cm.Data[datav1alpha1.BackupKeyHandled] = request
	}
	if err := r.Patch(ctx, cm, patch); err != nil {
		return fmt.Errorf("recording in ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}

// store opens the backups' store with the keys of its Secret.
func (r *MasterBackupReconciler) store(ctx context.Context) (understore.Store, error) {
	secret := &corev1.Secret{}
	key := types.NamespacedName{Namespace: r.Spec.Namespace, Name: r.Spec.SecretName}
	if err := r.APIReader.Get(ctx, key, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("the Secret %s/%s of the backups' keys does not exist: create it with accessKeyID and secretAccessKey that may write under %s", key.Namespace, key.Name, r.Spec.URI)
		}
		return nil, fmt.Errorf("reading the Secret %s/%s of the backups' keys: %w", key.Namespace, key.Name, err)
	}
	open := r.OpenStore
	if open == nil {
		open = understore.Open
	}
	store, err := open(ctx, understore.Source{URI: r.Spec.URI, Endpoint: r.Spec.Endpoint, Region: r.Spec.Region, Credentials: stringData(secret)})
	if err != nil {
		return nil, fmt.Errorf("opening the backups' store %s: %w", r.Spec.URI, err)
	}
	return store, nil
}

// backup streams a backup from the master's leader into a new object named after started.
func (r *MasterBackupReconciler) backup(ctx context.Context, started time.Time) (string, *masterpb.BackupHeader, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, backupTimeout)
	defer cancel()
	store, err := r.store(ctx)
	if err != nil {
		return "", nil, 0, err
	}
	header, stream, err := r.Master.Backup(ctx)
	if err != nil {
		return "", nil, 0, fmt.Errorf("asking the master for a backup: %w", err)
	}
	defer func() { _ = stream.Close() }()
	name := backupNamePrefix + started.UTC().Format(backupTimeLayout) + backupNameSuffix
	// Absent: a backup is never written over another; two in the same second fail the second.
	if _, err := store.Write(ctx, name, stream, header.GetSize(), understore.Precondition{Absent: true}); err != nil {
		return "", nil, 0, fmt.Errorf("writing the backup to %s: %w", r.Spec.URI, err)
	}
	return name, header, header.GetSize(), nil
}

// restore restores the master from the configured backup, and says what it did; a master that
// already holds files pods wrote is left alone (said so, not retried): it was restored before,
// or is in use.
func (r *MasterBackupReconciler) restore(ctx context.Context, cm *corev1.ConfigMap) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, backupTimeout)
	defer cancel()
	store, err := r.store(ctx)
	if err != nil {
		return "", err
	}
	name := r.Spec.RestoreFrom
	if name == RestoreLatest {
		if name, err = latestBackup(ctx, store); err != nil {
			return "", err
		}
	}
	body, err := store.Open(ctx, name)
	if err != nil {
		return "", fmt.Errorf("opening the backup %s under %s: %w", name, r.Spec.URI, err)
	}
	defer func() { _ = body.Close() }()
	resp, err := r.Master.Restore(ctx, body)
	if status.Code(err) == codes.FailedPrecondition {
		msg := fmt.Sprintf("not restored from %s: %s", name, status.Convert(err).Message())
		r.Recorder.Event(cm, corev1.EventTypeWarning, ReasonRestoreNotTaken, msg)
		return msg, nil
	}
	if err != nil {
		return "", fmt.Errorf("restoring the master from %s: %w", name, err)
	}
	msg := fmt.Sprintf("restored from %s at %s: %d Dataset(s), %d file(s), up to Raft index %d; %d worker(s) of the backup marked lost, to register again; "+
		"replaced what the new install held, %d Dataset record(s) and %d file(s) of cached blocks, which come back as they are used",
		name, r.now().UTC().Format(time.RFC3339), resp.GetDatasets(), resp.GetFiles(), resp.GetBackupIndex(), len(resp.GetWorkersMarkedLost()),
		resp.GetReplacedDatasets(), resp.GetReplacedFiles())
	if resp.GetAlreadyRestored() {
		// An earlier attempt restored it, and failed before it could say so.
		msg = fmt.Sprintf("restored from %s (by an earlier attempt, finished at %s): %d Dataset(s), %d file(s), up to Raft index %d; %d worker(s) of the backup marked lost, to register again",
			name, r.now().UTC().Format(time.RFC3339), resp.GetDatasets(), resp.GetFiles(), resp.GetBackupIndex(), len(resp.GetWorkersMarkedLost()))
	}
	logf.FromContext(ctx).Info(msg)
	r.Recorder.Event(cm, corev1.EventTypeNormal, ReasonRestored, msg)
	return msg, nil
}

// latestBackup is the name of the newest backup in store.
func latestBackup(ctx context.Context, store understore.Store) (string, error) {
	var names []string
	for info, err := range store.List(ctx, backupNamePrefix) {
		if err != nil {
			return "", fmt.Errorf("listing the backups: %w", err)
		}
		if backupName.MatchString(info.Path) {
			names = append(names, info.Path)
		}
	}
	if len(names) == 0 {
		return "", fmt.Errorf("there is no backup (%s*%s) under %s to restore from", backupNamePrefix, backupNameSuffix, store)
	}
	return slices.Max(names), nil
}

// SetupWithManager reconciles the record ConfigMap: once at start, when it is made or deleted,
// and when its annotations change (a request). Its data is this controller's record: a change
// there is its own, and the times it keeps say when to look again (RequeueAfter), so that a
// failure is not tried again at once.
func (r *MasterBackupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	key := r.key()
	ours := predicate.NewPredicateFuncs(func(obj client.Object) bool {
		return obj.GetNamespace() == key.Namespace && obj.GetName() == key.Name
	})
	toKey, start := singleton(key, &corev1.ConfigMap{})
	return ctrl.NewControllerManagedBy(mgr).
		Named("master-backup").
		WatchesRawSource(start).
		Watches(&corev1.ConfigMap{}, toKey, builder.WithPredicates(ours,
			predicate.Or(predicate.AnnotationChangedPredicate{}, predicate.GenerationChangedPredicate{}))).
		Complete(r)
}
