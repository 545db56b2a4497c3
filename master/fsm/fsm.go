package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/logadapter"
	"github.com/strata-cache/strata/master/masterpb"
)

// CommandVersion is the envelope version this binary writes and the highest it applies. Bump it
// when a command's meaning changes, and deploy the new binary on every replica before any of
// them proposes the new version: an old replica stops rather than misapply it.
const CommandVersion = 1

// MemTableSize is the Badger memtable size of the state machine. Badger bounds a transaction by
// a fraction of it, and a command is one transaction, so it is fixed here rather than
// configurable: replicas with different sizes could disagree on whether a command fits.
const MemTableSize = 32 << 20

// Result is what Apply returns through raft's ApplyFuture: the command's response or its
// outcome error (one of the package's sentinel errors, wrapped).
type Result struct {
	Response proto.Message
	Err      error
}

// FSM is the replicated state machine. Raft calls Apply, Snapshot and Restore from one
// goroutine; the read methods may be called concurrently with them.
type FSM struct {
	db       *badger.DB
	log      logr.Logger
	applied  atomic.Uint64
	restores atomic.Uint64
}

var _ raft.BatchingFSM = (*FSM)(nil)

// Options tune the state machine's Badger database. They affect memory and speed only, never
// outcomes, so replicas may differ.
type Options struct {
	// BlockCacheSize is Badger's block cache in bytes; 0 keeps Badger's default.
	BlockCacheSize int64
}

// Open opens (or creates) the state machine in dir.
func Open(dir string, log logr.Logger, o Options) (*FSM, error) {
	opts := badger.DefaultOptions(dir).
		WithLogger(logadapter.NewBadger(log.WithName("badger"))).
		// The Raft log is the durable record: after a crash the entries the state machine lost
		// are applied again, so its own writes need no fsync.
		WithSyncWrites(false).
		WithMemTableSize(MemTableSize).
		WithNumVersionsToKeep(1).
		WithNumCompactors(2)
	if o.BlockCacheSize > 0 {
		opts = opts.WithBlockCacheSize(o.BlockCacheSize)
	}
	db, err := badger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("opening state machine database in %s: %w", dir, err)
	}
	f := &FSM{db: db, log: log}
	idx, _, err := f.readApplied()
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	f.applied.Store(idx)
	return f, nil
}

// Close closes the database.
func (f *FSM) Close() error {
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("closing state machine database: %w", err)
	}
	return nil
}

// DB exposes the database for size measurements and value-log garbage collection.
func (f *FSM) DB() *badger.DB { return f.db }

// AppliedIndex is the index of the last entry applied (or restored).
func (f *FSM) AppliedIndex() uint64 { return f.applied.Load() }

func (f *FSM) readApplied() (index, term uint64, err error) {
	err = f.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(keyApplied)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) != 16 {
				return fmt.Errorf("applied-index record has %d bytes, want 16", len(v))
			}
			index, term = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
			return nil
		})
	})
	if err != nil {
		return 0, 0, fmt.Errorf("reading the applied index: %w", err)
	}
	return index, term, nil
}

// Apply applies one committed entry. It panics when the entry cannot be decoded or stored: a
// replica that went on would no longer match the others, and a crash lets it restart from its
// last consistent state and replay.
func (f *FSM) Apply(l *raft.Log) interface{} {
	cmd := f.decode(l)
	if cmd == nil {
		return nil
	}
	return f.applyAlone(l, cmd)
}

// ApplyBatch applies the entries raft committed together (up to its MaxAppendEntries) in one
// Badger transaction, the group commit of the state machine: one commit, and one applied-index
// record, for many clients' commands instead of one each. A command that ends with an outcome
// error (whose writes must be dropped, and a transaction cannot drop part of itself) or whose
// writes would outgrow the transaction ends the run before it: the commands before it are
// applied again into a fresh transaction and committed, and it is applied alone. The outcome is
// the same as applying the entries one by one, which Apply does, on every replica.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	results := make([]interface{}, len(logs))
	cmds := make([]*masterpb.Command, len(logs))
	for i, l := range logs {
		cmds[i] = f.decode(l)
	}
	for next := 0; next < len(logs); {
		next = f.applyRun(logs, cmds, results, next)
	}
	return results
}

// maxRun bounds the entries of one transaction. Badger sorts a transaction's pending writes
// each time it opens an iterator in it (which a create does, to tell a directory), so the cost
// of a run grows with the square of its length: past a few dozen writes, a longer run costs
// more than the commit it saves.
const maxRun = 16

// applyRun applies the entries from start on in one transaction, as many as it can, and
// returns the index (in logs) of the first entry it did not apply.
func (f *FSM) applyRun(logs []*raft.Log, cmds []*masterpb.Command, results []interface{}, start int) int {
	txn := f.db.NewTransaction(true)
	defer txn.Discard()
	end, applied := start, false
	for ; end < len(logs) && end-start < maxRun; end++ {
		if cmds[end] == nil {
			continue
		}
		resp, err := apply(txn, cmds[end])
		if err == nil {
			results[end] = &Result{Response: resp}
			applied = true
			continue
		}
		if !applied {
			results[end] = f.applyAlone(logs[end], cmds[end])
			return end + 1
		}
		// The transaction holds part of this command's writes: apply the ones before it again,
		// without them.
		txn.Discard()
		f.commitRun(logs, cmds, results, start, end)
		return end
	}
	if applied {
		f.commit(txn, logs[end-1])
	}
	return end
}

// commitRun applies the entries [start, end), which succeeded together before, in one
// transaction and commits it.
func (f *FSM) commitRun(logs []*raft.Log, cmds []*masterpb.Command, results []interface{}, start, end int) {
	txn := f.db.NewTransaction(true)
	defer txn.Discard()
	for i := start; i < end; i++ {
		if cmds[i] == nil {
			continue
		}
		resp, err := apply(txn, cmds[i])
		if err != nil {
			panic(fmt.Sprintf("fsm: applying log entry %d again, after a later one in its batch failed: %v", logs[i].Index, err))
		}
		results[i] = &Result{Response: resp}
	}
	f.commit(txn, logs[end-1])
}

// commit records last as applied in txn, commits it and publishes the applied index.
func (f *FSM) commit(txn *badger.Txn, last *raft.Log) {
	if err := recordApplied(txn, last); err != nil {
		panic(fmt.Sprintf("fsm: applying log entries up to %d: %v", last.Index, err))
	}
	if err := txn.Commit(); err != nil {
		panic(fmt.Sprintf("fsm: committing log entries up to %d: %v", last.Index, err))
	}
	f.applied.Store(last.Index)
}

// decode returns the command of a committed entry, or nil when there is nothing to apply: an
// entry of raft's own, or one a restart that kept the database replays. It panics on an entry
// this binary cannot interpret.
func (f *FSM) decode(l *raft.Log) *masterpb.Command {
	if l.Type != raft.LogCommand {
		return nil
	}
	if l.Index <= f.applied.Load() {
		// Replayed after a restart that kept the database: already applied in the transaction
		// that recorded this index.
		return nil
	}
	var cmd masterpb.Command
	if err := proto.Unmarshal(l.Data, &cmd); err != nil {
		panic(fmt.Sprintf("fsm: log entry %d (term %d) is not a Command: %v", l.Index, l.Term, err))
	}
	if cmd.Version == 0 || cmd.Version > CommandVersion {
		panic(fmt.Sprintf("fsm: log entry %d has command version %d; this binary applies up to %d: upgrade it",
			l.Index, cmd.Version, CommandVersion))
	}
	if cmd.Op == nil {
		// An operation added by a newer binary decodes as an unknown field with no op set.
		panic(fmt.Sprintf("fsm: log entry %d has no operation this binary knows: upgrade it", l.Index))
	}
	return &cmd
}

// applyAlone applies one command in a transaction of its own.
func (f *FSM) applyAlone(l *raft.Log, cmd *masterpb.Command) *Result {
	res := &Result{}
	err := f.update(l, func(txn *badger.Txn) error {
		resp, err := apply(txn, cmd)
		res.Response, res.Err = resp, err
		return err
	})
	if err != nil {
		panic(fmt.Sprintf("fsm: applying log entry %d: %v", l.Index, err))
	}
	f.applied.Store(l.Index)
	return res
}

// update runs fn in a transaction and records the entry's index in it. When fn ends with a
// command outcome (not a storage failure) its writes are dropped and only the index is stored.
func (f *FSM) update(l *raft.Log, fn func(txn *badger.Txn) error) error {
	txn := f.db.NewTransaction(true)
	defer txn.Discard()
	if err := fn(txn); err != nil {
		if !isOutcome(err) {
			return err
		}
		txn.Discard()
		txn = f.db.NewTransaction(true)
		defer txn.Discard()
	}
	if err := recordApplied(txn, l); err != nil {
		return err
	}
	if err := txn.Commit(); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
}

// recordApplied writes the index and term of l, the last entry a transaction applies, into it.
func recordApplied(txn *badger.Txn, l *raft.Log) error {
	v := make([]byte, 16)
	binary.BigEndian.PutUint64(v, l.Index)
	binary.BigEndian.PutUint64(v[8:], l.Term)
	if err := txn.Set(keyApplied, v); err != nil {
		return fmt.Errorf("recording applied index: %w", err)
	}
	return nil
}

func apply(txn *badger.Txn, cmd *masterpb.Command) (proto.Message, error) {
	at := cmd.AtUnixNano
	switch op := cmd.Op.(type) {
	case *masterpb.Command_CreateFile:
		return createFile(txn, at, op.CreateFile)
	case *masterpb.Command_RenameFile:
		return renameFile(txn, at, op.RenameFile)
	case *masterpb.Command_DeleteFile:
		return deleteFile(txn, op.DeleteFile)
	case *masterpb.Command_RegisterDataset:
		return registerDataset(txn, at, op.RegisterDataset)
	case *masterpb.Command_DeleteDataset:
		return deleteDatasetStep(txn, op.DeleteDataset)
	case *masterpb.Command_CommitBlock:
		return commitBlock(txn, at, op.CommitBlock)
	case *masterpb.Command_RegisterWorker:
		return registerWorker(txn, at, op.RegisterWorker)
	case *masterpb.Command_Heartbeat:
		return heartbeat(txn, at, op.Heartbeat)
	case *masterpb.Command_MarkWorkerLost:
		return markWorkerLostStep(txn, at, op.MarkWorkerLost)
	case *masterpb.Command_CheckpointFile:
		return checkpointFile(txn, at, op.CheckpointFile)
	case *masterpb.Command_RecordAccess:
		return recordAccess(txn, at, op.RecordAccess)
	case *masterpb.Command_SetPeer:
		return setPeer(txn, op.SetPeer)
	case *masterpb.Command_RemoveBlockCopy:
		return removeBlockCopy(txn, op.RemoveBlockCopy)
	case *masterpb.Command_RemovePeer:
		return removePeer(txn, op.RemovePeer)
	case *masterpb.Command_CompleteDataset:
		return completeDataset(txn, op.CompleteDataset)
	case *masterpb.Command_ReopenDataset:
		return reopenDataset(txn, op.ReopenDataset)
	case *masterpb.Command_SetDatasetRecovery:
		return setDatasetRecovery(txn, at, op.SetDatasetRecovery)
	case *masterpb.Command_ForgetWorker:
		return forgetWorker(txn, op.ForgetWorker)
	case *masterpb.Command_SealFile:
		return sealFile(txn, at, op.SealFile)
	case *masterpb.Command_SettleAttempt:
		return settleAttemptStep(txn, op.SettleAttempt)
	default:
		return nil, fmt.Errorf("operation %T has no handler", op)
	}
}

// Snapshot captures the state at the applied index. Raft calls it on the goroutine that applies
// entries, so no entry is applied between opening the transaction and returning.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &snapshot{txn: f.db.NewTransaction(false), index: f.applied.Load()}, nil
}

// Restore replaces the whole state with a snapshot stream.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer func() { _ = rc.Close() }()
	if err := f.db.DropAll(); err != nil {
		return fmt.Errorf("dropping the state before a restore: %w", err)
	}
	if err := readSnapshot(rc, f.db); err != nil {
		// The write batch may have stored part of the stream, applied-index record included;
		// leave an empty state instead, which the next start restores in full.
		if dropErr := f.db.DropAll(); dropErr != nil {
			return fmt.Errorf("restoring the state machine: %w (and clearing the partial restore: %w)", err, dropErr)
		}
		f.applied.Store(0)
		return fmt.Errorf("restoring the state machine: %w", err)
	}
	idx, _, err := f.readApplied()
	if err != nil {
		return err
	}
	f.applied.Store(idx)
	f.restores.Add(1)
	f.log.Info("restored state machine from snapshot", "appliedIndex", idx)
	return nil
}

// Restores counts the snapshots restored since Open.
func (f *FSM) Restores() uint64 { return f.restores.Load() }

// Reset drops the whole state, applied index included.
func (f *FSM) Reset() error {
	if err := f.db.DropAll(); err != nil {
		return fmt.Errorf("dropping the state machine: %w", err)
	}
	f.applied.Store(0)
	return nil
}
