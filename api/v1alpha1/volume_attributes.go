package v1alpha1

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
	// VolumeAttributeOutput is "true" on the volume of a Dataset that a Lineage writes: the node
	// plugin publishes it writable to pods that write, and the worker serves it from the master's
	// record instead of a source.
	VolumeAttributeOutput = "data.strata.dev/output"
)

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
