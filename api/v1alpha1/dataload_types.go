package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DataLoadSpec says which files of a Dataset to load into the cache, onto which nodes, and when.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.nodes) && size(self.nodes) > 0 && has(self.nodeCount))",message="give nodes or nodeCount, not both"
type DataLoadSpec struct {
	// DatasetName is the Dataset of this namespace to load: one read from an under-store
	// (spec.source or spec.mounts); a Lineage's output is written into the cache already.
	// +kubebuilder:validation:MinLength=1
	DatasetName string `json:"datasetName"`

	// Paths selects the files to load by glob patterns of their paths in the Dataset:
	// "train/*.parquet" (a segment as path.Match matches it), "labels/**" (every file below),
	// "**/index.json". A file is loaded if any pattern matches it; no pattern loads every file.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Paths []string `json:"paths,omitempty"`

	// Nodes are the nodes to load onto, each a node of the Dataset's TierPool (one that runs
	// its worker).
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	Nodes []string `json:"nodes,omitempty"`

	// NodeCount is how many nodes of the Dataset's TierPool to load onto when Nodes is empty:
	// those that hold the most of the Dataset already first, then by name. Default 1.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	NodeCount *int32 `json:"nodeCount,omitempty"`

	// Schedule loads again at the times of this cron expression (five fields, minute first,
	// UTC: "0 * * * *" is hourly), so that files the under-store gained, or that eviction took,
	// are brought back; empty loads once. A run that is still going when the next is due is
	// left to finish, and the due run starts after it.
	// +optional
	Schedule string `json:"schedule,omitempty"`

	// PercentOfEachFile loads that share of each selected file, in blocks spread over the file
	// (van der Corput order, as Kariz caches strides: however the file's readers split it, each
	// finds about that share in memory); 100, the default, loads whole files. Prefetches of a
	// CachePolicy's CMR policy load part of their inputs this way.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	PercentOfEachFile *int32 `json:"percentOfEachFile,omitempty"`

	// MetadataOnly loads the selected files' metadata only: each node mounts the Dataset, which
	// lists it and keeps the listing, and looks every selected file up, reading no byte. Its
	// progress counts the files the nodes show, not cached bytes.
	// +optional
	MetadataOnly bool `json:"metadataOnly,omitempty"`
}

// The phases of a DataLoad.
const (
	// DataLoadPending: the load cannot start yet (its Dataset is missing or not Ready, or its
	// spec is wrong); the Loaded condition says why.
	DataLoadPending = "Pending"
	// DataLoadLoading: a run's Jobs are reading the selection on their nodes.
	DataLoadLoading = "Loading"
	// DataLoadLoaded: every selected byte (every selected file, for metadataOnly) is on every
	// node of the load.
	DataLoadLoaded = "Loaded"
	// DataLoadIncomplete: the run's Jobs finished, but the nodes do not hold all of the
	// selection (a tier too small for it, or eviction since).
	DataLoadIncomplete = "Incomplete"
	// DataLoadFailed: a Job of the run failed, or the run found no file to load.
	DataLoadFailed = "Failed"
)

// ConditionLoaded says whether a DataLoad's last run put every selected byte on its nodes.
const ConditionLoaded = "Loaded"

// Reasons of the Loaded condition of a DataLoad.
const (
	ReasonLoading           = "Loading"
	ReasonLoaded            = "Loaded"
	ReasonNotAllHeld        = "NotAllHeld"
	ReasonLoadFailed        = "LoadFailed"
	ReasonNothingSelected   = "NothingSelected"
	ReasonDatasetNotFound   = "DatasetNotFound"
	ReasonDatasetNotReady   = "DatasetNotReady"
	ReasonNotLoadable       = "DatasetNotLoadable"
	ReasonInvalidSpec       = "InvalidSpec"
	ReasonNoNodes           = "NoNodes"
	ReasonLoadNotAvailable  = "LoadNotAvailable"
	ReasonProgressUnknown   = "ProgressUnknown"
	ReasonWaitingForNextRun = "WaitingForNextRun"
)

// LoadCount is how much of a selection is loaded: Done of Total.
type LoadCount struct {
	// +optional
	Done int64 `json:"done"`
	// +optional
	Total int64 `json:"total"`
}

// DataLoadNode is a DataLoad's progress on one node, as that node's worker counts it.
type DataLoadNode struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Files counts the selected files every block of which the node holds (for metadataOnly:
	// that the node's mount shows).
	Files LoadCount `json:"files"`
	// Bytes counts the selected bytes the node holds (for metadataOnly: their size, once the
	// node shows the files).
	Bytes LoadCount `json:"bytes"`
	// JobName is the Job of the run on this node.
	// +optional
	JobName string `json:"jobName,omitempty"`
}

// DataLoadStatus is what the last run loaded, node by node.
type DataLoadStatus struct {
	// ObservedGeneration is the generation of the spec the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase is Pending, Loading, Loaded, Incomplete or Failed.
	// +optional
	Phase string `json:"phase,omitempty"`

	// Progress is Bytes.Done over Bytes.Total of the last run, all nodes together, such as
	// "87%" (for metadataOnly, of Files). It says 100% only once every node holds every
	// selected byte: it is counted from the nodes' tiers, not from what the Jobs read.
	// +optional
	Progress string `json:"progress,omitempty"`

	// Files and Bytes are the nodes' counts added up.
	// +optional
	Files LoadCount `json:"files,omitempty"`
	// +optional
	Bytes LoadCount `json:"bytes,omitempty"`

	// Nodes is the progress of each node of the last run.
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Nodes []DataLoadNode `json:"nodes,omitempty"`

	// Runs counts the runs started; the Jobs of run N are named after it.
	// +optional
	Runs int32 `json:"runs,omitempty"`

	// LastRunTime is when the last run started, and LastLoadedTime when a run last reached
	// Loaded.
	// +optional
	LastRunTime *metav1.Time `json:"lastRunTime,omitempty"`
	// +optional
	LastLoadedTime *metav1.Time `json:"lastLoadedTime,omitempty"`

	// NextRunTime is when the schedule starts the next run.
	// +optional
	NextRunTime *metav1.Time `json:"nextRunTime,omitempty"`

	// Conditions: Loaded.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DataLoad loads selected files of a Dataset into the cache of chosen nodes, once or on a
// schedule, and says exactly how much of them the nodes hold.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=strata
// +kubebuilder:printcolumn:name="Dataset",type=string,JSONPath=`.spec.datasetName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Files",type=integer,JSONPath=`.status.files.done`,priority=1
// +kubebuilder:printcolumn:name="Of",type=integer,JSONPath=`.status.files.total`,priority=1
// +kubebuilder:printcolumn:name="Schedule",type=string,JSONPath=`.spec.schedule`,priority=1
// +kubebuilder:printcolumn:name="Last Run",type=date,JSONPath=`.status.lastRunTime`
// +kubebuilder:printcolumn:name="Next Run",type=date,JSONPath=`.status.nextRunTime`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type DataLoad struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DataLoadSpec   `json:"spec"`
	Status DataLoadStatus `json:"status,omitempty"`
}

// DataLoadList is a list of DataLoads.
//
// +kubebuilder:object:root=true
type DataLoadList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DataLoad `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &DataLoad{}, &DataLoadList{})
}
