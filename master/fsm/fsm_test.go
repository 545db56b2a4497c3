package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/masterpb"
)

// harness applies commands to a state machine with increasing log indexes, as raft would.
type harness struct {
	t     *testing.T
	fsm   *FSM
	index uint64
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	f, err := Open(t.TempDir(), logr.Discard(), Options{})
	if err != nil {
		t.Fatalf("opening the state machine: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return &harness{t: t, fsm: f}
}

func entry(index uint64, cmd *masterpb.Command) *raft.Log {
	data, err := proto.Marshal(cmd)
	if err != nil {
		panic(err)
	}
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
}

// apply applies one command at time at (nanoseconds) and returns its result.
func (h *harness) apply(at int64, cmd *masterpb.Command) (proto.Message, error) {
	h.t.Helper()
	h.index++
	cmd.Version = CommandVersion
	cmd.AtUnixNano = at
	res, ok := h.fsm.Apply(entry(h.index, cmd)).(*Result)
	if !ok {
		h.t.Fatalf("entry %d: Apply returned no *Result", h.index)
	}
	return res.Response, res.Err
}

// must applies a command that has to succeed.
func (h *harness) must(cmd *masterpb.Command) proto.Message {
	h.t.Helper()
	resp, err := h.apply(int64(h.index+1)*1000, cmd)
	if err != nil {
		h.t.Fatalf("applying %v: %v", cmd, err)
	}
	return resp
}

func create(p string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_CreateFile{CreateFile: &masterpb.CreateFileRequest{Path: p}}}
}

func createReq(r *masterpb.CreateFileRequest) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_CreateFile{CreateFile: r}}
}

func rename(from, to string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_RenameFile{RenameFile: &masterpb.RenameFileRequest{From: from, To: to}}}
}

func remove(p string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_DeleteFile{DeleteFile: &masterpb.DeleteFileRequest{Path: p}}}
}

func dataset(name, root string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_RegisterDataset{RegisterDataset: &masterpb.RegisterDatasetRequest{Name: name, Root: root}}}
}

func complete(name string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_CompleteDataset{CompleteDataset: &masterpb.CompleteDatasetRequest{Name: name}}}
}

func reopen(name string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_ReopenDataset{ReopenDataset: &masterpb.ReopenDatasetRequest{Name: name}}}
}

func recovery(name, root string, wait int64, failed string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_SetDatasetRecovery{SetDatasetRecovery: &masterpb.SetDatasetRecoveryRequest{
		Name: name, Root: root, Recovery: &masterpb.DatasetRecovery{WaitSeconds: wait, Failed: failed},
	}}}
}

func deleteDataset(name string, limit uint32) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_DeleteDataset{DeleteDataset: &masterpb.DeleteDatasetStep{Name: name, Limit: limit}}}
}

func worker(id string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_RegisterWorker{RegisterWorker: &masterpb.RegisterWorkerRequest{Id: id, Node: "node-" + id}}}
}

func heartbeatCmd(id string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_Heartbeat{Heartbeat: &masterpb.HeartbeatRequest{Worker: id}}}
}

func commit(id uint64, p string, offset int64, w, tier string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_CommitBlock{CommitBlock: &masterpb.CommitBlockRequest{
		BlockId: id, Path: p, Offset: offset, Size: 100, Checksum: "c", Worker: w, Tier: tier,
	}}}
}

func lost(id string, limit uint32) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_MarkWorkerLost{MarkWorkerLost: &masterpb.MarkWorkerLostStep{Worker: id, Reason: "test", Limit: limit}}}
}

// seal seals path with a block of 100 bytes, on worker w1, at each offset.
func seal(path, token string, offsets ...int64) *masterpb.Command {
	req := &masterpb.SealFileRequest{Path: path, Dataset: "ns/d/uid", ClientToken: token}
	if !strings.HasPrefix(path, "/datasets/ns/d/uid/") {
		req.Dataset = ""
	}
	for i, off := range offsets {
		req.Blocks = append(req.Blocks, &masterpb.CommitBlockRequest{BlockId: uint64(1000 + i), Offset: off, Size: 100, Checksum: "c", Worker: "w1", Tier: "mem"})
	}
	return &masterpb.Command{Op: &masterpb.Command_SealFile{SealFile: req}}
}

func forget(id string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_ForgetWorker{ForgetWorker: &masterpb.ForgetWorkerRequest{Worker: id}}}
}

func checkpoint(p string) *masterpb.Command {
	return &masterpb.Command{Op: &masterpb.Command_CheckpointFile{CheckpointFile: &masterpb.CheckpointFileRequest{
		Path: p, State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: "s3://b" + p,
	}}}
}

func TestCommandOutcomes(t *testing.T) {
	tests := map[string]struct {
		setup   []*masterpb.Command
		cmd     *masterpb.Command
		wantErr error
		check   func(t *testing.T, f *FSM, resp proto.Message)
	}{
		"creating a file assigns an id and timestamps from the command": {
			cmd: create("/a/b"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				file := resp.(*masterpb.File)
				if file.Id != 1 || file.CreatedUnixNano == 0 {
					t.Errorf("got id %d created %d, want id 1 and a timestamp", file.Id, file.CreatedUnixNano)
				}
			},
		},
		"a checkpoint of the file's version is recorded": {
			setup: []*masterpb.Command{createReq(&masterpb.CreateFileRequest{Path: "/a", ClientToken: "t1"})},
			cmd: &masterpb.Command{Op: &masterpb.Command_CheckpointFile{CheckpointFile: &masterpb.CheckpointFileRequest{
				Path: "/a", State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: "s3://b/a", ClientToken: "t1"}}},
			check: func(t *testing.T, f *FSM, _ proto.Message) {
				if got, err := f.GetFile("/a"); err != nil || got.CheckpointState != masterpb.CheckpointState_CHECKPOINT_STATE_DONE {
					t.Errorf("got %v, %v; want a checkpointed file", got, err)
				}
			},
		},
		"a checkpoint of another version of the file is refused": {
			setup: []*masterpb.Command{createReq(&masterpb.CreateFileRequest{Path: "/a", ClientToken: "t2"})},
			cmd: &masterpb.Command{Op: &masterpb.Command_CheckpointFile{CheckpointFile: &masterpb.CheckpointFileRequest{
				Path: "/a", State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: "s3://b/a", ClientToken: "t1"}}},
			wantErr: ErrFailedPrecondition,
		},
		"creating an existing file fails": {
			setup: []*masterpb.Command{create("/a")}, cmd: create("/a"), wantErr: ErrAlreadyExists,
		},
		"a retried create with the same client token succeeds": {
			setup:   []*masterpb.Command{createReq(&masterpb.CreateFileRequest{Path: "/a", ClientToken: "t1"})},
			cmd:     createReq(&masterpb.CreateFileRequest{Path: "/a", ClientToken: "t1"}),
			wantErr: nil,
		},
		"a create with another client token fails": {
			setup:   []*masterpb.Command{createReq(&masterpb.CreateFileRequest{Path: "/a", ClientToken: "t1"})},
			cmd:     createReq(&masterpb.CreateFileRequest{Path: "/a", ClientToken: "t2"}),
			wantErr: ErrAlreadyExists,
		},
		"a file cannot be created below a file": {
			setup: []*masterpb.Command{create("/a")}, cmd: create("/a/b"), wantErr: ErrFailedPrecondition,
		},
		"a file cannot replace a directory": {
			setup: []*masterpb.Command{create("/a/b")}, cmd: create("/a"), wantErr: ErrAlreadyExists,
		},
		"relative paths are rejected": {cmd: create("a/b"), wantErr: ErrInvalid},
		"unclean paths are rejected":  {cmd: create("/a//b"), wantErr: ErrInvalid},
		"the root is not a file":      {cmd: create("/"), wantErr: ErrInvalid},
		"a file of an unknown dataset is rejected": {
			cmd: createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "nope"}), wantErr: ErrNotFound,
		},
		"a dataset's file must be below its root": {
			setup:   []*masterpb.Command{dataset("ds", "/d")},
			cmd:     createReq(&masterpb.CreateFileRequest{Path: "/e/x", Dataset: "ds"}),
			wantErr: ErrInvalid,
		},
		"renaming moves the file and keeps its id": {
			setup: []*masterpb.Command{create("/a")},
			cmd:   rename("/a", "/b/c"),
			check: func(t *testing.T, f *FSM, _ proto.Message) {
				if _, err := f.GetFile("/a"); !errors.Is(err, ErrNotFound) {
					t.Errorf("old path: got %v, want not found", err)
				}
				got, err := f.GetFile("/b/c")
				if err != nil || got.Id != 1 {
					t.Errorf("new path: got %v, %v; want file id 1", got, err)
				}
			},
		},
		"renaming onto an existing file fails": {
			setup: []*masterpb.Command{create("/a"), create("/b")}, cmd: rename("/a", "/b"), wantErr: ErrAlreadyExists,
		},
		"renaming a missing file fails": {cmd: rename("/a", "/b"), wantErr: ErrNotFound},
		"renaming out of the dataset fails": {
			setup: []*masterpb.Command{dataset("ds", "/d"), createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds"})},
			cmd:   rename("/d/x", "/e/x"), wantErr: ErrFailedPrecondition,
		},
		"deleting a file deletes its blocks": {
			setup: []*masterpb.Command{create("/a"), worker("w1"), commit(7, "/a", 0, "w1", "MEM")},
			cmd:   remove("/a"),
			check: func(t *testing.T, f *FSM, resp proto.Message) {
				if n := resp.(*masterpb.DeleteFileResponse).BlocksDeleted; n != 1 {
					t.Errorf("got %d blocks deleted, want 1", n)
				}
				if _, err := f.BlockLocations("", []uint64{7}); !errors.Is(err, ErrNotFound) {
					t.Errorf("block 7: got %v, want not found", err)
				}
			},
		},
		"deleting a missing file fails": {cmd: remove("/a"), wantErr: ErrNotFound},
		"registering the same dataset twice is a no-op": {
			setup: []*masterpb.Command{dataset("ds", "/d")}, cmd: dataset("ds", "/d"),
		},
		"a dataset root may not nest in another": {
			setup: []*masterpb.Command{dataset("ds", "/d")}, cmd: dataset("other", "/d/e"), wantErr: ErrFailedPrecondition,
		},
		"a complete dataset takes no new file": {
			setup:   []*masterpb.Command{dataset("ds", "/d"), complete("ds")},
			cmd:     createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds"}),
			wantErr: ErrFailedPrecondition,
		},
		"a retried create that came before completion still succeeds": {
			setup: []*masterpb.Command{dataset("ds", "/d"),
				createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds", ClientToken: "t1"}), complete("ds")},
			cmd: createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds", ClientToken: "t1"}),
		},
		"a complete dataset's files are not renamed": {
			setup: []*masterpb.Command{dataset("ds", "/d"), createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds"}), complete("ds")},
			cmd:   rename("/d/x", "/d/y"), wantErr: ErrFailedPrecondition,
		},
		"a complete dataset's files are not deleted": {
			setup: []*masterpb.Command{dataset("ds", "/d"), createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds"}), complete("ds")},
			cmd:   remove("/d/x"), wantErr: ErrFailedPrecondition,
		},
		"a reopened dataset's files are deleted and created again": {
			setup: []*masterpb.Command{dataset("ds", "/d"), createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds"}), complete("ds"),
				reopen("ds"), remove("/d/x")},
			cmd: createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds"}),
		},
		"reopening an open dataset is a no-op": {
			setup: []*masterpb.Command{dataset("ds", "/d")},
			cmd:   reopen("ds"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if resp.(*masterpb.Dataset).Complete {
					t.Error("the dataset is complete")
				}
			},
		},
		"reopening an unknown dataset fails": {cmd: reopen("nope"), wantErr: ErrNotFound},
		"completing a dataset twice is a no-op": {
			setup: []*masterpb.Command{dataset("ds", "/d"), complete("ds")},
			cmd:   complete("ds"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if !resp.(*masterpb.Dataset).Complete {
					t.Error("the dataset is not complete")
				}
			},
		},
		"completing an unknown dataset fails": {cmd: complete("nope"), wantErr: ErrNotFound},
		"setting the recovery of a complete dataset keeps it complete": {
			setup: []*masterpb.Command{dataset("ds", "/d"), complete("ds")},
			cmd:   recovery("ds", "/d", 600, ""),
			check: func(t *testing.T, f *FSM, _ proto.Message) {
				ds, err := f.GetDataset("ds")
				if err != nil || !ds.Complete || ds.Recovery.GetWaitSeconds() != 600 {
					t.Errorf("got %v, %v; want a complete dataset whose reads wait 600 s", ds, err)
				}
			},
		},
		"setting the recovery of a forgotten dataset registers it": {
			setup: []*masterpb.Command{dataset("ds", "/d"), deleteDataset("ds", 0)},
			cmd:   recovery("ds", "/d", 60, "gave up"),
			check: func(t *testing.T, f *FSM, _ proto.Message) {
				ds, err := f.GetDataset("ds")
				if err != nil || ds.Root != "/d" || ds.Recovery.GetFailed() != "gave up" {
					t.Errorf("got %v, %v; want dataset ds at /d whose recovery failed", ds, err)
				}
			},
		},
		"setting the recovery with another root fails": {
			setup: []*masterpb.Command{dataset("ds", "/d")}, cmd: recovery("ds", "/e", 60, ""), wantErr: ErrAlreadyExists,
		},
		"a negative recovery wait is refused": {
			setup: []*masterpb.Command{dataset("ds", "/d")}, cmd: recovery("ds", "/d", -1, ""), wantErr: ErrInvalid,
		},
		"a deleted and registered again dataset is writable": {
			setup: []*masterpb.Command{dataset("ds", "/d"), complete("ds"), deleteDataset("ds", 0), dataset("ds", "/d")},
			cmd:   createReq(&masterpb.CreateFileRequest{Path: "/d/x", Dataset: "ds"}),
		},
		"a block needs an alive worker": {
			setup: []*masterpb.Command{create("/a")}, cmd: commit(1, "/a", 0, "w1", "MEM"), wantErr: ErrFailedPrecondition,
		},
		"a block of a missing file is rejected": {
			setup: []*masterpb.Command{worker("w1")}, cmd: commit(1, "/a", 0, "w1", "MEM"), wantErr: ErrNotFound,
		},
		"committing a block again from another worker adds a replica": {
			setup: []*masterpb.Command{create("/a"), worker("w1"), worker("w2"), commit(1, "/a", 0, "w1", "MEM")},
			cmd:   commit(1, "/a", 0, "w2", "SSD"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if n := len(resp.(*masterpb.Block).Locations); n != 2 {
					t.Errorf("got %d locations, want 2", n)
				}
			},
		},
		"committing a block with another size is rejected": {
			setup: []*masterpb.Command{create("/a"), worker("w1"), commit(1, "/a", 0, "w1", "MEM")},
			cmd: &masterpb.Command{Op: &masterpb.Command_CommitBlock{CommitBlock: &masterpb.CommitBlockRequest{
				BlockId: 1, Path: "/a", Size: 5, Worker: "w1", Tier: "MEM",
			}}},
			wantErr: ErrFailedPrecondition,
		},
		"two blocks may not share an offset": {
			setup: []*masterpb.Command{create("/a"), worker("w1"), commit(1, "/a", 0, "w1", "MEM")},
			cmd:   commit(2, "/a", 0, "w1", "MEM"), wantErr: ErrFailedPrecondition,
		},
		"blocks are kept in offset order and grow the file": {
			setup: []*masterpb.Command{create("/a"), worker("w1"), commit(3, "/a", 200, "w1", "MEM"), commit(1, "/a", 0, "w1", "MEM")},
			cmd:   commit(2, "/a", 100, "w1", "MEM"),
			check: func(t *testing.T, f *FSM, _ proto.Message) {
				file, err := f.GetFile("/a")
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(file.BlockIds) != "[1 2 3]" || file.Size != 300 {
					t.Errorf("got blocks %v size %d, want [1 2 3] and 300", file.BlockIds, file.Size)
				}
			},
		},
		"a heartbeat from an unknown worker asks it to register": {
			cmd: heartbeatCmd("w9"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if c := resp.(*masterpb.HeartbeatResponse).Command; c != masterpb.WorkerCommand_WORKER_COMMAND_REGISTER {
					t.Errorf("got %v, want REGISTER", c)
				}
			},
		},
		"a heartbeat from a lost worker asks it to register": {
			setup: []*masterpb.Command{worker("w1"), lost("w1", 0)},
			cmd:   heartbeatCmd("w1"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if c := resp.(*masterpb.HeartbeatResponse).Command; c != masterpb.WorkerCommand_WORKER_COMMAND_REGISTER {
					t.Errorf("got %v, want REGISTER", c)
				}
			},
		},
		"a lost worker can register again": {
			setup: []*masterpb.Command{worker("w1"), lost("w1", 0)},
			cmd:   worker("w1"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if s := resp.(*masterpb.Worker).State; s != masterpb.WorkerState_WORKER_STATE_ALIVE {
					t.Errorf("got %v, want ALIVE", s)
				}
			},
		},
		"marking an unknown worker lost fails": {cmd: lost("w1", 0), wantErr: ErrNotFound},
		"a sealed file is created with its blocks, whole": {
			setup: []*masterpb.Command{dataset("ns/d/uid", "/datasets/ns/d/uid"), worker("w1")},
			cmd:   seal("/datasets/ns/d/uid/part-0", "t1", 0, 100),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				file := resp.(*masterpb.File)
				if file.Size != 200 || len(file.BlockIds) != 2 || file.ClientToken != "t1" || file.Dataset != "ns/d/uid" {
					t.Errorf("got %v, want a 200-byte file of two blocks, token t1, in ns/d/uid", file)
				}
			},
		},
		"a retried seal returns the file it made": {
			setup: []*masterpb.Command{dataset("ns/d/uid", "/datasets/ns/d/uid"), worker("w1"), seal("/datasets/ns/d/uid/part-0", "t1", 0, 100)},
			cmd:   seal("/datasets/ns/d/uid/part-0", "t1", 0, 100),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if f := resp.(*masterpb.File); f.Size != 200 || len(f.BlockIds) != 2 {
					t.Errorf("got %v, want the file of the first seal", f)
				}
			},
		},
		"a seal of a path another writer sealed fails": {
			setup:   []*masterpb.Command{dataset("ns/d/uid", "/datasets/ns/d/uid"), worker("w1"), seal("/datasets/ns/d/uid/part-0", "t1", 0)},
			cmd:     seal("/datasets/ns/d/uid/part-0", "t2", 0),
			wantErr: ErrAlreadyExists,
		},
		"a seal into a complete dataset fails": {
			setup:   []*masterpb.Command{dataset("ns/d/uid", "/datasets/ns/d/uid"), worker("w1"), complete("ns/d/uid")},
			cmd:     seal("/datasets/ns/d/uid/part-0", "t1", 0),
			wantErr: ErrFailedPrecondition,
		},
		"a seal whose block cannot be committed leaves no file": {
			setup:   []*masterpb.Command{dataset("ns/d/uid", "/datasets/ns/d/uid"), worker("w1"), lost("w1", 0)},
			cmd:     seal("/datasets/ns/d/uid/part-0", "t1", 0),
			wantErr: ErrFailedPrecondition,
			check: func(t *testing.T, f *FSM, _ proto.Message) {
				if _, err := f.GetFile("/datasets/ns/d/uid/part-0"); !errors.Is(err, ErrNotFound) {
					t.Errorf("the failed seal left the file behind: %v", err)
				}
			},
		},
		"a seal of too many blocks for one command is refused": {
			cmd:     seal("/a", "t1", make([]int64, MaxSealBlocks+1)...),
			wantErr: ErrInvalid,
		},
		"a lost worker is forgotten": {
			setup: []*masterpb.Command{worker("w1"), worker("w2"), lost("w1", 0)},
			cmd:   forget("w1"),
			check: func(t *testing.T, f *FSM, resp proto.Message) {
				if !resp.(*masterpb.ForgetWorkerResponse).Forgotten {
					t.Errorf("got %v, want forgotten", resp)
				}
				workers, err := f.Workers()
				if err != nil || len(workers) != 1 || workers[0].Id != "w2" {
					t.Errorf("workers after forgetting w1: %v, %v; want w2 alone", workers, err)
				}
			},
		},
		"forgetting an unknown worker succeeds": {
			cmd: forget("w1"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if resp.(*masterpb.ForgetWorkerResponse).Forgotten {
					t.Errorf("got %v, want nothing forgotten", resp)
				}
			},
		},
		"an alive worker is not forgotten": {setup: []*masterpb.Command{worker("w1")}, cmd: forget("w1"), wantErr: ErrFailedPrecondition},
		"a worker still being marked lost is not forgotten": {
			setup:   []*masterpb.Command{worker("w1"), create("/a"), commit(1, "/a", 0, "w1", "mem"), commit(2, "/a", 100, "w1", "mem"), lost("w1", 1)},
			cmd:     forget("w1"),
			wantErr: ErrFailedPrecondition,
		},
		"a forgotten worker registers again": {
			setup: []*masterpb.Command{worker("w1"), lost("w1", 0), forget("w1")},
			cmd:   worker("w1"),
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if s := resp.(*masterpb.Worker).State; s != masterpb.WorkerState_WORKER_STATE_ALIVE {
					t.Errorf("got %v, want ALIVE", s)
				}
			},
		},
		"access statistics accumulate": {
			setup: []*masterpb.Command{create("/a"), {Op: &masterpb.Command_RecordAccess{RecordAccess: &masterpb.RecordAccessRequest{Path: "/a", Reads: 2}}}},
			cmd:   &masterpb.Command{Op: &masterpb.Command_RecordAccess{RecordAccess: &masterpb.RecordAccessRequest{Path: "/a"}}},
			check: func(t *testing.T, _ *FSM, resp proto.Message) {
				if r := resp.(*masterpb.File).Access.Reads; r != 3 {
					t.Errorf("got %d reads, want 3", r)
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			for _, c := range tc.setup {
				h.must(c)
			}
			before := h.fsm.AppliedIndex()
			resp, err := h.apply(1e9, tc.cmd)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("got error %v, want %v", err, tc.wantErr)
			}
			if got := h.fsm.AppliedIndex(); got != before+1 {
				t.Errorf("applied index %d, want %d: failed commands must advance it too", got, before+1)
			}
			if tc.check != nil {
				tc.check(t, h.fsm, resp)
			}
		})
	}
}

func TestFailedCommandLeavesNoPartialWrites(t *testing.T) {
	h := newHarness(t)
	h.must(create("/a"))
	// The create allocates a file id before nothing else can fail; a failing one must not.
	if _, err := h.apply(1, create("/a")); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("got %v, want already exists", err)
	}
	f := h.must(create("/b")).(*masterpb.File)
	if f.Id != 2 {
		t.Errorf("second file got id %d, want 2", f.Id)
	}
}

func TestReplayedEntriesAreIgnored(t *testing.T) {
	h := newHarness(t)
	h.must(create("/a"))
	h.must(remove("/a"))
	// Raft replays entries after a restart that kept the database; index 1 created /a.
	if res := h.fsm.Apply(entry(1, &masterpb.Command{Version: CommandVersion, Op: create("/a").Op})); res != nil {
		t.Errorf("replayed entry returned %v, want nil", res)
	}
	if ok, _ := h.fsm.Exists("/a"); ok {
		t.Error("replaying the create brought /a back")
	}
}

func TestApplyStopsOnEntriesItCannotInterpret(t *testing.T) {
	tests := map[string][]byte{
		"garbage bytes":        {0xff, 0xff, 0xff},
		"a newer version":      mustMarshal(&masterpb.Command{Version: CommandVersion + 1, Op: create("/a").Op}),
		"no version":           mustMarshal(&masterpb.Command{Op: create("/a").Op}),
		"an unknown operation": mustMarshal(&masterpb.Command{Version: CommandVersion}),
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			defer func() {
				if recover() == nil {
					t.Error("Apply returned; it must panic so the replica cannot diverge")
				}
			}()
			h.fsm.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: data})
		})
	}
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func TestListFiles(t *testing.T) {
	h := newHarness(t)
	for _, p := range []string{"/d/a", "/d/a.txt", "/d/b/x", "/d/b/y", "/d/c/z/w", "/d/e", "/other"} {
		h.must(create(p))
	}
	paths := func(entries []*masterpb.ListEntry) string {
		var b bytes.Buffer
		for _, e := range entries {
			b.WriteString(e.Path)
			if e.Dir {
				b.WriteString("/")
			}
			b.WriteString(" ")
		}
		return b.String()
	}
	tests := map[string]struct {
		dir        string
		recursive  bool
		startAfter string
		limit      int
		want       string
		wantNext   string
	}{
		"direct children collapse subdirectories": {dir: "/d", want: "/d/a /d/a.txt /d/b/ /d/c/ /d/e "},
		"the root lists top-level entries":        {dir: "/", want: "/d/ /other "},
		"recursive lists every file":              {dir: "/d", recursive: true, want: "/d/a /d/a.txt /d/b/x /d/b/y /d/c/z/w /d/e "},
		"a limit pages the listing":               {dir: "/d", limit: 3, want: "/d/a /d/a.txt /d/b/ ", wantNext: "/d/b"},
		"a page resumes after a directory":        {dir: "/d", startAfter: "/d/b", want: "/d/c/ /d/e "},
		"a page resumes after a file":             {dir: "/d", startAfter: "/d/a", want: "/d/a.txt /d/b/ /d/c/ /d/e "},
		"a recursive page resumes after a file":   {dir: "/d", recursive: true, startAfter: "/d/b/x", want: "/d/b/y /d/c/z/w /d/e "},
		"a missing directory is empty":            {dir: "/nope", want: ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			entries, next, err := h.fsm.ListFiles(tc.dir, tc.recursive, tc.startAfter, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if got := paths(entries); got != tc.want || next != tc.wantNext {
				t.Errorf("got %q next %q, want %q next %q", got, next, tc.want, tc.wantNext)
			}
		})
	}
}

func TestLookupNamesAFileAFolderOrNothing(t *testing.T) {
	h := newHarness(t)
	for _, p := range []string{"/d/a.txt", "/d/b/x", "/d/c/z/w"} {
		h.must(create(p))
	}
	tests := map[string]struct {
		path    string
		want    string // "file", "dir" or the error kind's text
		wantErr error
	}{
		"a file":                                 {path: "/d/a.txt", want: "file"},
		"a folder holding a file":                {path: "/d/b", want: "dir"},
		"a folder holding only a folder":         {path: "/d/c", want: "dir"},
		"the top folder":                         {path: "/d", want: "dir"},
		"nothing":                                {path: "/d/nope", wantErr: ErrNotFound},
		"a prefix of a file's name is not a dir": {path: "/d/a", wantErr: ErrNotFound},
		"below a file":                           {path: "/d/a.txt/x", wantErr: ErrNotFound},
		"the root is no file":                    {path: "/", wantErr: ErrInvalid},
		"a relative path":                        {path: "d/a.txt", wantErr: ErrInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			entry, err := h.fsm.Lookup(tc.path)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Lookup(%q) = %v, %v; want %v", tc.path, entry, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Lookup(%q): %v", tc.path, err)
			}
			got := "file"
			if entry.GetDir() {
				got = "dir"
			}
			if got != tc.want || entry.GetPath() != tc.path || (got == "file") != (entry.GetFile().GetPath() == tc.path) {
				t.Errorf("Lookup(%q) = %v, want a %s", tc.path, entry, tc.want)
			}
		})
	}
}

func TestMarkWorkerLostRecordsWhatIsLeft(t *testing.T) {
	h := newHarness(t)
	h.must(worker("w1"))
	h.must(worker("w2"))
	h.must(create("/replicated"))
	h.must(create("/checkpointed"))
	h.must(create("/alone"))
	h.must(commit(1, "/replicated", 0, "w1", "MEM"))
	h.must(commit(1, "/replicated", 0, "w2", "SSD"))
	h.must(commit(2, "/checkpointed", 0, "w1", "MEM"))
	h.must(checkpoint("/checkpointed"))
	h.must(commit(3, "/alone", 0, "w1", "MEM"))
	h.must(commit(4, "/alone", 100, "w1", "MEM"))

	// A limit of one block per step makes the loss take several commands, as it does for a
	// worker with many blocks.
	total := &masterpb.MarkWorkerLostResponse{}
	steps := 0
	for {
		res := h.must(lost("w1", 1)).(*masterpb.MarkWorkerLostStepResult)
		steps++
		total.BlocksLost += res.Counts.BlocksLost
		total.BlocksWithReplica += res.Counts.BlocksWithReplica
		total.BlocksWithCheckpoint += res.Counts.BlocksWithCheckpoint
		total.BlocksUnrecoverable += res.Counts.BlocksUnrecoverable
		if res.Done {
			break
		}
		w, err := h.fsm.GetWorker("w1")
		if err != nil || !w.LossPending || w.State != masterpb.WorkerState_WORKER_STATE_LOST {
			t.Fatalf("between steps: worker %v, %v; want LOST with loss pending", w, err)
		}
		if _, err := h.apply(1, worker("w1")); !errors.Is(err, ErrFailedPrecondition) {
			t.Fatalf("registering mid-loss: got %v, want failed precondition", err)
		}
	}
	if steps < 4 {
		t.Errorf("took %d steps, want at least 4 for 4 blocks at 1 per step", steps)
	}
	if total.BlocksLost != 4 || total.BlocksWithReplica != 1 || total.BlocksWithCheckpoint != 1 || total.BlocksUnrecoverable != 2 {
		t.Errorf("got %v, want 4 lost: 1 replicated, 1 checkpointed, 2 unrecoverable", total)
	}
	blocks, err := h.fsm.BlockLocations("", []uint64{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64][2]bool{1: {true, false}, 2: {false, true}, 3: {false, false}}
	for _, b := range blocks {
		if b.Loss == nil || [2]bool{b.Loss.ReplicaExists, b.Loss.CheckpointExists} != want[b.Id] {
			t.Errorf("block %d: loss %v, want replica/checkpoint %v", b.Id, b.Loss, want[b.Id])
		}
		for _, l := range b.Locations {
			if l.Worker == "w1" && !l.Lost {
				t.Errorf("block %d: copy on w1 not marked lost", b.Id)
			}
		}
	}
	// Marking it lost again is a no-op.
	if res := h.must(lost("w1", 0)).(*masterpb.MarkWorkerLostStepResult); !res.Done || res.Counts.BlocksLost != 0 {
		t.Errorf("second loss: got %v, want done with nothing marked", res)
	}
	// The block on w2 survives w2's own loss check: losing w2 now leaves nothing for block 1.
	res := h.must(lost("w2", 0)).(*masterpb.MarkWorkerLostStepResult)
	if res.Counts.BlocksUnrecoverable != 1 {
		t.Errorf("losing w2: got %v, want block 1 unrecoverable", res.Counts)
	}
}

func TestDeleteDatasetInSteps(t *testing.T) {
	h := newHarness(t)
	h.must(dataset("ds", "/d"))
	for i := 0; i < 10; i++ {
		h.must(createReq(&masterpb.CreateFileRequest{Path: fmt.Sprintf("/d/f%d", i), Dataset: "ds"}))
	}
	h.must(create("/outside"))
	var deleted uint64
	for steps := 1; ; steps++ {
		// Each file costs 2 keys, so a limit of 6 deletes three per step.
		res := h.must(deleteDataset("ds", 6)).(*masterpb.DeleteDatasetStepResult)
		deleted += res.FilesDeleted
		if res.Done {
			if steps != 4 {
				t.Errorf("took %d steps, want 4", steps)
			}
			break
		}
	}
	if deleted != 10 {
		t.Errorf("deleted %d files, want 10", deleted)
	}
	if _, err := h.fsm.GetDataset("ds"); !errors.Is(err, ErrNotFound) {
		t.Errorf("dataset after deletion: got %v, want not found", err)
	}
	if ok, _ := h.fsm.Exists("/outside"); !ok {
		t.Error("a file outside the dataset was deleted")
	}
}

// TestLargestFileFitsOneTransaction deletes a file with the most blocks and copies the limits
// allow: one command must always fit one Badger transaction.
func TestLargestFileFitsOneTransaction(t *testing.T) {
	h := newHarness(t)
	h.must(create("/big"))
	file, err := h.fsm.GetFile("/big")
	if err != nil {
		t.Fatal(err)
	}
	// Build the state directly; committing 32k copies one command at a time is slow.
	wb := h.fsm.db.NewWriteBatch()
	for i := uint64(1); i <= MaxBlocksPerFile; i++ {
		b := &masterpb.Block{Id: i, FileId: file.Id, Offset: int64(i) * 100, Size: 100}
		for w := 0; w < MaxLocationsPerBlock; w++ {
			id := fmt.Sprintf("worker-%d", w)
			b.Locations = append(b.Locations, &masterpb.BlockLocation{Worker: id, Tier: "MEM"})
			if err := wb.Set(workerBlockKey(id, i), nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := wb.Set(blockKey(i), mustMarshal(b)); err != nil {
			t.Fatal(err)
		}
		file.BlockIds = append(file.BlockIds, i)
	}
	if err := wb.Set(fileKey("/big"), mustMarshal(file)); err != nil {
		t.Fatal(err)
	}
	if err := wb.Flush(); err != nil {
		t.Fatal(err)
	}
	res := h.must(remove("/big")).(*masterpb.DeleteFileResponse)
	if res.BlocksDeleted != MaxBlocksPerFile {
		t.Errorf("deleted %d blocks, want %d", res.BlocksDeleted, MaxBlocksPerFile)
	}
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	cancelled, closed bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

func TestSnapshotHoldsExactlyTheAppliedIndex(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 50; i++ {
		h.must(create(fmt.Sprintf("/f%02d", i)))
	}
	snap, err := h.fsm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Entries applied after Snapshot returned must not leak into the persisted snapshot.
	h.must(create("/later"))
	h.must(remove("/f00"))
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	if !sink.closed || sink.cancelled {
		t.Fatalf("sink closed=%v cancelled=%v, want closed", sink.closed, sink.cancelled)
	}

	other := newHarness(t)
	other.must(create("/stale")) // Restore must drop what was there.
	if err := other.fsm.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if got := other.fsm.AppliedIndex(); got != 50 {
		t.Errorf("restored applied index %d, want 50", got)
	}
	for p, want := range map[string]bool{"/f00": true, "/f49": true, "/later": false, "/stale": false} {
		if ok, err := other.fsm.Exists(p); err != nil || ok != want {
			t.Errorf("%s: exists=%v (%v), want %v", p, ok, err, want)
		}
	}
	// File ids continue where the snapshot left off.
	other.index = 50
	if f := other.must(create("/next")).(*masterpb.File); f.Id != 51 {
		t.Errorf("next file id %d, want 51", f.Id)
	}
}

func TestRestoreRejectsCorruptSnapshots(t *testing.T) {
	h := newHarness(t)
	h.must(create("/a"))
	snap, err := h.fsm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	data := sink.Bytes()
	data[len(data)/2] ^= 0xff

	other := newHarness(t)
	other.must(create("/b"))
	if err := other.fsm.Restore(io.NopCloser(bytes.NewReader(data))); err == nil {
		t.Fatal("a corrupt snapshot restored without error")
	}
	if got := other.fsm.AppliedIndex(); got != 0 {
		t.Errorf("applied index after a failed restore is %d, want 0 so the next start restores again", got)
	}
}

func TestAppliedIndexSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(dir, logr.Discard(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, fsm: f}
	h.must(create("/a"))
	h.must(create("/b"))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, err = Open(dir, logr.Discard(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if got := f.AppliedIndex(); got != 2 {
		t.Errorf("applied index after reopen %d, want 2", got)
	}
	if err := f.db.View(func(txn *badger.Txn) error { _, err := getFile(txn, "/b"); return err }); err != nil {
		t.Errorf("reading /b after reopen: %v", err)
	}
}

// TestAttemptsAreSettledAsTheirPodsEnd follows a dataset that commits per attempt: a killed
// pod's files give way to its retry's, stay out of the usage until published, and a discarded
// attempt leaves nothing.
func TestAttemptsAreSettledAsTheirPodsEnd(t *testing.T) {
	h := newHarness(t)
	const root = "/datasets/ns/d/uid"
	h.must(&masterpb.Command{Op: &masterpb.Command_SetDatasetRecovery{SetDatasetRecovery: &masterpb.SetDatasetRecoveryRequest{
		Name: "ns/d/uid", Root: root, Recovery: &masterpb.DatasetRecovery{WaitSeconds: 60, CommitPerAttempt: true},
	}}})
	h.must(worker("w1"))
	blocks := uint64(0)
	sealBy := func(p, token, attempt string) *masterpb.Command {
		cmd := seal(root+"/"+p, token, 0)
		blocks++
		cmd.GetSealFile().Blocks[0].BlockId = blocks
		cmd.GetSealFile().Attempt = attempt
		return cmd
	}
	settle := func(attempt string, publish bool, limit uint32) *masterpb.Command {
		return &masterpb.Command{Op: &masterpb.Command_SettleAttempt{SettleAttempt: &masterpb.SettleAttemptStep{
			Dataset: "ns/d/uid", Attempt: attempt, Publish: publish, Limit: limit,
		}}}
	}
	attempts := func() []*masterpb.AttemptUsage {
		u, err := h.fsm.DatasetUsage("ns/d/uid", false)
		if err != nil {
			t.Fatal(err)
		}
		return u.Attempts
	}

	// The killed pod sealed a and b; its retry seals a again, then c.
	h.must(sealBy("a", "00000000000000000000000000000001", "pod-1"))
	h.must(sealBy("b", "00000000000000000000000000000002", "pod-1"))
	h.must(sealBy("a", "00000000000000000000000000000003", "pod-2"))
	h.must(sealBy("c", "00000000000000000000000000000004", "pod-2"))
	if f, err := h.fsm.GetFile(root + "/a"); err != nil || f.Attempt != "pod-2" || f.ClientToken != "00000000000000000000000000000003" {
		t.Fatalf("a after the retry sealed it: got %v, %v; want pod-2's version", f, err)
	}
	u, err := h.fsm.DatasetUsage("ns/d/uid", false)
	if err != nil {
		t.Fatal(err)
	}
	if u.Files != 0 || len(u.Attempts) != 2 || u.Attempts[0].Files != 1 || u.Attempts[1].Files != 2 {
		t.Fatalf("usage before settling: %v; want no file of the dataset, pod-1 with b, pod-2 with a and c", u)
	}

	// The retry succeeds, in steps of one file; the killed pod's attempt is discarded.
	var published uint64
	for {
		res := h.must(settle("pod-2", true, 1)).(*masterpb.SettleAttemptStepResult)
		published += res.Files
		if res.Done {
			break
		}
	}
	if published != 2 {
		t.Errorf("published %d files, want 2", published)
	}
	if res := h.must(settle("pod-1", false, 0)).(*masterpb.SettleAttemptStepResult); res.Files != 1 || !res.Done {
		t.Errorf("discarding pod-1: %v, want b discarded", res)
	}
	if got := attempts(); len(got) != 0 {
		t.Errorf("attempts left: %v", got)
	}
	if ok, _ := h.fsm.Exists(root + "/b"); ok {
		t.Error("b of the discarded attempt is still there")
	}
	for _, p := range []string{"a", "c"} {
		if f, err := h.fsm.GetFile(root + "/" + p); err != nil || f.Attempt != "" {
			t.Errorf("%s after publishing: %v, %v; want a published file", p, f, err)
		}
	}

	// A published file never gives way; a pending one of the same writer's seal never did.
	if _, err := h.apply(1e12, sealBy("a", "00000000000000000000000000000005", "pod-3")); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("another attempt sealing a published file: got %v, want already exists", err)
	}
	h.must(complete("ns/d/uid"))
	h.must(reopen("ns/d/uid"))
	h.must(sealBy("d", "00000000000000000000000000000006", "pod-3"))
	h.must(complete("ns/d/uid"))
	if _, err := h.apply(1e12, settle("pod-3", true, 0)); !errors.Is(err, ErrFailedPrecondition) {
		t.Errorf("publishing into a complete dataset: got %v, want failed precondition", err)
	}
	if res := h.must(settle("pod-3", false, 0)).(*masterpb.SettleAttemptStepResult); res.Files != 1 {
		t.Errorf("discarding in a complete dataset: %v, want d discarded", res)
	}
}

// TestADatasetThatDoesNotCommitPerAttemptPublishesAtOnce: the attempt a worker names is
// ignored unless the operator said the dataset commits per attempt (claims' outputs).
func TestADatasetThatDoesNotCommitPerAttemptPublishesAtOnce(t *testing.T) {
	h := newHarness(t)
	h.must(dataset("ns/d/uid", "/datasets/ns/d/uid"))
	h.must(worker("w1"))
	cmd := seal("/datasets/ns/d/uid/a", "00000000000000000000000000000001", 0)
	cmd.GetSealFile().Attempt = "pod-1"
	if f := h.must(cmd).(*masterpb.File); f.Attempt != "" {
		t.Errorf("got attempt %q, want a published file", f.Attempt)
	}
}
