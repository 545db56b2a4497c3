package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// DriverName is the name of Strata's CSI driver, as CSIDriver objects and volumes name it.
const DriverName = "csi.strata.dev"

// Identity is the CSI Identity service of both the controller and the node plugin.
type Identity struct {
	csi.UnimplementedIdentityServer
	version string
	ready   func(context.Context) bool
}

// NewIdentity returns the Identity service. vendorVersion is the build's version; ready says
// whether the plugin can serve now (nil: always).
func NewIdentity(vendorVersion string, ready func(context.Context) bool) *Identity {
	if ready == nil {
		ready = func(context.Context) bool { return true }
	}
	return &Identity{version: vendorVersion, ready: ready}
}

// GetPluginInfo names the driver and its version.
func (i *Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: DriverName, VendorVersion: i.version}, nil
}

// GetPluginCapabilities reports the controller service. Volumes have no topology: a Dataset
// is served on any node where its pool's worker runs, and scheduling is the pool's business.
func (i *Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
		}},
	}}}, nil
}

// Probe reports whether the plugin can serve now.
func (i *Identity) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(i.ready(ctx))}, nil
}
