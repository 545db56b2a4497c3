package v1alpha1

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// The attributes of a Dataset's PersistentVolume (spec.csi.volumeAttributes), written by the
// operator and read by the CSI node plugin when a pod mounts the Dataset. They are the contract
// between the two; the volume handle is "<namespace>/<name>/<uid>".
const (
	// VolumeAttributeNamespace is the Dataset's namespace. The node plugin checks it against the
	// pod's namespace at publish time, so that a pod never mounts another namespace's data.
	VolumeAttributeNamespace = "data.strata.dev/namespace"
	// VolumeAttributeDataset is the Dataset's name.
	VolumeAttributeDataset = "data.strata.dev/dataset"
	// VolumeAttributeUID is the Dataset's UID: a volume left from a deleted Dataset of the same
	// name never serves the new one.
	VolumeAttributeUID = "data.strata.dev/uid"
	// VolumeAttributePool is the TierPool whose worker on the pod's node serves the Dataset.
	VolumeAttributePool = "data.strata.dev/pool"
	// VolumeAttributeSourceURI, VolumeAttributeSourceEndpoint and VolumeAttributeSourceRegion
	// are the Dataset's spec.source (immutable, so the volume never goes stale). Its Secret is
	// the volume's nodePublishSecretRef: the kubelet hands it to the node plugin, which passes
	// it to the worker, so no Strata component reads Secrets of tenants' namespaces.
	VolumeAttributeSourceURI      = "data.strata.dev/source-uri"
	VolumeAttributeSourceEndpoint = "data.strata.dev/source-endpoint"
	VolumeAttributeSourceRegion   = "data.strata.dev/source-region"
	// VolumeAttributeMounts is a Dataset's spec.mounts (immutable too), as the JSON of a
	// []VolumeMount, in place of the three above. The volume's nodePublishSecretRef is then a
	// Secret the operator keeps in the Dataset's namespace with the keys of every mount's
	// Secret, key k of mount i as MountCredentialKey(i, k): the kubelet hands a plugin one
	// Secret per volume.
	VolumeAttributeMounts = "data.strata.dev/mounts"
	// VolumeAttributeOutput is "true" on the volume of a Dataset that a Lineage writes: the node
	// plugin publishes it writable to pods that write, and the worker serves it from the master's
	// record instead of a source.
	VolumeAttributeOutput = "data.strata.dev/output"
	// VolumeAttributeCachePolicy names the CachePolicy, of the volume's namespace, that a
	// provisioned claim's volume follows (its replication), from the claim's annotation
	// AnnotationCachePolicy or its StorageClass's cachePolicyName parameter.
	VolumeAttributeCachePolicy = "data.strata.dev/cache-policy"
)

// AnnotationCachePolicy is the annotation of a claim of a Strata StorageClass that names a
// CachePolicy of the claim's namespace for its volume, in place of the class's cachePolicyName
// parameter.
const AnnotationCachePolicy = "data.strata.dev/cache-policy"

// MasterDatasetName is the name under which a Dataset's files and blocks are known to the
// master, and MasterDatasetRoot the folder they live in there. Both carry the UID: a Dataset
// deleted and created again under its name starts with nothing of the old one's metadata.
func MasterDatasetName(namespace, name, uid string) string {
	return namespace + "/" + name + "/" + uid
}

// MasterDatasetRoot is the root folder of a Dataset in the master's namespace.
func MasterDatasetRoot(namespace, name, uid string) string {
	return "/datasets/" + MasterDatasetName(namespace, name, uid)
}

// VolumeMount is one entry of VolumeAttributeMounts: a mount of spec.mounts without its
// Secret, and with the endpoint of the claim server that serves a pvc:// one.
type VolumeMount struct {
	Path     string `json:"path"`
	URI      string `json:"uri"`
	Endpoint string `json:"endpoint,omitempty"`
	Region   string `json:"region,omitempty"`
}

// EncodeVolumeMounts is the VolumeAttributeMounts of mounts.
func EncodeVolumeMounts(mounts []VolumeMount) string {
	b, err := json.Marshal(mounts)
	if err != nil {
		panic(fmt.Sprintf("encoding mounts: %v", err)) // strings only: cannot fail
	}
	return string(b)
}

// DecodeVolumeMounts reads a VolumeAttributeMounts.
func DecodeVolumeMounts(attr string) ([]VolumeMount, error) {
	var mounts []VolumeMount
	if err := json.Unmarshal([]byte(attr), &mounts); err != nil {
		return nil, fmt.Errorf("not a JSON list of mounts: %w", err)
	}
	if len(mounts) == 0 {
		return nil, fmt.Errorf("no mounts")
	}
	return mounts, nil
}

// MountCredentialKey is the key under which the combined Secret of a Dataset with spec.mounts
// holds key of the Secret of mount index.
func MountCredentialKey(index int, key string) string {
	return "mount" + strconv.Itoa(index) + "." + key
}

// MountCredentials picks the keys of mount index out of a combined Secret's data.
func MountCredentials(secret map[string]string, index int) map[string]string {
	prefix := MountCredentialKey(index, "")
	out := map[string]string{}
	for k, v := range secret {
		if key, ok := strings.CutPrefix(k, prefix); ok && key != "" {
			out[key] = v
		}
	}
	return out
}
