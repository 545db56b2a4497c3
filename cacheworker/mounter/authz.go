package mounter

import (
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/pki"
)

// Policy says who may call the Mounter: the CSI node plugin, which mounts Datasets into pods.
// Its socket is in a host folder only Strata's pods mount; the certificate says which of them.
var Policy = authz.Policy{
	workerpb.Mounter_MountDataset_FullMethodName:   authz.Allow(pki.RoleCSINode),
	workerpb.Mounter_UnmountDataset_FullMethodName: authz.Allow(pki.RoleCSINode),
}
