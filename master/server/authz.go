package server

import (
	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/master/masterpb"
)

const (
	operator = pki.RoleOperator
	master   = pki.RoleMaster
	worker   = pki.RoleWorker
)

// The component a request acts for, which a worker or master may name only as itself.
func commitWorker(req any) string    { return req.(*masterpb.CommitBlockRequest).GetWorker() }
func removeWorker(req any) string    { return req.(*masterpb.RemoveBlockCopyRequest).GetWorker() }
func registerWorker(req any) string  { return req.(*masterpb.RegisterWorkerRequest).GetId() }
func heartbeatWorker(req any) string { return req.(*masterpb.HeartbeatRequest).GetWorker() }
func joiningMaster(req any) string   { return req.(*masterpb.JoinRequest).GetRaftId() }

// Policy says which component may call each method of the master. Workers write and read the
// files and blocks of the Datasets they serve and speak for themselves alone; only the operator
// ends a Dataset's life (delete, complete, reopen) or a worker's (lost, forgotten); only masters
// join the Raft group; only the operator backs the whole state up or restores it. Tenants' pods hold no certificate and reach none of it.
var Policy = authz.Policy{
	masterpb.Master_CreateFile_FullMethodName:         authz.Allow(worker),
	masterpb.Master_GetFile_FullMethodName:            authz.Allow(worker, operator),
	masterpb.Master_Exists_FullMethodName:             authz.Allow(worker, operator),
	masterpb.Master_RenameFile_FullMethodName:         authz.Allow(worker),
	masterpb.Master_DeleteFile_FullMethodName:         authz.Allow(worker, operator),
	masterpb.Master_ListFiles_FullMethodName:          authz.Allow(worker, operator),
	masterpb.Master_Lookup_FullMethodName:             authz.Allow(worker, operator),
	masterpb.Master_CheckpointFile_FullMethodName:     authz.Allow(worker),
	masterpb.Master_SealFile_FullMethodName:           authz.Allow(worker),
	masterpb.Master_RecordAccess_FullMethodName:       authz.Allow(worker),
	masterpb.Master_RegisterDataset_FullMethodName:    authz.Allow(worker, operator),
	masterpb.Master_GetDataset_FullMethodName:         authz.Allow(worker, operator),
	masterpb.Master_DeleteDataset_FullMethodName:      authz.Allow(operator),
	masterpb.Master_CompleteDataset_FullMethodName:    authz.Allow(operator),
	masterpb.Master_ReopenDataset_FullMethodName:      authz.Allow(operator),
	masterpb.Master_GetDatasetUsage_FullMethodName:    authz.Allow(operator),
	masterpb.Master_SetDatasetRecovery_FullMethodName: authz.Allow(operator),
	masterpb.Master_SettleAttempt_FullMethodName:      authz.Allow(operator),
	masterpb.Master_CommitBlock_FullMethodName:        {Roles: []pki.Role{worker}, ActsFor: commitWorker},
	masterpb.Master_GetBlockLocations_FullMethodName:  authz.Allow(worker, operator),
	masterpb.Master_RemoveBlockCopy_FullMethodName:    {Roles: []pki.Role{worker}, ActsFor: removeWorker},
	masterpb.Master_RegisterWorker_FullMethodName:     {Roles: []pki.Role{worker}, ActsFor: registerWorker},
	masterpb.Master_Heartbeat_FullMethodName:          {Roles: []pki.Role{worker}, ActsFor: heartbeatWorker},
	masterpb.Master_MarkWorkerLost_FullMethodName:     authz.Allow(operator),
	masterpb.Master_ForgetWorker_FullMethodName:       authz.Allow(operator),
	masterpb.Master_ListWorkers_FullMethodName:        authz.Allow(worker, operator),
	masterpb.Master_Join_FullMethodName:               {Roles: []pki.Role{master}, ActsFor: joiningMaster},
	masterpb.Master_Leader_FullMethodName:             authz.Allow(master, worker, operator),
	masterpb.Master_Backup_FullMethodName:             authz.Allow(operator),
	masterpb.Master_Restore_FullMethodName:            authz.Allow(operator),
}
