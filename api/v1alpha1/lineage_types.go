package v1alpha1

import (
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DependencyType says which inputs each output of a Lineage depends on.
// +kubebuilder:validation:Enum=Narrow;Wide
type DependencyType string

const (
	// DependencyNarrow means output i depends on input i alone, so losing output i reruns only its part.
	DependencyNarrow DependencyType = "Narrow"
	// DependencyWide means every output depends on every input.
	DependencyWide DependencyType = "Wide"
)

// LineageSpec is how a set of output Datasets is computed from a set of input Datasets.
//
// +kubebuilder:validation:XValidation:rule="has(self.outputs) && size(self.outputs) > 0",message="spec.outputs must name at least one Dataset that this Lineage writes"
// +kubebuilder:validation:XValidation:rule="!has(self.inputs) || !has(self.outputs) || self.outputs.all(o, !(o in self.inputs))",message="a Dataset cannot be both an input and an output of one Lineage: remove it from spec.inputs or from spec.outputs"
// +kubebuilder:validation:XValidation:rule="!has(self.dependency) || self.dependency != 'Narrow' || (has(self.inputs) && has(self.outputs) && size(self.inputs) == size(self.outputs))",message="a Narrow Lineage maps input i to output i, so spec.inputs and spec.outputs must have the same length; use dependency: Wide otherwise"
// +kubebuilder:validation:XValidation:rule="!has(self.dependency) || self.dependency != 'Narrow' || (has(self.template.spec) && has(self.template.spec.completionMode) && self.template.spec.completionMode == 'Indexed' && (has(self.partitions) || (has(self.template.spec.completions) && has(self.outputs) && self.template.spec.completions == size(self.outputs))))",message="a Narrow Lineage reruns only the completion indexes that write what was lost: its Job must be Indexed, with spec.partitions or with spec.completions equal to the number of outputs (index i reads input i and writes output i); use dependency: Wide otherwise"
// +kubebuilder:validation:XValidation:rule="has(self.template.spec) && has(self.template.spec.template.spec) && size(self.template.spec.template.spec.containers) > 0",message="spec.template must be a Job template with at least one container in spec.template.spec.template.spec.containers"
// +kubebuilder:validation:XValidation:rule="!has(self.partitions) || (has(self.outputs) && self.partitions.all(p, p.output in self.outputs))",message="every spec.partitions[].output must be one of spec.outputs"
type LineageSpec struct {
	// Inputs are the names of the Datasets, in this namespace, that the Job reads, in order.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	Inputs []string `json:"inputs,omitempty"`

	// Outputs are the names of the Datasets, in this namespace, that the Job writes, in order.
	// Each must declare this Lineage in its spec.lineage.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	Outputs []string `json:"outputs,omitempty"`

	// Dependency is Narrow (output i depends on input i alone) or Wide (on all inputs). A
	// Narrow Lineage's Job is Indexed: the indexes spec.partitions maps to what was lost rerun,
	// or, without partitions, index i for a lost output i (spec.completions equal to the number
	// of outputs); and a recomputation waits only for the inputs of the outputs it writes, so
	// output i comes back while input j is still being recomputed. A Wide Lineage reruns as
	// its partitions say too, but always waits for every input.
	// +kubebuilder:default=Wide
	// +optional
	Dependency DependencyType `json:"dependency,omitempty"`

	// Template is the Job that computes the outputs. Its arguments and configuration are opaque
	// to Strata; recomputation creates a Job from it, with the inputs and outputs mounted at the
	// same paths.
	Template batchv1.JobTemplateSpec `json:"template"`

	// Partitions maps the completion indexes of an Indexed Job to the output partitions they
	// write, so that recovery reruns only the indexes whose partitions were lost.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4096
	Partitions []OutputPartition `json:"partitions,omitempty"`

	// MaxRecomputations caps how many times lost outputs are recomputed before the Lineage
	// reports Failed instead of retrying; a Job that fails deterministically must not loop. A
	// recomputation whose pod was disrupted (preempted, evicted) does not count: it comes back.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxRecomputations int32 `json:"maxRecomputations,omitempty"`
}

// OutputPartition ties one completion index of an Indexed Job to the part of an output it writes.
type OutputPartition struct {
	// Index is the Job completion index.
	// +kubebuilder:validation:Minimum=0
	Index int32 `json:"index"`
	// Output is the output Dataset's name.
	// +kubebuilder:validation:MinLength=1
	Output string `json:"output"`
	// Path is the partition's path inside the output, such as part-00003.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.contains('..')",message="spec.partitions[].path is relative to the output and may not contain '..'"
	Path string `json:"path"`
}

// OutputState is where one output of a Lineage stands.
// +kubebuilder:validation:Enum=Pending;InMemory;Checkpointing;Checkpointed;Lost;Recomputing
type OutputState string

// The states of a Lineage output.
const (
	// OutputPending: not written yet.
	OutputPending OutputState = "Pending"
	// OutputInMemory: written, every file in memory, none in the under-store.
	OutputInMemory OutputState = "InMemory"
	// OutputCheckpointing: some of its files are in the under-store, the others in memory,
	// checkpointed as its CachePolicy plans (Edge leaves the files that a Lineage read already
	// in memory, unless they are hot: the newer files computed from them are checkpointed).
	OutputCheckpointing OutputState = "Checkpointing"
	// OutputCheckpointed: every file is in the under-store.
	OutputCheckpointed OutputState = "Checkpointed"
	// OutputLost: a file has neither a copy in memory nor a checkpoint, or the master no longer
	// knows the output at all (its state was lost); it is recomputed.
	OutputLost OutputState = "Lost"
	// OutputRecomputing: a recomputation Job writes it again.
	OutputRecomputing OutputState = "Recomputing"
)

// LineageOutputStatus is the state of one output.
type LineageOutputStatus struct {
	// Name of the output Dataset.
	Name string `json:"name"`
	// State of the output.
	State OutputState `json:"state"`
	// CheckpointedBytes is how much of it is durable in the under-store.
	// +optional
	CheckpointedBytes int64 `json:"checkpointedBytes,omitempty"`
	// Replicas is the fewest nodes that hold a copy of one of its blocks (its CachePolicy's
	// spec.replication.count once replication caught up; 0 when a block has none).
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// Bytes is the output's size as the master last reported it. An output the master held
	// bytes of and then no longer knows at all is Lost: the master's state was lost (every
	// replica replaced on emptyDir storage, or restored from a backup older than the output).
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
}

// RecomputationStatus describes the recomputation Job that runs now.
type RecomputationStatus struct {
	// JobName is the recomputation Job in the Lineage's namespace.
	JobName string `json:"jobName"`
	// PriorityClassName is the class the Job's pods run with, inherited from the highest-priority
	// pod waiting on the lost data.
	PriorityClassName string `json:"priorityClassName"`
	// Indexes are the completion indexes being rerun; empty means the whole Job.
	// +optional
	// +listType=atomic
	Indexes []int32 `json:"indexes,omitempty"`
	// StartTime is when the Job was created.
	StartTime metav1.Time `json:"startTime"`
}

// LineageStatus is the observed state of a Lineage.
type LineageStatus struct {
	// Conditions: Ready, Checkpointed, Recomputing.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Outputs is the state of each output.
	// +optional
	// +listType=map
	// +listMapKey=name
	Outputs []LineageOutputStatus `json:"outputs,omitempty"`

	// Recomputations counts the recomputation Jobs created so far.
	// +optional
	Recomputations int32 `json:"recomputations,omitempty"`

	// ActiveRecomputation is the recomputation running now, if any.
	// +optional
	ActiveRecomputation *RecomputationStatus `json:"activeRecomputation,omitempty"`

	// UncheckpointedDepth is the length of the longest chain of uncheckpointed outputs ending at
	// this Lineage: how many Jobs a loss could force to rerun.
	// +optional
	UncheckpointedDepth int32 `json:"uncheckpointedDepth,omitempty"`

	// RunTime is what the step's runs tell of its run time, and the run time predicted for a
	// run that would start now (Kariz §3.3).
	// +optional
	RunTime *LineageRunTime `json:"runTime,omitempty"`
}

// MaxRecordedRuns is how many of a step's runs its status keeps.
const MaxRecordedRuns = 10

// LineageRunTime is what the operator learned of a step's run time from its runs (its run Job
// and each recomputation of the whole step): a run takes the step's own work plus its reads,
// the uncached part at the under-store's rate and the cached part at the cache's, each rate as
// the step's runs show it.
type LineageRunTime struct {
	// Runs are the step's last runs that succeeded, oldest first.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	Runs []LineageRun `json:"runs,omitempty"`
	// Predicted is the run time predicted for a run that starts now, with the inputs as cached
	// as they are, such as "1m12s".
	// +optional
	Predicted string `json:"predicted,omitempty"`
	// PredictedMilliseconds is Predicted in milliseconds.
	// +optional
	PredictedMilliseconds int64 `json:"predictedMilliseconds,omitempty"`
	// CachedPercentage is the share of the inputs cached now, which Predicted assumes.
	// +optional
	CachedPercentage string `json:"cachedPercentage,omitempty"`
	// LastError is how far the prediction made when the last run started was from its run
	// time, (actual - predicted) / predicted, such as "+12%".
	// +optional
	LastError string `json:"lastError,omitempty"`
	// OwnWorkSeconds is the part of a run that does not depend on its reads (start-up and
	// compute), as the runs show it.
	// +optional
	OwnWorkSeconds int64 `json:"ownWorkSeconds,omitempty"`
	// UnderStoreRate is the rate the step reads uncached input at, as its runs show it, such as
	// "85Mi/s"; empty when its runs show no dependence on it.
	// +optional
	UnderStoreRate string `json:"underStoreRate,omitempty"`
}

// LineageRun is one run of a step that succeeded.
type LineageRun struct {
	// Job is the Job that ran it.
	Job string `json:"job"`
	// Finished is when the Job completed.
	Finished metav1.Time `json:"finished"`
	// Milliseconds is how long the Job ran, from its start to its completion.
	Milliseconds int64 `json:"milliseconds"`
	// InputBytes is the size of the inputs when the Job was made.
	InputBytes int64 `json:"inputBytes"`
	// CachedBytes is how much of the inputs was cached when the Job was made.
	// +optional
	CachedBytes int64 `json:"cachedBytes,omitempty"`
	// PredictedMilliseconds is the run time predicted when the Job was made; 0 when none was.
	// +optional
	PredictedMilliseconds int64 `json:"predictedMilliseconds,omitempty"`
}

// Lineage records how output Datasets are computed from input Datasets by a Job, so that lost
// outputs can be recomputed instead of replicated.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=strata
// +kubebuilder:printcolumn:name="Dependency",type=string,JSONPath=`.spec.dependency`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Checkpointed",type=string,JSONPath=`.status.conditions[?(@.type=="Checkpointed")].status`
// +kubebuilder:printcolumn:name="Depth",type=integer,JSONPath=`.status.uncheckpointedDepth`
// +kubebuilder:printcolumn:name="Recomputations",type=integer,JSONPath=`.status.recomputations`
// +kubebuilder:printcolumn:name="Predicted",type=string,JSONPath=`.status.runTime.predicted`
// +kubebuilder:printcolumn:name="Error",type=string,JSONPath=`.status.runTime.lastError`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Lineage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LineageSpec   `json:"spec"`
	Status LineageStatus `json:"status,omitempty"`
}

// LineageList is a list of Lineages.
//
// +kubebuilder:object:root=true
type LineageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Lineage `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &Lineage{}, &LineageList{})
}
