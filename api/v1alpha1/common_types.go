package v1alpha1

// Condition types shared by the kinds of this package. Each kind's status carries a list of
// metav1.Condition; these are the types the controllers set.
const (
	// ConditionReady is True when the object does what it declares: a Dataset can be mounted,
	// a TierPool's workers run, a Lineage's outputs are available.
	ConditionReady = "Ready"

	// ConditionSourceReachable is True when a Dataset's under-store answers with the
	// credentials given and the prefix exists.
	ConditionSourceReachable = "SourceReachable"

	// ConditionCached is True when every byte of a Dataset is in the cache.
	ConditionCached = "Cached"

	// ConditionCheckpointed is True when every output of a Lineage is in its under-store.
	ConditionCheckpointed = "Checkpointed"

	// ConditionRecomputing is True while a Lineage recomputes lost outputs.
	ConditionRecomputing = "Recomputing"

	// ConditionCheckpointTargetReachable is True when an output Dataset's spec.checkpoint
	// answers with the credentials given: its files can be checkpointed there.
	ConditionCheckpointTargetReachable = "CheckpointTargetReachable"

	// ConditionSynced is True when the last sync of a Dataset's mounts with its source (see
	// DatasetSync) reached every node that mounts it; False says which failed and why, while
	// the mounts keep the tree they had.
	ConditionSynced = "Synced"
)

// ConditionPreloaded says whether a Dataset with spec.preload, or a load request, has been read
// once, so that its pool's workers hold all of it.
const ConditionPreloaded = "Preloaded"

// Reasons of the Preloaded condition.
const (
	ReasonPreloading          = "Preloading"
	ReasonPreloaded           = "Preloaded"
	ReasonPreloadFailed       = "PreloadFailed"
	ReasonPreloadNotAvailable = "PreloadNotAvailable"
)

// AnnotationSyncRequested is the annotation that asks for a sync of a Dataset's mounts with its
// source now, whenever it is set to a new value (a timestamp, say).
const AnnotationSyncRequested = "data.strata.dev/sync-requested"

// AnnotationBlockReportRequested asks the operator, whenever it is set to a new value, where the
// blocks of a Dataset's files are: it writes the answer to a ConfigMap of the Dataset's
// namespace, which status.blockReport names (`kubectl strata ls` and `du` ask this way, so a
// user needs no access to Strata's own components). AnnotationBlockReportDir, if set, narrows
// the report to one folder of the Dataset's tree ("raw/2024").
const (
	AnnotationBlockReportRequested = "data.strata.dev/block-report-requested"
	AnnotationBlockReportDir       = "data.strata.dev/block-report-dir"
)

// AnnotationLoadRequested asks, whenever it is set to a new value, that a Dataset be read once
// more into the cache by a preload Job (see DatasetSpec.Preload), as after a sync or eviction;
// status.loadRequest says which request the last finished preload answered.
const AnnotationLoadRequested = "data.strata.dev/load-requested"

// The master's backups (see the chart's master.backup values): the operator keeps their record in
// the ConfigMap MasterBackupsConfigMap of its namespace, and takes one now whenever
// AnnotationBackupRequested on it is set to a new value (`kubectl strata backup` does); its data
// key "handled-request" then says which request the last backup, or failure, answered.
const (
	MasterBackupsConfigMap    = "strata-master-backups"
	AnnotationBackupRequested = "data.strata.dev/backup-requested"
)

// The keys of MasterBackupsConfigMap's data: where backups go and how often, the last backup
// (its object's name under the store, time, Raft index and size), the last result (succeeded or
// failed) and failure, what the restore of a new install did, and the last request handled.
const (
	BackupKeyStore       = "store"
	BackupKeySchedule    = "schedule"
	BackupKeyLast        = "last-backup"
	BackupKeyLastTime    = "last-backup-time"
	BackupKeyLastIndex   = "last-backup-index"
	BackupKeyLastBytes   = "last-backup-bytes"
	BackupKeyResult      = "last-result"
	BackupKeyFailure     = "last-failure"
	BackupKeyFailureTime = "last-failure-time"
	BackupKeyRestore     = "restore"
	BackupKeyHandled     = "handled-request"
	// The values of BackupKeyResult.
	BackupSucceeded = "succeeded"
	BackupFailed    = "failed"
)

// Watermarks bound how full a tier may get. When the used share of a tier's quota passes High,
// blocks are moved down (or, from the last tier, dropped when that is safe) until it falls to Low.
//
// +kubebuilder:validation:XValidation:rule="self.high > self.low",message="watermarks.high must be above watermarks.low, for example high: 0.9 and low: 0.7"
type Watermarks struct {
	// High is the share of the quota, in (0, 1], at which eviction starts.
	// +kubebuilder:default=0.9
	// +kubebuilder:validation:XValidation:rule="self > 0.0 && self <= 1.0",message="watermarks.high is a share of the quota and must be in (0, 1], for example 0.9"
	High float64 `json:"high"`

	// Low is the share of the quota, in [0, 1), at which eviction stops.
	// +kubebuilder:default=0.7
	// +kubebuilder:validation:XValidation:rule="self >= 0.0 && self < 1.0",message="watermarks.low is a share of the quota and must be in [0, 1), for example 0.7"
	Low float64 `json:"low"`
}

// SecretReference names a Secret in the namespace of the object that refers to it. There is
// deliberately no namespace field: credentials are only ever read from the user's own namespace.
type SecretReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}
