package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

const gib = 1 << 30

func newController(t *testing.T, stateDir string) *Controller {
	t.Helper()
	c, err := NewController(ControllerConfig{StateDir: stateDir, Log: testr.New(t)})
	if err != nil {
		t.Fatalf("NewController: %v", err)
	}
	return c
}

func fsCapability(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func createRequest(name string, required, limit int64) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit},
		VolumeCapabilities: []*csi.VolumeCapability{fsCapability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		Parameters:         map[string]string{datav1alpha1.VolumeAttributePool: "fast", "csi.storage.k8s.io/pvc/name": "out"},
	}
}

func TestCreateVolumeIsIdempotentByNameAndSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	c := newController(t, dir)
	first, err := c.CreateVolume(context.Background(), createRequest("pvc-1", gib, 0))
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	vol := first.GetVolume()
	if !isOutputVolumeID(vol.GetVolumeId()) || vol.GetCapacityBytes() != gib ||
		vol.GetVolumeContext()[datav1alpha1.VolumeAttributePool] != "fast" {
		t.Fatalf("CreateVolume = %v", vol)
	}
	again, err := c.CreateVolume(context.Background(), createRequest("pvc-1", gib, 2*gib))
	if err != nil || again.GetVolume().GetVolumeId() != vol.GetVolumeId() {
		t.Fatalf("repeated CreateVolume = %v, %v; want the same volume", again, err)
	}
	other, err := c.CreateVolume(context.Background(), createRequest("pvc-2", gib, 0))
	if err != nil || other.GetVolume().GetVolumeId() == vol.GetVolumeId() {
		t.Fatalf("CreateVolume of another name = %v, %v; want another volume", other, err)
	}

	restarted := newController(t, dir)
	after, err := restarted.CreateVolume(context.Background(), createRequest("pvc-1", gib, 0))
	if err != nil || after.GetVolume().GetVolumeId() != vol.GetVolumeId() {
		t.Fatalf("CreateVolume after a restart = %v, %v; want the volume made before", after, err)
	}
	if _, err := restarted.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	third := newController(t, dir)
	if _, err := third.ValidateVolumeCapabilities(context.Background(), &csi.ValidateVolumeCapabilitiesRequest{
		VolumeId: vol.GetVolumeId(), VolumeCapabilities: createRequest("", 0, 0).VolumeCapabilities,
	}); status.Code(err) != codes.NotFound {
		t.Fatalf("ValidateVolumeCapabilities of a deleted volume after a restart = %v, want NotFound", err)
	}
	if _, err := third.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()}); err != nil {
		t.Fatalf("deleting a deleted volume: %v", err)
	}
}

func TestCreateVolumeRefuses(t *testing.T) {
	cases := map[string]struct {
		change   func(*csi.CreateVolumeRequest)
		code     codes.Code
		contains string
	}{
		"a request without a name": {
			change: func(r *csi.CreateVolumeRequest) { r.Name = "" }, code: codes.InvalidArgument, contains: "name missing",
		},
		"a name longer than 128 bytes": {
			change: func(r *csi.CreateVolumeRequest) { r.Name = strings.Repeat("n", 129) }, code: codes.InvalidArgument, contains: "129 bytes",
		},
		"a request without capabilities": {
			change: func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = nil }, code: codes.InvalidArgument, contains: "capabilities missing",
		},
		"block access": {
			change: func(r *csi.CreateVolumeRequest) {
				r.VolumeCapabilities[0].AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
			},
			code: codes.InvalidArgument, contains: "block access",
		},
		"writers on many nodes": {
			change: func(r *csi.CreateVolumeRequest) {
				r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
			},
			code: codes.InvalidArgument, contains: "written from a single node",
		},
		"a limit below the required size": {
			change: func(r *csi.CreateVolumeRequest) {
				r.CapacityRange = &csi.CapacityRange{RequiredBytes: 2 * gib, LimitBytes: gib}
			},
			code: codes.InvalidArgument, contains: "exceed the limit",
		},
		"a snapshot source": {
			change: func(r *csi.CreateVolumeRequest) {
				r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
					Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "s"},
				}}
			},
			code: codes.InvalidArgument, contains: "starts empty",
		},
		"an unknown parameter": {
			change: func(r *csi.CreateVolumeRequest) { r.Parameters["replicas"] = "3" }, code: codes.InvalidArgument, contains: `unknown parameter "replicas"`,
		},
		"a pool parameter that is a path": {
			change: func(r *csi.CreateVolumeRequest) { r.Parameters[datav1alpha1.VolumeAttributePool] = "a/b" },
			code:   codes.InvalidArgument, contains: "parameter data.strata.dev/pool",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req := createRequest("pvc-1", gib, 0)
			tc.change(req)
			_, err := newController(t, t.TempDir()).CreateVolume(context.Background(), req)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.contains) {
				t.Fatalf("CreateVolume = %v; want %v with %q", err, tc.code, tc.contains)
			}
		})
	}
}

func TestCreateVolumeOfAnExistingNameWithIncompatibleRequestAlreadyExists(t *testing.T) {
	c := newController(t, t.TempDir())
	if _, err := c.CreateVolume(context.Background(), createRequest("pvc-1", gib, gib)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVolume(context.Background(), createRequest("pvc-1", 2*gib, 2*gib)); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateVolume with a larger size = %v, want AlreadyExists", err)
	}
	req := createRequest("pvc-1", gib, gib)
	req.Parameters[datav1alpha1.VolumeAttributePool] = "slow"
	if _, err := c.CreateVolume(context.Background(), req); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateVolume with another pool = %v, want AlreadyExists", err)
	}
}

func TestValidateVolumeCapabilitiesConfirmsOnlyWhatTheVolumeSupports(t *testing.T) {
	c := newController(t, t.TempDir())
	created, err := c.CreateVolume(context.Background(), createRequest("pvc-1", gib, 0))
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetVolume().GetVolumeId()
	for mode, confirmed := range map[csi.VolumeCapability_AccessMode_Mode]bool{
		csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:      true,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:  true,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER: false,
	} {
		resp, err := c.ValidateVolumeCapabilities(context.Background(), &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{fsCapability(mode)},
		})
		if err != nil || (resp.GetConfirmed() != nil) != confirmed {
			t.Errorf("ValidateVolumeCapabilities(%v) = %v, %v; want confirmed %v", mode, resp, err, confirmed)
		}
	}
	resp, err := c.ValidateVolumeCapabilities(context.Background(), &csi.ValidateVolumeCapabilitiesRequest{
		VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{fsCapability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		Parameters: map[string]string{datav1alpha1.VolumeAttributePool: "slow"},
	})
	if err != nil || resp.GetConfirmed() != nil {
		t.Fatalf("ValidateVolumeCapabilities with other parameters = %v, %v; want not confirmed", resp, err)
	}
}

func TestControllerCapabilitiesAreCreateDeleteOnly(t *testing.T) {
	resp, err := newController(t, t.TempDir()).ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil || len(resp.GetCapabilities()) != 1 ||
		resp.GetCapabilities()[0].GetRpc().GetType() != csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME {
		t.Fatalf("ControllerGetCapabilities = %v, %v", resp, err)
	}
	if _, err := newController(t, t.TempDir()).ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("ControllerPublishVolume = %v, want Unimplemented (attachRequired: false)", err)
	}
}

func TestIdentity(t *testing.T) {
	id := NewIdentity("v0.3.0", nil)
	info, err := id.GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "csi.strata.dev" || info.GetVendorVersion() != "v0.3.0" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	caps, err := id.GetPluginCapabilities(context.Background(), &csi.GetPluginCapabilitiesRequest{})
	if err != nil || len(caps.GetCapabilities()) != 1 ||
		caps.GetCapabilities()[0].GetService().GetType() != csi.PluginCapability_Service_CONTROLLER_SERVICE {
		t.Fatalf("GetPluginCapabilities = %v, %v; want CONTROLLER_SERVICE only", caps, err)
	}
	probe, err := id.Probe(context.Background(), &csi.ProbeRequest{})
	if err != nil || !probe.GetReady().GetValue() {
		t.Fatalf("Probe of the controller = %v, %v; want ready", probe, err)
	}
}
