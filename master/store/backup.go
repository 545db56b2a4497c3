package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/hashicorp/raft"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/masterpb"
)

// Errors of Restore.
var (
	// ErrNotEmpty refuses a restore into a master that holds files pods wrote: a restore
	// replaces the whole state, and is meant for a new install.
	ErrNotEmpty = errors.New("the master is not empty")
	// ErrBadBackup is a stream that is not a whole, intact backup.
	ErrBadBackup = errors.New("not an intact backup")
)

// ReasonRestored is why a restore marks the backup's workers lost.
const ReasonRestored = "the master was restored from a backup: the copies this worker held belong to the install that was backed up"

// Backup opens the whole state for a backup, as of now: this replica must lead, and it takes a
// snapshot after confirming so (VerifyRead), so every write acknowledged before the call is in
// it. The caller closes the stream, which is the state machine's snapshot (fsm.VerifySnapshot).
func (s *Store) Backup(ctx context.Context) (*raft.SnapshotMeta, io.ReadCloser, error) {
	if err := s.VerifyRead(ctx); err != nil {
		return nil, nil, err
	}
	f := s.raft.Snapshot()
	err := s.wait(ctx, f)
	if errors.Is(err, raft.ErrNothingNewToSnapshot) {
		// The latest snapshot already holds every entry applied.
		return s.openLatestSnapshot()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("taking a snapshot for a backup: %w", err)
	}
	meta, rc, err := f.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("opening the snapshot taken for a backup: %w", err)
	}
	return meta, rc, nil
}

func (s *Store) openLatestSnapshot() (*raft.SnapshotMeta, io.ReadCloser, error) {
	snaps, err := s.snaps.List()
	if err != nil {
		return nil, nil, fmt.Errorf("listing snapshots: %w", err)
	}
	if len(snaps) == 0 {
		return nil, nil, errors.New("raft took no snapshot and has none")
	}
	meta, rc, err := s.snaps.Open(snaps[0].ID)
	if err != nil {
		return nil, nil, fmt.Errorf("opening snapshot %s: %w", snaps[0].ID, err)
	}
	return meta, rc, nil
}

// RestoreResult says what a restore brought back.
type RestoreResult struct {
	Backup fsm.SnapshotInfo
	// AlreadyRestored says the state was restored from this backup by an earlier call, whose
	// caller did not learn it (see fsm.PrepareRestore); this one finished what it left.
	AlreadyRestored bool
	// Replaced is what the new install held before: Dataset records and files of cached blocks,
	// which come back as the datasets are used and the workers report their blocks.
	Replaced fsm.Holdings
	// WorkersMarkedLost are the backup's workers that were alive in it.
	WorkersMarkedLost []string
}

// Restore replaces the state of a leader that holds no file a pod wrote with a backup (a stream
// Backup gave): a new install, whose workers may have reported blocks they cache from sources
// (they report them again, registering after the restore). The stream is spooled to disk and
// checked whole first: raft cannot undo a restore that fails half-way. raft replicates the
// restored state to the followers as a snapshot. The replicas keep their own peer records (the
// backup's name the old install's replicas: fsm.PrepareRestore), and every worker the backup
// knows as alive is marked lost: its copies were the old install's, and the workers that run
// now register again and report what they hold.
//
// A restore whose outcome is unknown (raft lost the leadership before the entry after it
// committed: the followers were busy installing the restored snapshot) may be asked again: the
// state that was restored from this backup says so, and the call finishes the job.
func (s *Store) Restore(ctx context.Context, r io.Reader) (RestoreResult, error) {
	s.restoreMu.Lock()
	defer s.restoreMu.Unlock()
	var res RestoreResult
	var peers []*masterpb.Peer
	if err := s.Read(ctx, false, func(m *fsm.FSM) (err error) {
		peers, err = m.Peers()
		return err
	}); err != nil {
		return res, err
	}
	// This replica's own record may not be written yet (it is, soon after it became leader).
	peers = slices.DeleteFunc(peers, func(p *masterpb.Peer) bool { return p.GetRaftId() == s.cfg.ID })
	peers = append(peers, &masterpb.Peer{RaftId: s.cfg.ID, RaftAddr: string(s.trans.LocalAddr()), ApiAddr: s.cfg.APIAddr})

	spool, err := os.CreateTemp(s.cfg.Dir, "restore-*.tmp")
	if err != nil {
		return res, fmt.Errorf("spooling the backup: %w", err)
	}
	defer func() {
		_ = spool.Close()
		_ = os.Remove(spool.Name())
	}()
	if res.Backup, err = fsm.PrepareRestore(r, spool, peers); err != nil {
		if ctx.Err() != nil { // the caller went away mid-stream
			return res, fmt.Errorf("receiving the backup: %w", err)
		}
		return res, fmt.Errorf("%w: %w", ErrBadBackup, err)
	}

	var restoredFrom string
	err = s.Read(ctx, false, func(m *fsm.FSM) (err error) {
		if res.Replaced, err = m.Holds(); err != nil {
			return err
		}
		restoredFrom, err = m.RestoredFrom()
		return err
	})
	switch {
	case err != nil:
		return res, err
	case restoredFrom == res.Backup.ID():
		res.AlreadyRestored, res.Replaced = true, fsm.Holdings{}
		s.log.Info("the state was restored from this backup before; finishing the restore", "backup", restoredFrom)
	case res.Replaced.Written > 0:
		return res, fmt.Errorf("%w: it holds %d file(s) written by pods; a backup is restored into a new install before anything is written to it",
			ErrNotEmpty, res.Replaced.Written)
	default:
		if err := s.restoreSpooled(ctx, spool, res); err != nil {
			return res, err
		}
	}
	res.WorkersMarkedLost, err = s.markBackupWorkersLost(ctx, res.Backup.AliveWorkers)
	return res, err
}

// restoreSpooled hands the prepared snapshot to raft.
func (s *Store) restoreSpooled(ctx context.Context, spool *os.File, res RestoreResult) error {
	size, err := spool.Seek(0, io.SeekCurrent)
	if err == nil {
		_, err = spool.Seek(0, io.SeekStart)
	}
	if err != nil {
		return fmt.Errorf("rereading the spooled backup: %w", err)
	}
	// raft names the restored snapshot after an index past both its own log and the backup's
	// last entry: the state machine's applied index (the backup's) stays below every entry that
	// follows, so none of them is taken for one applied before.
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: res.Backup.AppliedIndex, Term: res.Backup.AppliedTerm, Size: size}
	if err := s.mapRaftErr(ctx, s.raft.Restore(meta, spool, s.timeout(ctx))); err != nil {
		return fmt.Errorf("restoring a backup of index %d: %w", res.Backup.AppliedIndex, err)
	}
	s.log.Info("restored a backup", "backup", res.Backup.ID(), "bytes", size,
		"datasets", res.Backup.Datasets, "files", res.Backup.Files, "workers", res.Backup.Workers,
		"replacedDatasets", res.Replaced.Datasets, "replacedFiles", res.Replaced.Files)
	return nil
}

// markBackupWorkersLost marks lost the workers a backup held as alive that still stand as it
// left them (registered when it says): one that registered since, in the new install, is left
// alone.
func (s *Store) markBackupWorkersLost(ctx context.Context, backup []*masterpb.Worker) ([]string, error) {
	current := map[string]*masterpb.Worker{}
	if err := s.Read(ctx, false, func(m *fsm.FSM) error {
		workers, err := m.Workers()
		for _, w := range workers {
			current[w.GetId()] = w
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("listing the restored workers: %w", err)
	}
	var marked []string
	for _, old := range backup {
		w := current[old.GetId()]
		if w == nil || w.GetRegisteredUnixNano() != old.GetRegisteredUnixNano() ||
			(w.GetState() != masterpb.WorkerState_WORKER_STATE_ALIVE && !w.GetLossPending()) {
			continue
		}
		if _, err := s.MarkWorkerLost(ctx, w.GetId(), ReasonRestored); err != nil {
			return marked, err
		}
		marked = append(marked, w.GetId())
	}
	return marked, nil
}
