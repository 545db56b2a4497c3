package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Medium is the kind of storage behind a tier.
// +kubebuilder:validation:Enum=MEM;PMEM;NVME;SSD;HDD
type Medium string

// The media, fastest first.
const (
	MediumMemory     Medium = "MEM"
	MediumPersistent Medium = "PMEM"
	MediumNVMe       Medium = "NVME"
	MediumSSD        Medium = "SSD"
	MediumHDD        Medium = "HDD"
)

// Tier is one level of a worker's storage: one or more host directories of one medium.
type Tier struct {
	// Name of the tier, unique in the pool, such as mem or nvme.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="tier names are lower-case DNS labels, such as mem or nvme-0"
	Name string `json:"name"`

	// Medium is MEM (tmpfs), PMEM (a dax-mounted file system), NVME, SSD or HDD.
	Medium Medium `json:"medium"`

	// Paths are the host directories of this tier; blocks are spread over them.
	// For MEM the worker mounts a tmpfs of the quota's size on the first path if none is there
	// (in huge pages where a block fills them, when the kernel has them).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="self.all(p, p.startsWith('/') && !p.contains('..'))",message="tier paths must be absolute host paths without '..', such as /mnt/strata/nvme0"
	Paths []string `json:"paths"`

	// Quota is the most this tier may hold on each node, such as 8Gi.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))",message="quota must be a positive quantity of bytes, such as 8Gi or 500Mi"
	Quota resource.Quantity `json:"quota"`

	// Watermarks of this tier. (omitzero: a Go client that leaves them out sends nothing and
	// gets the defaults, instead of zeros that fail validation.)
	// +kubebuilder:default={high: 0.9, low: 0.7}
	// +optional
	Watermarks Watermarks `json:"watermarks,omitempty,omitzero"`
}

// TierPoolSpec is a set of nodes and the tiers each of them gives to the cache.
//
// +kubebuilder:validation:XValidation:rule="has(self.tiers) && size(self.tiers) > 0",message="spec.tiers must list at least one tier, fastest first, such as {name: mem, medium: MEM, paths: [/mnt/strata/mem], quota: 4Gi}"
// +kubebuilder:validation:XValidation:rule="!has(self.tiers) || self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))",message="tier names must be unique in spec.tiers"
type TierPoolSpec struct {
	// NodeSelector picks the nodes that run a worker of this pool. Empty means every node.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations of the worker pods.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Tiers, fastest first. Blocks are demoted down this list and promoted up it.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=6
	Tiers []Tier `json:"tiers,omitempty"`

	// BlockSize is the unit of caching, eviction and transfer. (omitzero, as for Watermarks.)
	// +kubebuilder:default="64Mi"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('1Gi')) <= 0",message="blockSize must be a quantity between 1Mi and 1Gi, such as 64Mi"
	// +optional
	BlockSize resource.Quantity `json:"blockSize,omitempty,omitzero"`

	// FileSourceRoots are the host directories that Datasets may read through file:// sources.
	// A file:// source outside them is refused; empty refuses every file:// source, so that no
	// tenant can read an arbitrary host path.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(p, p.startsWith('/') && !p.contains('..'))",message="fileSourceRoots must be absolute host paths without '..'"
	FileSourceRoots []string `json:"fileSourceRoots,omitempty"`

	// WorkerResources are the worker pods' resources; the MEM tier's quota is added to its memory limit.
	// +optional
	WorkerResources corev1.ResourceRequirements `json:"workerResources,omitempty"`
}

// TierStatus is the capacity and use of one tier over the pool's nodes.
type TierStatus struct {
	// Name of the tier.
	Name string `json:"name"`
	// Medium of the tier.
	Medium Medium `json:"medium"`
	// CapacityBytes is the tier's quota times the number of nodes the pool selects.
	CapacityBytes int64 `json:"capacityBytes"`
	// UsedBytes is what the tier holds, summed over the workers' reports.
	UsedBytes int64 `json:"usedBytes"`
}

// TierPoolStatus is the observed state of a TierPool.
type TierPoolStatus struct {
	// Conditions: Ready when every selected node runs a ready worker.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Nodes is how many nodes the pool selects. Always written, 0 included, so that
	// `kubectl get tierpools` shows 0 rather than nothing.
	// +optional
	// +kubebuilder:default=0
	Nodes int32 `json:"nodes"`

	// ReadyWorkers is how many of them run a ready worker; 0 is shown as 0.
	// +optional
	// +kubebuilder:default=0
	ReadyWorkers int32 `json:"readyWorkers"`

	// Tiers is capacity and use per tier.
	// +optional
	// +listType=map
	// +listMapKey=name
	Tiers []TierStatus `json:"tiers,omitempty"`
}

// TierPool is a set of nodes that run a cache worker, and the tiers (memory, persistent memory,
// NVMe, SSD, HDD) each of them gives to the cache. Cluster-scoped: only a cluster administrator
// chooses host paths.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=strata
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyWorkers`
// +kubebuilder:printcolumn:name="Block",type=string,JSONPath=`.spec.blockSize`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TierPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TierPoolSpec   `json:"spec"`
	Status TierPoolStatus `json:"status,omitempty"`
}

// TierPoolList is a list of TierPools.
//
// +kubebuilder:object:root=true
type TierPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TierPool `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &TierPool{}, &TierPoolList{})
}
