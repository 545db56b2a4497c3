package v1alpha1

import (
	"cmp"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EvictionPolicy chooses which block leaves a full tier first.
// +kubebuilder:validation:Enum=LRU;LFU;LRFU;MRD
type EvictionPolicy string

// The eviction policies.
const (
	// EvictLRU evicts the least recently used block.
	EvictLRU EvictionPolicy = "LRU"
	// EvictLFU evicts the least frequently used block.
	EvictLFU EvictionPolicy = "LFU"
	// EvictLRFU weighs recency against frequency with lambda: 0 behaves like LFU, 1 like LRU.
	EvictLRFU EvictionPolicy = "LRFU"
	// EvictMRD is DAG-aware: it evicts the data whose next use in the lineage graph is furthest away.
	EvictMRD EvictionPolicy = "MRD"
)

// EvictionSpec configures eviction.
//
// +kubebuilder:validation:XValidation:rule="!has(self.lambda) || (has(self.policy) && self.policy == 'LRFU')",message="spec.eviction.lambda only applies to policy: LRFU"
type EvictionSpec struct {
	// Policy is LRU, LFU, LRFU or MRD. It ranks the Dataset's own blocks: when a tier needs
	// room, the TierPool's workers pick the Dataset of the block they rank coldest, and that
	// Dataset gives up the block its policy ranks coldest. MRD (DAG-aware, Kariz) ranks by the
	// Lineages of the namespace instead: a Dataset no pending Lineage reads gives up its blocks
	// before any other Dataset, and when the workers pick an MRD Dataset, the MRD Dataset whose
	// next read by a Lineage's Job is the most stages away pays instead; its own blocks leave
	// least recently used first.
	// +kubebuilder:default=LRU
	// +optional
	Policy EvictionPolicy `json:"policy,omitempty"`

	// Lambda weighs recency against frequency for LRFU, in [0, 1]: 0 is LFU, 1 is LRU.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 0.0 && self <= 1.0",message="spec.eviction.lambda must be in [0, 1]: 0 behaves like LFU, 1 like LRU"
	Lambda *float64 `json:"lambda,omitempty"`

	// Watermarks, when set, bound each of this policy's Datasets to a share of every tier: when
	// a write would take the Dataset's blocks in a tier past High of its quota, its own coldest
	// blocks move down a tier (or, from the last, are dropped when that is safe) until it is back
	// at Low. Without them a Dataset may fill a tier up to the TierPool's watermarks.
	// +optional
	Watermarks *Watermarks `json:"watermarks,omitempty"`
}

// PromotionSpec configures moving hot blocks up a tier.
type PromotionSpec struct {
	// AccessThreshold is how many reads a block in a lower tier needs before it moves up.
	// +kubebuilder:default=3
	// +kubebuilder:validation:XValidation:rule="self >= 1",message="spec.promotion.accessThreshold must be at least 1"
	// +optional
	AccessThreshold int32 `json:"accessThreshold,omitempty"`
}

// ReplicationScope is where replicas of intermediate data go.
// +kubebuilder:validation:Enum=Node;Rack;Zone
type ReplicationScope string

// The replication scopes, from the topology labels of the nodes.
const (
	// ReplicateAnyNode puts a replica on any other node.
	ReplicateAnyNode ReplicationScope = "Node"
	// ReplicateSameRack keeps replicas in the writer's rack (spec.replication.rackLabel).
	ReplicateSameRack ReplicationScope = "Rack"
	// ReplicateSameZone keeps replicas in the writer's zone (spec.replication.zoneLabel).
	ReplicateSameZone ReplicationScope = "Zone"
)

// The default node labels of the replication scopes.
const (
	DefaultRackLabel = "topology.strata.dev/rack"
	DefaultZoneLabel = "topology.kubernetes.io/zone"
)

// ReplicationSpec configures replication of the outputs Lineages write (intermediate data,
// ISS): each block of an output not checkpointed yet gets Count copies on as many nodes of the
// Scope. Replication is always asynchronous: a writer's close never waits for a replica.
type ReplicationSpec struct {
	// Count is the number of in-cache copies of each block, the original included; 1 means no replica.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="self >= 1",message="spec.replication.count is the number of copies including the original and must be at least 1"
	// +kubebuilder:validation:Maximum=8
	// +optional
	Count int32 `json:"count,omitempty"`

	// Scope keeps replicas near the writer to spare the core network.
	// +kubebuilder:default=Rack
	// +optional
	Scope ReplicationScope `json:"scope,omitempty"`

	// Selective: a node that reads a block of an output from another node keeps it, and that
	// copy counts as a replica (data a step already moved to another node is not copied again).
	// false: readers keep nothing, and every copy is made by replication.
	// +kubebuilder:default=true
	// +optional
	Selective *bool `json:"selective,omitempty"`

	// RackLabel is the node label whose value names a node's rack, for scope Rack.
	// +kubebuilder:default="topology.strata.dev/rack"
	// +kubebuilder:validation:MinLength=1
	// +optional
	RackLabel string `json:"rackLabel,omitempty"`

	// ZoneLabel is the node label whose value names a node's zone, for scope Zone.
	// +kubebuilder:default="topology.kubernetes.io/zone"
	// +kubebuilder:validation:MinLength=1
	// +optional
	ZoneLabel string `json:"zoneLabel,omitempty"`

	// BandwidthLimit caps the bytes per second each worker sends to make replicas, such as
	// 200Mi, so that copies never crowd out the reads of pods.
	// +kubebuilder:default="200Mi"
	// +optional
	BandwidthLimit *resource.Quantity `json:"bandwidthLimit,omitempty"`
}

// ScopeLabel is the node label whose values bound the replicas' nodes, "" for scope Node.
func (r ReplicationSpec) ScopeLabel() string {
	switch r.Scope {
	case ReplicateSameRack:
		return cmp.Or(r.RackLabel, DefaultRackLabel)
	case ReplicateSameZone:
		return cmp.Or(r.ZoneLabel, DefaultZoneLabel)
	}
	return ""
}

// CheckpointStrategy chooses when outputs are written to their under-store.
// +kubebuilder:validation:Enum=Edge;Interval;None
type CheckpointStrategy string

// The checkpoint strategies.
const (
	// CheckpointEdge checkpoints the leaves of the lineage graph first and hot files in between
	// (Tachyon's Edge algorithm), bounding recomputation time.
	CheckpointEdge CheckpointStrategy = "Edge"
	// CheckpointInterval checkpoints every output once per interval, oldest first.
	CheckpointInterval CheckpointStrategy = "Interval"
	// CheckpointNone never checkpoints; lost outputs are always recomputed.
	CheckpointNone CheckpointStrategy = "None"
)

// CheckpointSpec configures checkpointing of Lineage outputs.
//
// +kubebuilder:validation:XValidation:rule="!has(self.strategy) || self.strategy != 'Interval' || has(self.interval)",message="spec.checkpoint.interval is required with strategy: Interval, for example 5m"
type CheckpointSpec struct {
	// Strategy is Edge, Interval or None.
	// +kubebuilder:default=Edge
	// +optional
	Strategy CheckpointStrategy `json:"strategy,omitempty"`

	// EdgeFraction is c, the share of checkpoint time spent on the edge of the lineage graph;
	// the rest goes to hot files. Any file then recovers within 3·M/c, M being the longest time to
	// compute or checkpoint one edge file.
	// +kubebuilder:default=0.5
	// +kubebuilder:validation:XValidation:rule="self > 0.0 && self <= 1.0",message="spec.checkpoint.edgeFraction must be in (0, 1]: it is the share c of checkpoint time spent on the edge, and recovery time grows as 1/c"
	// +optional
	EdgeFraction float64 `json:"edgeFraction,omitempty"`

	// HotReads is how many reads make a file hot.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +optional
	HotReads int32 `json:"hotReads,omitempty"`

	// Interval is the checkpoint period for strategy Interval.
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`

	// BandwidthLimit caps checkpoint writes per worker, in bytes per second, such as 100Mi.
	// Empty means no cap.
	// +optional
	BandwidthLimit *resource.Quantity `json:"bandwidthLimit,omitempty"`

	// SyncWriteThreshold: files larger than this are written to the under-store synchronously as
	// they are written, since recomputing them would cost more than writing them. Empty means never.
	// +optional
	SyncWriteThreshold *resource.Quantity `json:"syncWriteThreshold,omitempty"`

	// TemporaryPathPatterns are glob patterns of output paths that are never checkpointed unless
	// memory runs short, such as "**/_tmp/**".
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	TemporaryPathPatterns []string `json:"temporaryPathPatterns,omitempty"`
}

// PrefetchPolicy chooses what is read ahead.
// +kubebuilder:validation:Enum=None;MRD;CP;CMR
type PrefetchPolicy string

// The prefetch policies (Kariz).
const (
	// PrefetchNone reads nothing ahead.
	PrefetchNone PrefetchPolicy = "None"
	// PrefetchMRD prefetches the data whose next use in the lineage graph is nearest.
	PrefetchMRD PrefetchPolicy = "MRD"
	// PrefetchCP prefetches the inputs of the critical path first.
	PrefetchCP PrefetchPolicy = "CP"
	// PrefetchCMR caches just enough of each input to shorten the critical path, by time saved per byte.
	PrefetchCMR PrefetchPolicy = "CMR"
)

// PrefetchSpec configures prefetching.
type PrefetchSpec struct {
	// Policy is None, MRD, CP or CMR.
	// +kubebuilder:default=None
	// +optional
	Policy PrefetchPolicy `json:"policy,omitempty"`
}

// CachePolicySpec is how the Datasets that name this policy are cached, replicated and checkpointed.
type CachePolicySpec struct {
	// Eviction chooses which blocks leave a full tier.
	// +kubebuilder:default={}
	// +optional
	Eviction EvictionSpec `json:"eviction,omitempty"`

	// Promotion moves hot blocks up a tier.
	// +kubebuilder:default={}
	// +optional
	Promotion PromotionSpec `json:"promotion,omitempty"`

	// PinnedPaths are glob patterns of paths, inside each Dataset, that are never evicted.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	PinnedPaths []string `json:"pinnedPaths,omitempty"`

	// Replication of cached blocks.
	// +kubebuilder:default={}
	// +optional
	Replication ReplicationSpec `json:"replication,omitempty"`

	// Checkpoint of Lineage outputs to their under-store.
	// +kubebuilder:default={}
	// +optional
	Checkpoint CheckpointSpec `json:"checkpoint,omitempty"`

	// Prefetch reads data ahead of its use.
	// +kubebuilder:default={}
	// +optional
	Prefetch PrefetchSpec `json:"prefetch,omitempty"`

	// Recovery is what readers of a Lineage output do while a file lost with its node is
	// written again.
	// +kubebuilder:default={}
	// +optional
	Recovery RecoverySpec `json:"recovery,omitempty"`
}

// DefaultRecoveryReadWait is RecoverySpec.ReadWait's default.
const DefaultRecoveryReadWait = 10 * time.Minute

// RecoverySpec configures how readers of a Lineage's outputs meet a loss.
type RecoverySpec struct {
	// ReadWait is how long a read (or an open) of an output file lost with its node waits for
	// the Lineage to write it again before it fails with EIO; it fails at once when the Lineage
	// gives up (spec.maxRecomputations). 0s fails at once, as a program with its own retries
	// may prefer. Whole seconds; the default is 10m.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="spec.recovery.readWait must be between 0s and 24h, such as 10m"
	// +optional
	ReadWait *metav1.Duration `json:"readWait,omitempty"`
}

// ReadWaitOr is the policy's read wait, def when it has none (a policy stored before the field
// existed).
func (r RecoverySpec) ReadWaitOr(def time.Duration) time.Duration {
	if r.ReadWait == nil {
		return def
	}
	return r.ReadWait.Duration
}

// CachePolicyStatus is the observed state of a CachePolicy.
type CachePolicyStatus struct {
	// Conditions: Ready when the workers can apply the policy (its pinnedPaths parse); its
	// message says which settings they apply.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Datasets counts the Datasets that use this policy.
	// +optional
	Datasets int32 `json:"datasets,omitempty"`
}

// CachePolicy is how Datasets are evicted, promoted, replicated, checkpointed and prefetched.
// Datasets in the same namespace name it in spec.cachePolicyName.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=strata
// +kubebuilder:printcolumn:name="Eviction",type=string,JSONPath=`.spec.eviction.policy`
// +kubebuilder:printcolumn:name="Checkpoint",type=string,JSONPath=`.spec.checkpoint.strategy`
// +kubebuilder:printcolumn:name="Copies",type=integer,JSONPath=`.spec.replication.count`
// +kubebuilder:printcolumn:name="Prefetch",type=string,JSONPath=`.spec.prefetch.policy`
// +kubebuilder:printcolumn:name="Datasets",type=integer,JSONPath=`.status.datasets`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CachePolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CachePolicySpec   `json:"spec,omitempty"`
	Status CachePolicyStatus `json:"status,omitempty"`
}

// CachePolicyList is a list of CachePolicies.
//
// +kubebuilder:object:root=true
type CachePolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CachePolicy `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &CachePolicy{}, &CachePolicyList{})
}
