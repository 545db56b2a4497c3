package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DatasetSpec declares where a Dataset's data comes from and how it is cached.
//
// +kubebuilder:validation:XValidation:rule="[has(self.source), has(self.mounts), has(self.lineage)].filter(x, x).size() == 1",message="set exactly one of spec.source (data that already exists in an under-store), spec.mounts (data of several under-stores, each at a folder of the tree) and spec.lineage (data that a Lineage writes)"
// +kubebuilder:validation:XValidation:rule="has(self.source) == has(oldSelf.source) && has(self.mounts) == has(oldSelf.mounts) && has(self.lineage) == has(oldSelf.lineage)",message="a Dataset cannot switch between spec.source, spec.mounts and spec.lineage: create a new Dataset"
// +kubebuilder:validation:XValidation:rule="!has(self.checkpoint) || has(self.lineage)",message="spec.checkpoint only applies to a Lineage's output (spec.lineage): a Dataset with spec.source or spec.mounts is in its under-stores already"
// +kubebuilder:validation:XValidation:rule="!has(self.sync) || has(self.source) || has(self.mounts)",message="spec.sync only applies to a Dataset with spec.source or spec.mounts: a Lineage's output changes only through its Lineage"
type DatasetSpec struct {
	// Source is the under-store that already holds the data. Mutually exclusive with Lineage.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.source is immutable: create a new Dataset to cache other data"
	Source *DatasetSource `json:"source,omitempty"`

	// Mounts are several under-stores shown as one tree, each at a folder of it (as Alluxio's
	// unified namespace, or Fluid's mounts): the object k of the mount at /raw is the file
	// raw/k of the Dataset. Each mount has its own URI, endpoint and Secret. No two mounts may
	// share a folder, and none may lie inside another, so that no object hides another. A
	// Dataset of one store at its root uses spec.source instead. Mutually exclusive with Source
	// and Lineage.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.mounts is immutable: create a new Dataset to cache other data"
	// +kubebuilder:validation:XValidation:rule="self.all(m, self.exists_one(n, n.path == m.path))",message="two mounts share a folder: give each mount a path of its own"
	// +kubebuilder:validation:XValidation:rule="self.all(m, self.all(n, !n.path.startsWith(m.path + '/')))",message="a mount lies inside another (one path is a folder of another's): mounts may not nest, so that no object hides another; move one beside the other"
	Mounts []DatasetMount `json:"mounts,omitempty"`

	// Lineage names the Lineage, in this Dataset's namespace, whose Job writes this Dataset.
	// The Dataset is then an output: written once into memory, made durable by lineage and by
	// checkpoints. Mutually exclusive with Source.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.lineage is immutable: create a new Dataset for another Lineage"
	Lineage *LineageReference `json:"lineage,omitempty"`

	// CachePolicyName names a CachePolicy in this namespace. Empty means the built-in defaults:
	// LRU eviction, Edge checkpointing, one in-memory copy.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	CachePolicyName string `json:"cachePolicyName,omitempty"`

	// TierPoolName names the TierPool whose workers cache this Dataset.
	// +kubebuilder:default=default
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	TierPoolName string `json:"tierPoolName,omitempty"`

	// Preload loads the whole Dataset into the cache as soon as it is created, instead of on
	// first read. Progress shows in status.cachedPercentage. The data.strata.dev/load-requested
	// annotation loads it again, and loads a Dataset without preload once.
	// +optional
	Preload bool `json:"preload,omitempty"`

	// Temporary marks intermediate data that is never checkpointed to the under-store unless
	// memory runs short; lineage alone makes it recoverable.
	// +optional
	Temporary bool `json:"temporary,omitempty"`

	// Checkpoint is the under-store an output's files are checkpointed to: in the background,
	// as the CachePolicy's spec.checkpoint plans it; synchronously, for files above its
	// syncWriteThreshold and before memory full of the output would drop any of it. A lost
	// file that was checkpointed is read back from there instead of recomputed. Only for
	// outputs (spec.lineage). Without it an output lives in memory alone, lineage recovers what
	// is lost, and a memory tier full of it refuses new writes. Checkpoints stay in the
	// under-store when the Dataset is deleted.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.checkpoint is immutable once set: the files checkpointed so far are read back from it; create a new Dataset to checkpoint elsewhere"
	Checkpoint *CheckpointTarget `json:"checkpoint,omitempty"`

	// Sync keeps the mounts of a Dataset with a source in line with it: at each sync one
	// node's mount lists the source again, every node's mount takes that listing, and each
	// shows new files, drops removed ones and serves changed ones at their new size and bytes,
	// live, without a remount (files open at the time read on the version they opened).
	// Besides the interval, a sync runs whenever the annotation data.strata.dev/sync-requested
	// takes a new value:
	//
	//	kubectl annotate dataset NAME data.strata.dev/sync-requested="$(date +%s)" --overwrite
	//
	// Every node shows one tree: a node that mounts the Dataset while another node mounts it
	// shows that node's tree, and the status counts it. Without spec.sync, that is the source
	// as it was listed when the first node mounted it (once no node mounts the Dataset, the
	// next mount lists it again), until such a request.
	// +optional
	Sync *DatasetSync `json:"sync,omitempty"`
}

// DatasetSync says how often a Dataset's mounts list its source again.
//
// +kubebuilder:validation:XValidation:rule="!has(self.interval) || duration(self.interval) >= duration('30s')",message="spec.sync.interval must be at least 30s: each sync lists the whole source on every node that mounts it"
type DatasetSync struct {
	// Interval between syncs, such as 10m. Omitted, syncs run only when requested (the
	// annotation): listing a large bucket on every node costs requests and time, and a sync
	// changes what running pods see, so it is off unless asked for.
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`
}

// DatasetSyncStatus is what the last sync of a Dataset's mounts found.
type DatasetSyncStatus struct {
	// LastSyncTime is when the last sync that reached every node's mount ended.
	// +optional
	LastSyncTime *metav1.Time `json:"lastSyncTime,omitempty"`

	// Request is the value of the data.strata.dev/sync-requested annotation that the last
	// sync answered.
	// +optional
	Request string `json:"request,omitempty"`

	// Mounts is how many nodes' mounts the last sync updated. A node that mounts the Dataset
	// later shows the same tree.
	// +optional
	Mounts int32 `json:"mounts,omitempty"`

	// Added, Removed and Changed count the files the last sync found new, gone and changed
	// (another size, version or modification time), as the mounts saw them.
	// +optional
	Added int64 `json:"added,omitempty"`
	// +optional
	Removed int64 `json:"removed,omitempty"`
	// +optional
	Changed int64 `json:"changed,omitempty"`
}

// CheckpointTarget is the S3 bucket and prefix an output's files are checkpointed to, each
// under its path in the Dataset: s3://bucket/prefix/<path>.
//
// +kubebuilder:validation:XValidation:rule="self.uri.matches('^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$')",message="spec.checkpoint.uri must name an S3 bucket: s3://bucket or s3://bucket/prefix"
type CheckpointTarget struct {
	// URI is s3://bucket or s3://bucket/prefix.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	URI string `json:"uri"`

	// Endpoint of an S3-compatible server, such as http://minio.storage:9000. Empty means AWS S3.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s/]+(/.*)?$`
	// +kubebuilder:validation:MaxLength=2048
	Endpoint string `json:"endpoint,omitempty"`

	// Region of the bucket.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Region string `json:"region,omitempty"`

	// SecretRef names a Secret in the Dataset's namespace with the keys accessKeyID and
	// secretAccessKey (and sessionToken), allowed to write under the prefix.
	SecretRef SecretReference `json:"secretRef"`
}

// DatasetSource is an under-store location.
//
// +kubebuilder:validation:XValidation:rule="self.uri.matches('^(s3|file|pvc|https?)://')",message="the source's uri must start with s3://, file://, pvc://, http:// or https://"
// +kubebuilder:validation:XValidation:rule="!self.uri.startsWith('s3://') || self.uri.matches('^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$')",message="an s3:// source must name a bucket: s3://bucket or s3://bucket/prefix"
// +kubebuilder:validation:XValidation:rule="!self.uri.startsWith('pvc://') || self.uri.matches('^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?$')",message="a pvc:// source must name a PersistentVolumeClaim of the Dataset's namespace: pvc://claim or pvc://claim/path"
// +kubebuilder:validation:XValidation:rule="!self.uri.startsWith('file://') || self.uri.startsWith('file:///')",message="a file:// source must be an absolute path: file:///path"
// +kubebuilder:validation:XValidation:rule="!has(self.endpoint) || self.uri.startsWith('s3://')",message="a source's endpoint only applies to s3:// sources"
// +kubebuilder:validation:XValidation:rule="!has(self.secretRef) || !self.uri.startsWith('pvc://')",message="a pvc:// source takes no secretRef: Strata reads the claim itself, through a server it runs in the Dataset's namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.webIdentity) || self.uri.startsWith('s3://')",message="webIdentity only applies to s3:// sources: it trades a ServiceAccount's token for S3 credentials"
// +kubebuilder:validation:XValidation:rule="!(has(self.webIdentity) && has(self.secretRef))",message="set one of secretRef (keys in a Secret) and webIdentity (a role assumed with a ServiceAccount's token), not both"
type DatasetSource struct {
	// URI of the data: s3://bucket/prefix, file:///path (only under the TierPool's
	// fileSourceRoots), pvc://claim/path (a folder of a claim in the Dataset's namespace, which
	// Strata mounts read-only in a claim server it runs there), or http(s)://host/path/ (a
	// folder whose server answers with HTML directory indexes, as nginx's autoindex, Apache's
	// Indexes and python3 -m http.server do: its links are walked, each file described by a
	// HEAD).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	URI string `json:"uri"`

	// Endpoint of an S3-compatible server, such as http://minio.storage:9000. Empty means AWS S3.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s/]+(/.*)?$`
	// +kubebuilder:validation:MaxLength=2048
	Endpoint string `json:"endpoint,omitempty"`

	// Region of an S3 bucket.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Region string `json:"region,omitempty"`

	// SecretRef names a Secret in the Dataset's namespace with the credentials: keys
	// accessKeyID and secretAccessKey for s3://, username and password or token for https://.
	// Without it (and without webIdentity), the source is read anonymously: a public bucket or
	// server.
	// +optional
	SecretRef *SecretReference `json:"secretRef,omitempty"`

	// WebIdentity reads an s3:// source with temporary credentials of a role, assumed with a
	// token of a ServiceAccount of the Dataset's namespace (AssumeRoleWithWebIdentity, as IRSA
	// and its peers do), instead of keys in a Secret.
	// +optional
	WebIdentity *WebIdentity `json:"webIdentity,omitempty"`
}

// WebIdentity is a role an s3:// source is read as, assumed with a ServiceAccount's token.
//
// The operator asks the API server for a token of the ServiceAccount (TokenRequest), for the
// audience given and valid for an hour, keeps it in the Secret <dataset>-web-identity (or the
// mounts' Secret) beside the Dataset, and asks for a new one when a fifth of its life is left;
// the workers trade it at the STS endpoint for credentials of the role, and take each new token
// without a remount. So whoever may create Datasets in a namespace may read as any of its
// ServiceAccounts that the role trusts, as whoever may create pods there may; a token the API
// server itself would accept (an audience of its own) is refused, never kept.
type WebIdentity struct {
	// RoleARN is the role to assume, such as arn:aws:iam::123456789012:role/training-data.
	// Its trust policy must accept the token's issuer (the cluster's service account issuer),
	// audience and subject (system:serviceaccount:<namespace>:<serviceAccountName>).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	RoleARN string `json:"roleARN"`

	// ServiceAccountName is the ServiceAccount of the Dataset's namespace whose token is
	// traded for the role's credentials.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName"`

	// Audience the token is issued for: what the STS endpoint expects (AWS: sts.amazonaws.com;
	// MinIO: its OpenID client ID).
	// +kubebuilder:default=sts.amazonaws.com
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Audience string `json:"audience,omitempty"`

	// STSEndpoint is where the token is traded, such as https://sts.eu-west-1.amazonaws.com.
	// Empty means the source's endpoint when it has one (MinIO serves STS there), else AWS's
	// STS of the source's region.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s/]+/?$`
	// +kubebuilder:validation:MaxLength=2048
	STSEndpoint string `json:"stsEndpoint,omitempty"`
}

// DatasetMount is one under-store of a Dataset of several (spec.mounts), at a folder of its tree.
//
// +kubebuilder:validation:XValidation:rule="!self.path.matches('/[.][.]?(/|$)')",message="a mount path has no '.' or '..' elements: write it as /folder/sub"
type DatasetMount struct {
	// Path is the folder of the Dataset's tree the store is shown at, such as /raw or
	// /ref/genomes: absolute, without a trailing slash, never the root.
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(/[^/]+)+$`
	Path string `json:"path"`

	// Source is the store, as spec.source describes one; its secretRef names a Secret of the
	// Dataset's namespace. A pvc:// mount is read through a claim server of its own, which
	// Strata runs in the Dataset's namespace as for spec.source.
	Source DatasetSource `json:"source"`
}

// LineageReference names a Lineage in the same namespace.
type LineageReference struct {
	// Name of the Lineage.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// DatasetPhase is a one-word summary of a Dataset's state.
// +kubebuilder:validation:Enum=Pending;Loading;Ready;Degraded;Lost;Recomputing
type DatasetPhase string

// The phases of a Dataset.
const (
	// DatasetPending means accepted, not yet registered or its source not yet validated.
	DatasetPending DatasetPhase = "Pending"
	// DatasetLoading means being preloaded or written.
	DatasetLoading DatasetPhase = "Loading"
	// DatasetReady means mountable; every byte is cached or readable from its source.
	DatasetReady DatasetPhase = "Ready"
	// DatasetDegraded means mountable, but some blocks are lost and will be re-read or recomputed.
	DatasetDegraded DatasetPhase = "Degraded"
	// DatasetLost means data is gone and there is neither a checkpoint nor a Lineage to recompute it.
	DatasetLost DatasetPhase = "Lost"
	// DatasetRecomputing means lost outputs are being recomputed from lineage.
	DatasetRecomputing DatasetPhase = "Recomputing"
)

// TierUsage is how many bytes of a Dataset one tier holds, summed over nodes.
type TierUsage struct {
	// Tier is the tier's name in the TierPool.
	Tier string `json:"tier"`
	// Bytes of the Dataset in this tier.
	Bytes int64 `json:"bytes"`
}

// NodeUsage is how much of a Dataset the workers of one node hold.
type NodeUsage struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Bytes of the Dataset's blocks held on the node.
	Bytes int64 `json:"bytes"`
}

// MaxStatusNodes is how many nodes a Dataset's status lists.
const MaxStatusNodes = 16

// LeftOutObject is an object of the source that a Dataset's tree does not show.
type LeftOutObject struct {
	// Key is the object's key, relative to the source.
	Key string `json:"key"`
	// Reason says why it is left out.
	Reason string `json:"reason"`
}

// DatasetStatus is the observed state of a Dataset.
type DatasetStatus struct {
	// Phase summarises the conditions for kubectl get.
	// +optional
	Phase DatasetPhase `json:"phase,omitempty"`

	// Conditions: Ready, SourceReachable, Cached, Synced.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// TotalBytes is the size of the Dataset.
	// +optional
	TotalBytes int64 `json:"totalBytes,omitempty"`

	// Files is the number of files in the Dataset.
	// +optional
	Files int64 `json:"files,omitempty"`

	// MountPaths are the folders of spec.mounts, comma-separated, for kubectl get (a printer
	// column shows one element of a list only).
	// +optional
	MountPaths string `json:"mountPaths,omitempty"`

	// LeftOutObjects counts the objects of the source that the Dataset's tree cannot show, so
	// its mounts do not: keys that are no paths (an empty, "." or ".." element, a name longer
	// than 255 bytes), objects of unknown size, and an object whose key is also a folder of
	// others ("a" beside "a/b", which S3 allows and a file system cannot show).
	// +optional
	LeftOutObjects int64 `json:"leftOutObjects,omitempty"`

	// LeftOut names the first few of them, with why each is left out.
	// +optional
	// +kubebuilder:validation:MaxItems=10
	LeftOut []LeftOutObject `json:"leftOut,omitempty"`

	// CachedBytes is how much of it is in the cache, in any tier.
	// +optional
	CachedBytes int64 `json:"cachedBytes,omitempty"`

	// Replicas, for an output, is the fewest nodes that hold a copy of one of its blocks: how
	// many nodes its data survives the loss of, less one, without a recomputation or a
	// checkpoint read (see CachePolicy spec.replication). 0 when a block has no copy.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// CachedPercentage is CachedBytes over TotalBytes, for kubectl get, such as "87%".
	// +optional
	CachedPercentage string `json:"cachedPercentage,omitempty"`

	// Size is TotalBytes in binary units, for kubectl get, such as "1.5Gi".
	// +optional
	Size string `json:"size,omitempty"`

	// Tiers is the use per tier.
	// +optional
	// +listType=map
	// +listMapKey=tier
	Tiers []TierUsage `json:"tiers,omitempty"`

	// Nodes are the nodes that hold the most of the Dataset, most first (at most
	// MaxStatusNodes): pods that mount the Dataset are steered to them.
	// +optional
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=16
	Nodes []NodeUsage `json:"nodes,omitempty"`

	// CheckpointedBytes is how much of an output Dataset is durable in its under-store.
	// +optional
	CheckpointedBytes int64 `json:"checkpointedBytes,omitempty"`

	// PersistentVolumeClaimName is the claim, in the Dataset's namespace, that pods mount.
	// +optional
	PersistentVolumeClaimName string `json:"persistentVolumeClaimName,omitempty"`

	// Sync is what the last sync of the mounts with the source found (spec.sync, or a
	// request); the Synced condition says whether the last one failed, and why.
	// +optional
	Sync *DatasetSyncStatus `json:"sync,omitempty"`

	// BlockReport is the operator's answer to the last data.strata.dev/block-report-requested
	// annotation: where the blocks of the Dataset's files are.
	// +optional
	BlockReport *DatasetBlockReportStatus `json:"blockReport,omitempty"`

	// LoadRequest is the value of the data.strata.dev/load-requested annotation that the last
	// finished preload answered.
	// +optional
	LoadRequest string `json:"loadRequest,omitempty"`
}

// DatasetBlockReportStatus says where the operator wrote the report a user asked for with the
// data.strata.dev/block-report-requested annotation, or why it could not.
type DatasetBlockReportStatus struct {
	// Request is the value of the annotation this report answers.
	Request string `json:"request"`

	// ConfigMapName is the ConfigMap of the Dataset's namespace that holds the report (its key
	// report.json); empty when there is none, and Message says why.
	// +optional
	ConfigMapName string `json:"configMapName,omitempty"`

	// Dir is the folder of the Dataset's tree the report covers; empty for the whole tree.
	// +optional
	Dir string `json:"dir,omitempty"`

	// Time is when the report was made.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`

	// Files is how many files the report describes, and TotalFiles how many the folder holds:
	// fewer are described when a report would outgrow a ConfigMap (ask for a folder then).
	// +optional
	Files int64 `json:"files,omitempty"`
	// +optional
	TotalFiles int64 `json:"totalFiles,omitempty"`

	// Message says why there is no report, or what it leaves out.
	// +optional
	Message string `json:"message,omitempty"`
}

// Dataset is data that Strata caches near the pods that read it: existing data in an
// under-store, or the output of a Lineage. Pods mount it through the PVC in status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=strata
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Cached",type=string,JSONPath=`.status.cachedPercentage`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.source.uri`,priority=1
// +kubebuilder:printcolumn:name="Mounts",type=string,JSONPath=`.status.mountPaths`,priority=1
// +kubebuilder:printcolumn:name="Lineage",type=string,JSONPath=`.spec.lineage.name`,priority=1
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`,priority=1
// +kubebuilder:printcolumn:name="PVC",type=string,JSONPath=`.status.persistentVolumeClaimName`,priority=1
// +kubebuilder:printcolumn:name="Synced",type=date,JSONPath=`.status.sync.lastSyncTime`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Dataset struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DatasetSpec   `json:"spec"`
	Status DatasetStatus `json:"status,omitempty"`
}

// DatasetList is a list of Datasets.
//
// +kubebuilder:object:root=true
type DatasetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Dataset `json:"items"`
}

// ReadsStores says whether the Dataset is read from under-stores (spec.source or spec.mounts),
// rather than written by a Lineage's pods.
func (ds *Dataset) ReadsStores() bool {
	return ds.Spec.Source != nil || len(ds.Spec.Mounts) > 0
}

func init() {
	knownTypes = append(knownTypes, &Dataset{}, &DatasetList{})
}
