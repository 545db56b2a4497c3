package server

import (
	"context"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/store"
)

// Server implements masterpb.MasterServer.
type Server struct {
	masterpb.UnimplementedMasterServer
	store *store.Store
	log   logr.Logger
}

// New returns a server over s.
func New(s *store.Store, log logr.Logger) *Server {
	return &Server{store: s, log: log}
}

// apply proposes a write and converts its response.
func apply[T proto.Message](ctx context.Context, s *Server, cmd *masterpb.Command) (T, error) {
	var zero T
	resp, err := s.store.Apply(ctx, cmd)
	if err != nil {
		return zero, toStatus(err)
	}
	out, ok := resp.(T)
	if !ok {
		return zero, status.Errorf(codes.Internal, "state machine answered %T", resp)
	}
	return out, nil
}

// read runs a local read: linearizable on the leader, or as fresh as this replica when the
// caller accepts stale data.
func (s *Server) read(ctx context.Context, staleOK bool, fn func(*fsm.FSM) error) error {
	return toStatus(s.store.Read(ctx, staleOK, fn))
}

func required(name, v string) error {
	if v == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", name)
	}
	return nil
}

// CreateFile creates a file.
func (s *Server) CreateFile(ctx context.Context, req *masterpb.CreateFileRequest) (*masterpb.File, error) {
	if err := required("path", req.Path); err != nil {
		return nil, err
	}
	return apply[*masterpb.File](ctx, s, &masterpb.Command{Op: &masterpb.Command_CreateFile{CreateFile: req}})
}

// GetFile returns a file.
func (s *Server) GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error) {
	var f *masterpb.File
	err := s.read(ctx, req.StaleOk, func(m *fsm.FSM) (err error) {
		f, err = m.GetFile(req.Path)
		return err
	})
	return f, err
}

// Exists reports whether a file exists.
func (s *Server) Exists(ctx context.Context, req *masterpb.ExistsRequest) (*masterpb.ExistsResponse, error) {
	resp := &masterpb.ExistsResponse{}
	err := s.read(ctx, req.StaleOk, func(m *fsm.FSM) (err error) {
		resp.Exists, err = m.Exists(req.Path)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// RenameFile renames a file.
func (s *Server) RenameFile(ctx context.Context, req *masterpb.RenameFileRequest) (*masterpb.File, error) {
	if err := required("from", req.From); err != nil {
		return nil, err
	}
	if err := required("to", req.To); err != nil {
		return nil, err
	}
	return apply[*masterpb.File](ctx, s, &masterpb.Command{Op: &masterpb.Command_RenameFile{RenameFile: req}})
}

// DeleteFile deletes a file and its blocks.
func (s *Server) DeleteFile(ctx context.Context, req *masterpb.DeleteFileRequest) (*masterpb.DeleteFileResponse, error) {
	if err := required("path", req.Path); err != nil {
		return nil, err
	}
	return apply[*masterpb.DeleteFileResponse](ctx, s, &masterpb.Command{Op: &masterpb.Command_DeleteFile{DeleteFile: req}})
}

// ListFiles lists a directory.
func (s *Server) ListFiles(ctx context.Context, req *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error) {
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}
	resp := &masterpb.ListFilesResponse{}
	err := s.read(ctx, req.StaleOk, func(m *fsm.FSM) (err error) {
		resp.Entries, resp.NextStartAfter, err = m.ListFiles(dir, req.Recursive, req.StartAfter, int(req.Limit))
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Lookup says what a path names: a file, a directory, or neither (NotFound).
func (s *Server) Lookup(ctx context.Context, req *masterpb.LookupRequest) (*masterpb.ListEntry, error) {
	var entry *masterpb.ListEntry
	err := s.read(ctx, req.StaleOk, func(m *fsm.FSM) (err error) {
		entry, err = m.Lookup(req.Path)
		return err
	})
	return entry, err
}

// CheckpointFile records a file's checkpoint state.
func (s *Server) CheckpointFile(ctx context.Context, req *masterpb.CheckpointFileRequest) (*masterpb.File, error) {
	if err := required("path", req.Path); err != nil {
		return nil, err
	}
	return apply[*masterpb.File](ctx, s, &masterpb.Command{Op: &masterpb.Command_CheckpointFile{CheckpointFile: req}})
}

// RecordAccess adds reads to a file's access statistics.
func (s *Server) RecordAccess(ctx context.Context, req *masterpb.RecordAccessRequest) (*masterpb.File, error) {
	if err := required("path", req.Path); err != nil {
		return nil, err
	}
	return apply[*masterpb.File](ctx, s, &masterpb.Command{Op: &masterpb.Command_RecordAccess{RecordAccess: req}})
}

// RegisterDataset registers a dataset; registering the same one again is a no-op.
func (s *Server) RegisterDataset(ctx context.Context, req *masterpb.RegisterDatasetRequest) (*masterpb.Dataset, error) {
	if err := required("name", req.Name); err != nil {
		return nil, err
	}
	return apply[*masterpb.Dataset](ctx, s, &masterpb.Command{Op: &masterpb.Command_RegisterDataset{RegisterDataset: req}})
}

// GetDataset returns a dataset.
func (s *Server) GetDataset(ctx context.Context, req *masterpb.GetDatasetRequest) (*masterpb.Dataset, error) {
	var ds *masterpb.Dataset
	err := s.read(ctx, req.StaleOk, func(m *fsm.FSM) (err error) {
		ds, err = m.GetDataset(req.Name)
		return err
	})
	return ds, err
}

// GetDatasetUsage sums what the workers hold of a dataset.
func (s *Server) GetDatasetUsage(ctx context.Context, req *masterpb.GetDatasetUsageRequest) (*masterpb.DatasetUsage, error) {
	var usage *masterpb.DatasetUsage
	err := s.read(ctx, req.StaleOk, func(m *fsm.FSM) (err error) {
		usage, err = m.DatasetUsage(req.Name, req.ListLost)
		return err
	})
	return usage, err
}

// CompleteDataset marks a dataset complete: its files no longer change.
func (s *Server) CompleteDataset(ctx context.Context, req *masterpb.CompleteDatasetRequest) (*masterpb.Dataset, error) {
	if err := required("name", req.Name); err != nil {
		return nil, err
	}
	return apply[*masterpb.Dataset](ctx, s, &masterpb.Command{Op: &masterpb.Command_CompleteDataset{CompleteDataset: req}})
}

// ReopenDataset clears a dataset's complete flag: its files may be written again.
func (s *Server) ReopenDataset(ctx context.Context, req *masterpb.ReopenDatasetRequest) (*masterpb.Dataset, error) {
	if err := required("name", req.Name); err != nil {
		return nil, err
	}
	return apply[*masterpb.Dataset](ctx, s, &masterpb.Command{Op: &masterpb.Command_ReopenDataset{ReopenDataset: req}})
}

// SetDatasetRecovery sets what a read of a dataset's lost files does, registering the dataset
// if the master does not know it.
func (s *Server) SetDatasetRecovery(ctx context.Context, req *masterpb.SetDatasetRecoveryRequest) (*masterpb.Dataset, error) {
	if err := required("name", req.Name); err != nil {
		return nil, err
	}
	if err := required("root", req.Root); err != nil {
		return nil, err
	}
	return apply[*masterpb.Dataset](ctx, s, &masterpb.Command{Op: &masterpb.Command_SetDatasetRecovery{SetDatasetRecovery: req}})
}

// SettleAttempt publishes or discards the files of one attempt of a dataset's writer.
func (s *Server) SettleAttempt(ctx context.Context, req *masterpb.SettleAttemptRequest) (*masterpb.SettleAttemptResponse, error) {
	if err := required("dataset", req.Dataset); err != nil {
		return nil, err
	}
	if err := required("attempt", req.Attempt); err != nil {
		return nil, err
	}
	resp, err := s.store.SettleAttempt(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// DeleteDataset deletes a dataset and its files.
func (s *Server) DeleteDataset(ctx context.Context, req *masterpb.DeleteDatasetRequest) (*masterpb.DeleteDatasetResponse, error) {
	if err := required("name", req.Name); err != nil {
		return nil, err
	}
	resp, err := s.store.DeleteDataset(ctx, req.Name)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// CommitBlock records a block and one of its copies.
func (s *Server) CommitBlock(ctx context.Context, req *masterpb.CommitBlockRequest) (*masterpb.Block, error) {
	if err := required("path", req.Path); err != nil {
		return nil, err
	}
	if err := required("worker", req.Worker); err != nil {
		return nil, err
	}
	return apply[*masterpb.Block](ctx, s, &masterpb.Command{Op: &masterpb.Command_CommitBlock{CommitBlock: req}})
}

// GetBlockLocations returns blocks with their copies.
func (s *Server) GetBlockLocations(ctx context.Context, req *masterpb.GetBlockLocationsRequest) (*masterpb.GetBlockLocationsResponse, error) {
	if req.Path == "" && len(req.BlockIds) == 0 {
		return nil, status.Error(codes.InvalidArgument, "path or block_ids is required")
	}
	resp := &masterpb.GetBlockLocationsResponse{}
	err := s.read(ctx, req.StaleOk, func(m *fsm.FSM) (err error) {
		resp.Blocks, err = m.BlockLocations(req.Path, req.BlockIds)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// RemoveBlockCopy forgets a worker's copy of a block.
func (s *Server) RemoveBlockCopy(ctx context.Context, req *masterpb.RemoveBlockCopyRequest) (*masterpb.Block, error) {
	if err := required("worker", req.Worker); err != nil {
		return nil, err
	}
	return apply[*masterpb.Block](ctx, s, &masterpb.Command{Op: &masterpb.Command_RemoveBlockCopy{RemoveBlockCopy: req}})
}

// RegisterWorker registers a worker, or registers it again after it was lost.
func (s *Server) RegisterWorker(ctx context.Context, req *masterpb.RegisterWorkerRequest) (*masterpb.Worker, error) {
	if err := required("id", req.Id); err != nil {
		return nil, err
	}
	return apply[*masterpb.Worker](ctx, s, &masterpb.Command{Op: &masterpb.Command_RegisterWorker{RegisterWorker: req}})
}

// Heartbeat records that a worker is alive and its tier usage (in the leader's memory; see
// store.Store.Heartbeat).
func (s *Server) Heartbeat(ctx context.Context, req *masterpb.HeartbeatRequest) (*masterpb.HeartbeatResponse, error) {
	if err := required("worker", req.Worker); err != nil {
		return nil, err
	}
	resp, err := s.store.Heartbeat(ctx, req)
	return resp, toStatus(err)
}

// SealFile creates a file with its blocks committed, in one command.
func (s *Server) SealFile(ctx context.Context, req *masterpb.SealFileRequest) (*masterpb.File, error) {
	if err := required("path", req.Path); err != nil {
		return nil, err
	}
	return apply[*masterpb.File](ctx, s, &masterpb.Command{Op: &masterpb.Command_SealFile{SealFile: req}})
}

// ForgetWorker removes a lost worker's record; the operator calls it for the workers of a
// deleted TierPool.
func (s *Server) ForgetWorker(ctx context.Context, req *masterpb.ForgetWorkerRequest) (*masterpb.ForgetWorkerResponse, error) {
	if err := required("worker", req.Worker); err != nil {
		return nil, err
	}
	return apply[*masterpb.ForgetWorkerResponse](ctx, s, &masterpb.Command{Op: &masterpb.Command_ForgetWorker{ForgetWorker: req}})
}

// MarkWorkerLost declares a worker lost; the operator calls it when a Node goes NotReady.
func (s *Server) MarkWorkerLost(ctx context.Context, req *masterpb.MarkWorkerLostRequest) (*masterpb.MarkWorkerLostResponse, error) {
	if err := required("worker", req.Worker); err != nil {
		return nil, err
	}
	resp, err := s.store.MarkWorkerLost(ctx, req.Worker, req.Reason)
	if err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("worker marked lost", "worker", req.Worker, "reason", req.Reason, "blocksLost", resp.BlocksLost,
		"unrecoverable", resp.BlocksUnrecoverable)
	return resp, nil
}

// ListWorkers lists the workers.
func (s *Server) ListWorkers(ctx context.Context, req *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error) {
	resp := &masterpb.ListWorkersResponse{}
	err := s.read(ctx, req.StaleOk, func(m *fsm.FSM) (err error) {
		resp.Workers, err = m.Workers()
		return err
	})
	if err != nil {
		return nil, err
	}
	// The leader knows heartbeats newer than the log's (see store.Store.Heartbeat).
	resp.Workers = s.store.WithHeartbeats(resp.Workers)
	return resp, nil
}

// Join adds a master replica to the cluster; see store.Join.
func (s *Server) Join(ctx context.Context, req *masterpb.JoinRequest) (*masterpb.JoinResponse, error) {
	if err := required("raft_id", req.RaftId); err != nil {
		return nil, err
	}
	if err := required("raft_addr", req.RaftAddr); err != nil {
		return nil, err
	}
	if err := s.store.Join(ctx, req.RaftId, req.RaftAddr, req.ApiAddr); err != nil {
		return nil, toStatus(err)
	}
	// Join returns once its commands are applied here, the leader, which applies a write
	// before acknowledging it.
	return &masterpb.JoinResponse{AppliedIndex: s.store.AppliedIndex()}, nil
}

// Leader describes the leader as this replica knows it, and this replica; any replica answers.
func (s *Server) Leader(ctx context.Context, _ *masterpb.LeaderRequest) (*masterpb.LeaderResponse, error) {
	id, raftAddr, apiAddr := s.store.Leader()
	var peers []*masterpb.Peer
	err := s.read(ctx, true, func(m *fsm.FSM) (err error) {
		peers, err = m.Peers()
		return err
	})
	if err != nil {
		return nil, err
	}
	return &masterpb.LeaderResponse{
		LeaderId:       id,
		LeaderRaftAddr: raftAddr,
		LeaderApiAddr:  apiAddr,
		SelfId:         s.store.ID(),
		HasState:       s.store.HasState(),
		RaftState:      s.store.State().String(),
		Term:           s.store.Term(),
		AppliedIndex:   s.store.AppliedIndex(),
		Peers:          peers,
	}, nil
}
