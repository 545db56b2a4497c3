package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// provisionedNotServed is the answer to a pod that mounts a volume provisioned by CreateVolume.
const provisionedNotServed = "volumes provisioned from a StorageClass are not served yet: " +
	"declare the data a pod writes as a Dataset with spec.lineage and mount its claim"

// Workers reaches the cache workers of this node's pools. WorkerSockets is the real one.
type Workers interface {
	MountDataset(ctx context.Context, pool string, req *workerpb.MountDatasetRequest) (*workerpb.MountDatasetResponse, error)
	UnmountDataset(ctx context.Context, pool, uid string) error
}

// NodeConfig is what the node service needs.
type NodeConfig struct {
	// NodeID is the Kubernetes node's name.
	NodeID string
	// KubeletDir is the kubelet's root folder; every target path lies under its pods folder.
	KubeletDir string
	// StateDir holds the node's state file; it must outlive the plugin's pod (a host folder).
	StateDir string
	// Mounter mounts and unmounts: mount.New("") on a node, mount.NewFakeMounter in tests.
	Mounter mount.Interface
	Workers Workers
	Log     logr.Logger
}

// Node is the CSI Node service: it publishes Datasets into pods' target paths.
type Node struct {
	csi.UnimplementedNodeServer
	nodeID  string
	podsDir string
	mounter mount.Interface
	workers Workers
	log     logr.Logger

	pubs *publications
	// targets holds the publish and unpublish calls under way, by target path.
	targets *inFlight
	// datasets serialises, per Dataset uid, asking the worker to mount and recording the
	// target against forgetting a target and asking the worker to unmount, so that the last
	// unpublish of a Dataset never unmounts it under a publish that is under way.
	datasets *keyedMutex
}

// NewNode loads the node's publications and returns the service.
func NewNode(cfg NodeConfig) (*Node, error) {
	switch {
	case cfg.NodeID == "":
		return nil, errors.New("the node service needs the node's name")
	case !filepath.IsAbs(cfg.KubeletDir):
		return nil, fmt.Errorf("the kubelet folder %q is not an absolute path", cfg.KubeletDir)
	case cfg.StateDir == "":
		return nil, errors.New("the node service needs a state folder")
	case cfg.Mounter == nil || cfg.Workers == nil:
		return nil, errors.New("the node service needs a mounter and the workers")
	}
	pubs, err := loadPublications(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return &Node{
		nodeID: cfg.NodeID, podsDir: filepath.Join(filepath.Clean(cfg.KubeletDir), "pods"),
		mounter: cfg.Mounter, workers: cfg.Workers, log: cfg.Log,
		pubs: pubs, targets: newInFlight(), datasets: newKeyedMutex(),
	}, nil
}

// NodeGetInfo names the node. Volumes have no topology and no per-node limit.
func (n *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.nodeID, MaxVolumesPerNode: 0}, nil
}

// NodeGetCapabilities reports none: no staging (a Dataset is mounted once per node by the
// worker, which is what staging would be for), no stats, no expansion.
func (n *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// publishRequest is a NodePublishVolume request that passed every check.
type publishRequest struct {
	volumeID, target string
	dataset          datasetRef
	pool             string
	mountFlags       []string
	source           *workerpb.DatasetSource
	// mounts are the stores of a Dataset of several (spec.mounts), in place of source.
	mounts []*workerpb.SourceMount
	// output: the Dataset is written by pods; writable: this publish may write to it.
	output, writable bool
}

// NodePublishVolume publishes a Dataset read-only at the target path.
func (n *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	pr, err := n.checkPublish(req)
	if err != nil {
		return nil, err
	}
	if !n.targets.TryAcquire(pr.target) {
		return nil, status.Errorf(codes.Aborted, "an operation on target %s is already in progress", pr.target)
	}
	defer n.targets.Release(pr.target)

	if prev, ok := n.pubs.get(pr.target); ok && prev.VolumeID != pr.volumeID {
		return nil, status.Errorf(codes.AlreadyExists, "target %s already holds volume %s", pr.target, prev.VolumeID)
	}
	mounted, err := n.mountedAt(pr.target)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	pub := publication{VolumeID: pr.volumeID, Target: pr.target, UID: pr.dataset.UID, Pool: pr.pool}
	if mounted {
		// Published already: the kubelet's periodic republish (the CSIDriver asks for it), or a
		// repeated call after a restart of the plugin. The worker is asked again with the
		// Secret's current keys, so that it reads on with rotated credentials; the target stays
		// as it is, whatever the answer.
		if _, err := n.acquire(ctx, pr, pub); err != nil {
			return nil, err
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}

	source, err := n.acquire(ctx, pr, pub)
	if err != nil {
		return nil, err
	}
	if err := n.bind(source, pr); err != nil {
		if rerr := n.release(ctx, pr.target); rerr != nil {
			n.log.Info("could not forget a target that failed to mount", "target", pr.target, "error", rerr.Error())
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	n.log.Info("published Dataset", "dataset", pr.dataset.String(), "pool", pr.pool, "target", pr.target,
		"pod", req.GetVolumeContext()[contextPodNamespace]+"/"+req.GetVolumeContext()[contextPodName])
	return &csi.NodePublishVolumeResponse{}, nil
}

// checkPublish checks every field of a publish request before anything is done, and the
// rules that keep a pod to its own namespace's Datasets.
func (n *Node) checkPublish(req *csi.NodePublishVolumeRequest) (publishRequest, error) {
	invalid := func(format string, args ...any) (publishRequest, error) {
		return publishRequest{}, status.Errorf(codes.InvalidArgument, format, args...)
	}
	id := req.GetVolumeId()
	if id == "" {
		return invalid("volume id missing")
	}
	target, err := n.checkTarget(req.GetTargetPath())
	if err != nil {
		return invalid("%v", err)
	}
	vc := req.GetVolumeCapability()
	if err := checkFilesystemCapability(vc); err != nil {
		return invalid("%v", err)
	}
	if isOutputVolumeID(id) {
		return publishRequest{}, status.Errorf(codes.FailedPrecondition, "volume %s: %s", id, provisionedNotServed)
	}
	attrs := req.GetVolumeContext()
	if attrs[contextEphemeral] == "true" {
		return publishRequest{}, status.Error(codes.PermissionDenied,
			"inline (ephemeral) volumes of csi.strata.dev are refused: mount a Dataset through its PersistentVolumeClaim")
	}
	ds, err := parseDatasetVolumeID(id)
	if err != nil {
		return invalid("%v", err)
	}
	for key, want := range map[string]string{
		datav1alpha1.VolumeAttributeNamespace: ds.Namespace,
		datav1alpha1.VolumeAttributeDataset:   ds.Name,
		datav1alpha1.VolumeAttributeUID:       ds.UID,
	} {
		if got := attrs[key]; got != want {
			return invalid("volume attribute %s is %q but volume id %s says %q: the PersistentVolume is not one the operator made", key, got, id, want)
		}
	}
	pool := attrs[datav1alpha1.VolumeAttributePool]
	if err := validPoolName(pool); err != nil {
		return invalid("volume attribute %s: %v", datav1alpha1.VolumeAttributePool, err)
	}
	switch podNamespace := attrs[contextPodNamespace]; podNamespace {
	case ds.Namespace:
	case "":
		return publishRequest{}, status.Errorf(codes.PermissionDenied,
			"the volume context has no %s, so the pod's namespace cannot be checked against Dataset %s: the CSIDriver %s must set podInfoOnMount: true",
			contextPodNamespace, ds, DriverName)
	default:
		return publishRequest{}, status.Errorf(codes.PermissionDenied,
			"a pod of namespace %s may not mount Dataset %s of namespace %s", podNamespace, ds.Name, ds.Namespace)
	}
	// The operator marks the volumes of Lineage outputs; a tenant cannot, since it writes the
	// attributes of PersistentVolumes, which only it creates.
	output := attrs[datav1alpha1.VolumeAttributeOutput] == "true"
	writes := !readerModes[vc.GetAccessMode().GetMode()] && !req.GetReadonly()
	if writes && !output {
		return publishRequest{}, status.Errorf(codes.FailedPrecondition,
			"Dataset %s is an input, read from its source, and access mode %v writes: mount its claim with readOnly: true "+
				"(only the Datasets a Lineage writes, spec.lineage, are writable)", ds, vc.GetAccessMode().GetMode())
	}
	pr := publishRequest{
		volumeID: id, target: target, dataset: ds, pool: pool, mountFlags: vc.GetMount().GetMountFlags(),
		output: output, writable: writes,
	}
	if output {
		return pr, nil
	}
	if attr, ok := attrs[datav1alpha1.VolumeAttributeMounts]; ok {
		mounts, err := datav1alpha1.DecodeVolumeMounts(attr)
		if err != nil {
			return invalid("volume attribute %s: %v: the PersistentVolume is not one the operator made", datav1alpha1.VolumeAttributeMounts, err)
		}
		for i, m := range mounts {
			pr.mounts = append(pr.mounts, &workerpb.SourceMount{
				Path: strings.TrimPrefix(m.Path, "/"),
				Source: &workerpb.DatasetSource{
					Uri: m.URI, Endpoint: m.Endpoint, Region: m.Region,
					Credentials: datav1alpha1.MountCredentials(req.GetSecrets(), i),
				},
			})
		}
		return pr, nil
	}
	pr.source = &workerpb.DatasetSource{
		Uri:         attrs[datav1alpha1.VolumeAttributeSourceURI],
		Endpoint:    attrs[datav1alpha1.VolumeAttributeSourceEndpoint],
		Region:      attrs[datav1alpha1.VolumeAttributeSourceRegion],
		Credentials: req.GetSecrets(),
	}
	return pr, nil
}

// checkTarget accepts only a clean absolute path under the kubelet's pods folder that does
// not lead elsewhere through a symbolic link.
func (n *Node) checkTarget(p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("target path missing")
	case !filepath.IsAbs(p) || filepath.Clean(p) != p:
		return "", fmt.Errorf("target path %q is not a clean absolute path", p)
	case !strings.HasPrefix(p, n.podsDir+string(filepath.Separator)):
		return "", fmt.Errorf("target path %s is not under the kubelet's pods folder %s", p, n.podsDir)
	}
	resolvedPods := resolveExisting(n.podsDir)
	if resolved := resolveExisting(p); !strings.HasPrefix(resolved, resolvedPods+string(filepath.Separator)) {
		return "", fmt.Errorf("target path %s leads to %s, outside the kubelet's pods folder %s", p, resolved, n.podsDir)
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return "", fmt.Errorf("target path %s is a symbolic link", p)
	}
	return p, nil
}

// resolveExisting resolves the symbolic links of the longest existing prefix of the clean
// absolute path p and appends the rest.
func resolveExisting(p string) string {
	rest := ""
	for dir := p; ; dir = filepath.Dir(dir) {
		if resolved, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(resolved, rest)
		}
		if dir == filepath.Dir(dir) {
			return p
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
}

// mountedAt says whether target is a mount point. A broken mount (its FUSE server gone) is
// unmounted and reported as not mounted, so that publishing again repairs it.
func (n *Node) mountedAt(target string) (bool, error) {
	notMnt, err := n.mounter.IsLikelyNotMountPoint(target)
	switch {
	case err == nil:
		return !notMnt, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case mount.IsCorruptedMnt(err):
		n.log.Info("unmounting a broken mount before publishing again", "target", target, "error", err.Error())
		if uerr := n.mounter.Unmount(target); uerr != nil {
			return false, fmt.Errorf("unmounting the broken mount at %s: %w", target, uerr)
		}
		return false, nil
	default:
		return false, fmt.Errorf("checking whether %s is mounted: %w", target, err)
	}
}

// acquire asks the pool's worker to serve the Dataset and records the target, both under the
// Dataset's lock, and returns where the worker mounted the Dataset.
func (n *Node) acquire(ctx context.Context, pr publishRequest, pub publication) (string, error) {
	unlock := n.datasets.Lock(pr.dataset.UID)
	defer unlock()
	resp, err := n.workers.MountDataset(ctx, pr.pool, &workerpb.MountDatasetRequest{
		Namespace: pr.dataset.Namespace, Name: pr.dataset.Name, Uid: pr.dataset.UID,
		Source: pr.source, Mounts: pr.mounts, ReadOnly: !pr.writable, Output: pr.output,
	})
	if err != nil {
		return "", n.workerError(pr.pool, err)
	}
	path := resp.GetPath()
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return "", status.Errorf(codes.Internal, "the node's worker of pool %s returned the mount path %q, which is not a clean absolute path", pr.pool, path)
	}
	if err := n.pubs.put(pub); err != nil {
		return "", status.Error(codes.Internal, err.Error())
	}
	return path, nil
}

// workerError turns an error of a pool's worker into the publish call's answer.
func (n *Node) workerError(pool string, err error) error {
	if errors.Is(err, ErrWorkerUnreachable) {
		return status.Errorf(codes.Unavailable, "%v: is the worker of pool %s running on node %s?", err, pool, n.nodeID)
	}
	st := status.Convert(err)
	return status.Errorf(st.Code(), "the node's worker of pool %s answered: %s", pool, st.Message())
}

// bind bind-mounts the worker's mount of the Dataset onto the target: read-only unless the
// publish writes an output.
func (n *Node) bind(source string, pr publishRequest) error {
	if err := os.MkdirAll(pr.target, 0o750); err != nil {
		return fmt.Errorf("creating target %s: %w", pr.target, err)
	}
	opts := []string{"bind"}
	if !pr.writable {
		opts = append(opts, "ro")
	}
	for _, f := range pr.mountFlags {
		if f != "ro" {
			opts = append(opts, f)
		}
	}
	if err := n.mounter.Mount(source, pr.target, "", opts); err != nil {
		_ = os.Remove(pr.target)
		return fmt.Errorf("bind-mounting %s onto %s: %w", source, pr.target, err)
	}
	return nil
}

// NodeUnpublishVolume unmounts the target and removes it; a target that is not mounted, or
// not there, is unpublished already. The last target of a Dataset on this node tells the
// worker to stop serving it.
func (n *Node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	target, err := n.checkTarget(req.GetTargetPath())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if !n.targets.TryAcquire(target) {
		return nil, status.Errorf(codes.Aborted, "an operation on target %s is already in progress", target)
	}
	defer n.targets.Release(target)

	if prev, ok := n.pubs.get(target); ok && prev.VolumeID != id {
		return nil, status.Errorf(codes.NotFound, "target %s holds volume %s, not %s", target, prev.VolumeID, id)
	}
	if err := mount.CleanupMountPoint(target, n.mounter, true); err != nil {
		return nil, status.Errorf(codes.Internal, "unmounting and removing target %s: %v", target, err)
	}
	if err := n.release(ctx, target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// release forgets target and, when no other target of this node holds its Dataset, asks the
// worker to unmount the Dataset. The worker's failure is logged, never returned: the pod's
// mount is gone already, and a worker that restarts cleans the mounts nobody uses.
func (n *Node) release(ctx context.Context, target string) error {
	pub, ok := n.pubs.get(target)
	if !ok {
		return nil
	}
	unlock := n.datasets.Lock(pub.UID)
	defer unlock()
	pub, found, others, err := n.pubs.remove(target)
	if err != nil || !found || others > 0 {
		return err
	}
	if err := n.workers.UnmountDataset(ctx, pub.Pool, pub.UID); err != nil {
		n.log.Info("the worker did not unmount a Dataset no pod of this node uses; it cleans such mounts when it restarts",
			"volumeID", pub.VolumeID, "pool", pub.Pool, "error", err.Error())
	}
	return nil
}
