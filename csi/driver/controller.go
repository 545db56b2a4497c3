package driver

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// maxVolumeNameLength is the CSI spec's bound on a string field: 128 bytes.
const maxVolumeNameLength = 128

// createParameterPrefix starts the parameters a CO adds about the claim (external-provisioner's
// --extra-create-metadata writes csi.storage.k8s.io/pvc/name and the like); they are kept, not read.
const createParameterPrefix = "csi.storage.k8s.io/"

// ControllerConfig is what the controller service needs.
type ControllerConfig struct {
	// StateDir holds the controller's state file; it must outlive the controller's pod.
	StateDir string
	Log      logr.Logger
}

// Controller is the CSI Controller service: it creates and deletes output volumes. Dataset
// volumes are not its business: the operator creates their PersistentVolumes itself.
type Controller struct {
	csi.UnimplementedControllerServer
	log logr.Logger

	// mu serialises CreateVolume and DeleteVolume: each is a check and a small file write.
	mu      sync.Mutex
	volumes *volumes
}

// NewController loads the controller's state and returns the service.
func NewController(cfg ControllerConfig) (*Controller, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("the controller needs a state folder")
	}
	vols, err := loadVolumes(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return &Controller{log: cfg.Log, volumes: vols}, nil
}

// ControllerGetCapabilities reports CREATE_DELETE_VOLUME only: no attach step (the CSIDriver
// sets attachRequired: false), no snapshots, no expansion.
func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{
			Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		}},
	}}}, nil
}

// CreateVolume creates an output volume, or returns the one of the same name when the request
// is compatible with it.
func (c *Controller) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := checkCreateVolume(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()

	c.mu.Lock()
	defer c.mu.Unlock()
	if vol, ok := c.volumes.byVolumeName(req.GetName()); ok {
		if vol.CapacityBytes < required || (limit > 0 && vol.CapacityBytes > limit) {
			return nil, status.Errorf(codes.AlreadyExists,
				"volume %q exists with %d bytes, outside the requested range [%d, %d]", req.GetName(), vol.CapacityBytes, required, limit)
		}
		if !maps.Equal(vol.Parameters, req.GetParameters()) {
			return nil, status.Errorf(codes.AlreadyExists,
				"volume %q exists with parameters %v, not %v", req.GetName(), vol.Parameters, req.GetParameters())
		}
		return &csi.CreateVolumeResponse{Volume: vol.csi()}, nil
	}

	id, err := newOutputVolumeID()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	capacity := required
	if capacity == 0 {
		capacity = limit
	}
	vol := outputVolume{
		ID: id, Name: req.GetName(), CapacityBytes: capacity,
		Parameters: maps.Clone(req.GetParameters()), Created: time.Now().UTC(),
	}
	if err := c.volumes.add(vol); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	c.log.Info("created output volume", "name", vol.Name, "volumeID", vol.ID, "capacityBytes", vol.CapacityBytes)
	return &csi.CreateVolumeResponse{Volume: vol.csi()}, nil
}

func checkCreateVolume(req *csi.CreateVolumeRequest) error {
	switch name := req.GetName(); {
	case name == "":
		return fmt.Errorf("volume name missing")
	case len(name) > maxVolumeNameLength:
		return fmt.Errorf("volume name is %d bytes long, more than %d", len(name), maxVolumeNameLength)
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return fmt.Errorf("volume capabilities missing")
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if err := checkOutputCapability(vc); err != nil {
			return err
		}
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 {
		return fmt.Errorf("capacity range [%d, %d] has a negative bound", required, limit)
	}
	if limit > 0 && required > limit {
		return fmt.Errorf("capacity range [%d, %d]: the required bytes exceed the limit", required, limit)
	}
	if req.GetVolumeContentSource() != nil {
		return fmt.Errorf("volumes from a snapshot or another volume are not supported: an output volume starts empty")
	}
	if len(req.GetMutableParameters()) > 0 {
		return fmt.Errorf("mutable parameters (VolumeAttributesClass) are not supported")
	}
	for k, v := range req.GetParameters() {
		switch {
		case k == datav1alpha1.VolumeAttributePool:
			if err := validPoolName(v); err != nil {
				return fmt.Errorf("parameter %s: %w", k, err)
			}
		case strings.HasPrefix(k, createParameterPrefix):
		default:
			return fmt.Errorf("unknown parameter %q: the StorageClass may set only %s", k, datav1alpha1.VolumeAttributePool)
		}
	}
	return nil
}

// csi is the volume as CreateVolume returns it.
func (v outputVolume) csi() *csi.Volume {
	var volCtx map[string]string
	if pool := v.Parameters[datav1alpha1.VolumeAttributePool]; pool != "" {
		volCtx = map[string]string{datav1alpha1.VolumeAttributePool: pool}
	}
	return &csi.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes, VolumeContext: volCtx}
}

// DeleteVolume deletes an output volume; deleting one that does not exist succeeds.
func (c *Controller) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.volumes.byVolumeID(req.GetVolumeId()); !ok {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if err := c.volumes.remove(req.GetVolumeId()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	c.log.Info("deleted output volume", "volumeID", req.GetVolumeId())
	return &csi.DeleteVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities, context and parameters an output
// volume supports, or says why not.
func (c *Controller) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities missing")
	}
	vol, ok := c.volumes.byVolumeID(req.GetVolumeId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no output volume %q: Dataset volumes are made by the operator, not by this controller", req.GetVolumeId())
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if err := checkOutputCapability(vc); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	if len(req.GetParameters()) > 0 && !maps.Equal(req.GetParameters(), vol.Parameters) {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("the volume was created with parameters %v", vol.Parameters)}, nil
	}
	if len(req.GetVolumeContext()) > 0 && !maps.Equal(req.GetVolumeContext(), vol.csi().GetVolumeContext()) {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("the volume's context is %v", vol.csi().GetVolumeContext())}, nil
	}
	if len(req.GetMutableParameters()) > 0 {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: "mutable parameters are not supported"}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}
