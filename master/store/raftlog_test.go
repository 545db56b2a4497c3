package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"
)

// badgerLog writes, in dir/raft, the log an earlier version kept: entries lo..hi (none when hi
// is 0) and the stable keys given.
func badgerLog(t *testing.T, dir string, lo, hi uint64, uint64Keys map[string]uint64, bytesKeys map[string][]byte) {
	t.Helper()
	s := openLogStore(t, filepath.Join(dir, badgerLogDirName))
	defer func() {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	if hi > 0 {
		storeRange(t, s, lo, hi)
	}
	for k, v := range uint64Keys {
		if err := s.SetUint64([]byte(k), v); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range bytesKeys {
		if err := s.Set([]byte(k), v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestARaftLogOfAnEarlierVersionMovesIntoTheWAL: a replica's Badger log (an earlier version's)
// is moved into the WAL at open, every entry and the stable keys (its term and vote) as they
// were, and is gone afterwards, also when a kill cut the move short before or after the WAL
// was renamed into place.
func TestARaftLogOfAnEarlierVersionMovesIntoTheWAL(t *testing.T) {
	voted := map[string][]byte{"LastVoteCand": []byte("master-2")}
	terms := map[string]uint64{"CurrentTerm": 9, "LastVoteTerm": 8}
	for name, tc := range map[string]struct {
		lo, hi      uint64
		uint64Keys  map[string]uint64
		bytesKeys   map[string][]byte
		halfBuilt   bool // a kill cut a move short before the rename
		notRemoved  bool // a kill came after the rename, before the Badger log was removed
		wantEntries bool
	}{
		"entries and a vote":                {lo: 1, hi: 3000, uint64Keys: terms, bytesKeys: voted, wantEntries: true},
		"a log compacted after a snapshot":  {lo: 1201, hi: 1300, uint64Keys: terms, bytesKeys: voted, wantEntries: true},
		"a replica that never voted":        {lo: 1, hi: 40, uint64Keys: map[string]uint64{"CurrentTerm": 2}, wantEntries: true},
		"no entries, only a term":           {uint64Keys: terms, bytesKeys: voted},
		"a move a kill cut short":           {lo: 1, hi: 500, uint64Keys: terms, bytesKeys: voted, halfBuilt: true, wantEntries: true},
		"a move killed before the clean-up": {lo: 1, hi: 500, uint64Keys: terms, bytesKeys: voted, notRemoved: true, wantEntries: true},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			badgerLog(t, dir, tc.lo, tc.hi, tc.uint64Keys, tc.bytesKeys)
			if tc.halfBuilt {
				half := filepath.Join(dir, walMigratingName)
				if err := os.MkdirAll(half, 0o750); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(half, "wal-meta.db"), []byte("cut short"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.notRemoved {
				// The first open moves the log; the Badger log is then put back, as a kill
				// before its removal would have left it. Its entries must not be taken again.
				w, err := openRaftLog(dir, logr.Discard(), 1<<20, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				badgerLog(t, dir, tc.hi+1, tc.hi+100, map[string]uint64{"CurrentTerm": 1}, nil)
			}

			w, err := openRaftLog(dir, logr.Discard(), 1<<20, nil)
			if err != nil {
				t.Fatalf("opening the raft log: %v", err)
			}
			defer func() { _ = w.Close() }()

			first, _ := w.FirstIndex()
			last, _ := w.LastIndex()
			wantFirst, wantLast := tc.lo, tc.hi
			if !tc.wantEntries {
				wantFirst, wantLast = 0, 0
			}
			if first != wantFirst || last != wantLast {
				t.Fatalf("the WAL holds entries %d-%d, want %d-%d", first, last, wantFirst, wantLast)
			}
			for i := tc.lo; tc.wantEntries && i <= tc.hi; i++ {
				var got raft.Log
				if err := w.GetLog(i, &got); err != nil {
					t.Fatalf("entry %d: %v", i, err)
				}
				want := testLog(i)
				if got.Term != want.Term || got.Type != want.Type || !bytes.Equal(got.Data, want.Data) ||
					!bytes.Equal(got.Extensions, want.Extensions) || !got.AppendedAt.Equal(want.AppendedAt) {
					t.Fatalf("entry %d is %+v, want %+v", i, got, want)
				}
			}
			for k, want := range tc.uint64Keys {
				if got, err := w.GetUint64([]byte(k)); err != nil || got != want {
					t.Errorf("%s is %d (%v), want %d", k, got, err, want)
				}
			}
			if got, err := w.Get([]byte("LastVoteCand")); err != nil || !bytes.Equal(got, tc.bytesKeys["LastVoteCand"]) {
				t.Errorf("LastVoteCand is %q (%v), want %q", got, err, tc.bytesKeys["LastVoteCand"])
			}
			for _, gone := range []string{badgerLogDirName, walMigratingName} {
				if _, err := os.Stat(filepath.Join(dir, gone)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s is still there after the move (%v)", gone, err)
				}
			}
		})
	}
}

// TestAFreshReplicaStartsOnTheWAL: with nothing on disk, the log is a new, empty WAL.
func TestAFreshReplicaStartsOnTheWAL(t *testing.T) {
	dir := t.TempDir()
	w, err := openRaftLog(dir, logr.Discard(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	if ok, err := raft.HasExistingState(w, w, raft.NewInmemSnapshotStore()); err != nil || ok {
		t.Fatalf("a fresh log has state %v (%v)", ok, err)
	}
	if _, err := os.Stat(filepath.Join(dir, walDirName)); err != nil {
		t.Fatalf("no WAL folder: %v", err)
	}
}

// TestACompactedEntryIsNotFound: after the head of the log is deleted (compaction after a
// snapshot), its entries are not found, though they sit in the segment still being written,
// so that a leader sends a follower that fell behind its snapshot.
func TestACompactedEntryIsNotFound(t *testing.T) {
	w, err := openRaftLog(t.TempDir(), logr.Discard(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	var logs []*raft.Log
	for i := uint64(1); i <= 100; i++ {
		logs = append(logs, testLog(i))
	}
	if err := w.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteRange(1, 90); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	if err := w.GetLog(90, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Errorf("the compacted entry 90: %v, want raft.ErrLogNotFound", err)
	}
	if err := w.GetLog(91, &l); err != nil || l.Index != 91 {
		t.Errorf("entry 91: %v (index %d)", err, l.Index)
	}
}
