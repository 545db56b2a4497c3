package dataplane

import (
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/pki"
)

// Policy says which component may call each method of the worker's network port: workers,
// which read and copy each other's blocks and listings, and the operator, which asks for syncs
// of mounted Datasets and what they show (their trees, for block reports). A tenant's pod holds no certificate and reads
// through its mount.
var Policy = authz.Policy{
	workerpb.Worker_ReadBlock_FullMethodName:            authz.Allow(pki.RoleWorker),
	workerpb.Worker_WriteBlock_FullMethodName:           authz.Allow(pki.RoleWorker),
	workerpb.Worker_GetListing_FullMethodName:           authz.Allow(pki.RoleWorker, pki.RoleOperator),
	workerpb.DatasetSync_SyncDataset_FullMethodName:     authz.Allow(pki.RoleOperator),
	workerpb.DatasetSync_DescribeDataset_FullMethodName: authz.Allow(pki.RoleOperator),
}
