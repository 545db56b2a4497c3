package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metrics"
	"github.com/hashicorp/raft-wal/migrate"

	"github.com/strata-cache/strata/internal/durable"
	"github.com/strata-cache/strata/master/logadapter"
)

// The replica's Raft log lives in Config.Dir/raft-wal: hashicorp/raft-wal's segment files,
// appended and fdatasync'd once per batch of entries, with the stable store (term, vote) beside
// them. Versions before it kept both in a Badger database in Config.Dir/raft, whose synced
// write batches cost about twice a segment file's append (docs/benchmarks.md); such a log is
// moved into the WAL when the replica starts (migrateBadgerLog).
const (
	walDirName        = "raft-wal"
	badgerLogDirName  = "raft"
	walMigratingName  = "raft-wal.migrating"
	migrateBatchBytes = 4 << 20
)

// raftLog is the Raft log and stable store of a replica.
type raftLog interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// raftStableKeys are the keys hashicorp/raft keeps in the stable store (raft.go:
// keyCurrentTerm, keyLastVoteTerm, keyLastVoteCand), and whether it writes each as a number
// (SetUint64, whose encoding differs between the stores) or as bytes. Nothing else of the
// master's writes there.
var raftStableKeys = []struct {
	name   string
	number bool
}{{"CurrentTerm", true}, {"LastVoteTerm", true}, {"LastVoteCand", false}}

// walLog is raft-wal's WAL, whose reads of compacted entries it corrects (GetLog).
type walLog struct {
	*wal.WAL
}

// GetLog reads the entry at index, or returns raft.ErrLogNotFound. An entry before the first
// index is not found, as raft expects of a compacted log: raft-wal (v0.4.2) still returns one
// whose head truncation left it in the segment being written, and a leader would then send a
// follower that fell behind entries from before its snapshot instead of the snapshot.
func (w *walLog) GetLog(index uint64, l *raft.Log) error {
	first, err := w.FirstIndex()
	if err != nil {
		return err
	}
	if index < first {
		return raft.ErrLogNotFound
	}
	return w.WAL.GetLog(index, l)
}

// openRaftLog opens (or creates) the replica's Raft log in dir, first moving into it a log
// that an earlier version kept in Badger. segmentSize is the size of each segment file (0: the
// library's 64 MiB); collector receives the WAL's counters.
func openRaftLog(dir string, log logr.Logger, segmentSize int, collector metrics.Collector) (*walLog, error) {
	if err := migrateBadgerLog(dir, log, segmentSize); err != nil {
		return nil, err
	}
	w, err := openWAL(filepath.Join(dir, walDirName), log, segmentSize, collector)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// openWAL opens the WAL in dir, creating the folder.
func openWAL(dir string, log logr.Logger, segmentSize int, collector metrics.Collector) (*walLog, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating the raft log folder: %w", err)
	}
	// A zero segment size is the library's default, a nil collector its no-op one.
	w, err := wal.Open(dir, wal.WithLogger(logadapter.NewHCLog(log.WithName("wal"), hclog.Info)),
		wal.WithSegmentSize(segmentSize), wal.WithMetricsCollector(collector))
	if err != nil {
		return nil, fmt.Errorf("opening the raft log in %s: %w", dir, err)
	}
	return &walLog{WAL: w}, nil
}

// migrateBadgerLog moves the Badger log of an earlier version (dir/raft) into the WAL
// (dir/raft-wal), entries and stable keys, and removes it. The WAL is built under another name
// and renamed into place once complete, so a replica killed half way builds it again at its
// next start; one killed after the rename, before the Badger log was removed, removes it then.
// The replica's votes move with the stable keys: a replica never forgets a vote it gave.
func migrateBadgerLog(dir string, log logr.Logger, segmentSize int) error {
	legacy := filepath.Join(dir, badgerLogDirName)
	final := filepath.Join(dir, walDirName)
	if _, err := os.Stat(final); err == nil {
		// Migrated (or never on Badger); a Badger log left is one whose removal a kill cut short.
		return removeLegacyLog(legacy, log)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("looking for the raft log: %w", err)
	}
	if has, err := hasFiles(legacy); err != nil || !has {
		if err != nil {
			return fmt.Errorf("looking for a raft log of an earlier version: %w", err)
		}
		return removeLegacyLog(legacy, log) // an empty folder an earlier version made
	}
	tmp := filepath.Join(dir, walMigratingName)
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("removing a half-built raft log: %w", err)
	}
	log.Info("moving the raft log from Badger into a segment-file WAL", "from", legacy, "to", final)
	old, err := OpenLogStore(legacy, log.WithName("badger-log"), LogStoreOptions{})
	if err != nil {
		return err
	}
	copied, err := copyRaftLog(old, tmp, log, segmentSize)
	if cerr := old.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("moving the raft log of an earlier version into %s: %w", final, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("moving the raft log into place: %w", err)
	}
	if err := durable.SyncDir(dir); err != nil {
		return err
	}
	log.Info("moved the raft log into the WAL", "entries", copied)
	return removeLegacyLog(legacy, log)
}

// copyRaftLog copies the entries and stable keys of old into a new WAL in dir, synced, and
// returns how many entries it copied.
func copyRaftLog(old *LogStore, dir string, log logr.Logger, segmentSize int) (copied uint64, err error) {
	w, err := openWAL(dir, log, segmentSize, nil)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := w.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("closing the new raft log: %w", cerr)
		}
	}()
	for _, k := range raftStableKeys {
		if err := copyStableKey(old, w, k.name, k.number); err != nil {
			return 0, err
		}
	}
	first, _ := old.FirstIndex()
	last, _ := old.LastIndex()
	if last == 0 {
		return 0, nil // nothing but a snapshot, or nothing at all
	}
	if err := migrate.CopyLogs(context.Background(), w, old, migrateBatchBytes, nil); err != nil {
		return 0, err
	}
	return last - first + 1, nil
}

// copyStableKey copies key, if old has it, into w: as a number or as bytes.
func copyStableKey(old *LogStore, w raft.StableStore, key string, number bool) error {
	var err error
	if number {
		var v uint64
		if v, err = old.GetUint64([]byte(key)); err == nil {
			err = w.SetUint64([]byte(key), v)
		}
	} else {
		var v []byte
		if v, err = old.Get([]byte(key)); err == nil {
			err = w.Set([]byte(key), v)
		}
	}
	if err != nil && !errors.Is(err, ErrKeyNotFound) {
		return fmt.Errorf("copying %s: %w", key, err)
	}
	return nil
}

// removeLegacyLog removes a Badger log folder, if there is one.
func removeLegacyLog(legacy string, log logr.Logger) error {
	if _, err := os.Stat(legacy); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.RemoveAll(legacy); err != nil {
		return fmt.Errorf("removing the raft log of an earlier version, %s, already moved into the WAL: %w", legacy, err)
	}
	log.V(1).Info("removed the raft log of an earlier version", "dir", legacy)
	return nil
}

// hasFiles says whether dir exists and holds anything.
func hasFiles(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	}
	return len(entries) > 0, nil
}
