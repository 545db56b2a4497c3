package store

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"
)

// These tests hold the Badger log store to what raft expects of raft-boltdb and InmemStore.

func openLogStore(t *testing.T, dir string) *LogStore {
	t.Helper()
	s, err := OpenLogStore(dir, logr.Discard(), LogStoreOptions{MemTableSize: 4 << 20})
	if err != nil {
		t.Fatalf("opening log store: %v", err)
	}
	return s
}

func testLog(i uint64) *raft.Log {
	return &raft.Log{
		Index: i, Term: i / 3, Type: raft.LogCommand, Data: []byte{byte(i), 'd'},
		Extensions: []byte("ext"), AppendedAt: time.Unix(1700000000, int64(i)),
	}
}

func storeRange(t *testing.T, s *LogStore, lo, hi uint64) {
	t.Helper()
	var logs []*raft.Log
	for i := lo; i <= hi; i++ {
		logs = append(logs, testLog(i))
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatalf("StoreLogs(%d-%d): %v", lo, hi, err)
	}
}

func checkRange(t *testing.T, s *LogStore, first, last uint64) {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if f != first || l != last {
		t.Errorf("range [%d, %d], want [%d, %d]", f, l, first, last)
	}
}

func TestLogStoreEmpty(t *testing.T) {
	s := openLogStore(t, t.TempDir())
	defer func() { _ = s.Close() }()
	checkRange(t, s, 0, 0)
	var l raft.Log
	if err := s.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Errorf("GetLog on an empty log: got %v, want raft.ErrLogNotFound", err)
	}
}

func TestLogStoreRoundTrip(t *testing.T) {
	s := openLogStore(t, t.TempDir())
	defer func() { _ = s.Close() }()
	storeRange(t, s, 1, 10)
	if err := s.StoreLog(testLog(11)); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, 1, 11)
	for i := uint64(1); i <= 11; i++ {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil {
			t.Fatalf("GetLog(%d): %v", i, err)
		}
		want := testLog(i)
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
			!bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) ||
			!got.AppendedAt.Equal(want.AppendedAt) {
			t.Errorf("GetLog(%d) = %+v, want %+v", i, got, *want)
		}
	}
}

func TestLogStoreDeleteRange(t *testing.T) {
	tests := map[string]struct {
		lo, hi      uint64
		first, last uint64
		gone        []uint64
		kept        []uint64
	}{
		"compacting the head":             {lo: 1, hi: 5, first: 6, last: 20, gone: []uint64{1, 5}, kept: []uint64{6, 20}},
		"truncating the tail":             {lo: 15, hi: 20, first: 1, last: 14, gone: []uint64{15, 20}, kept: []uint64{1, 14}},
		"deleting everything":             {lo: 1, hi: 20, first: 0, last: 0, gone: []uint64{1, 20}},
		"a range wider than the log":      {lo: 0, hi: 1000, first: 0, last: 0, gone: []uint64{1, 20}},
		"a range past the end is nothing": {lo: 30, hi: 40, first: 1, last: 20, kept: []uint64{1, 20}},
		"a middle range leaves a gap":     {lo: 5, hi: 10, first: 1, last: 20, gone: []uint64{5, 10}, kept: []uint64{4, 11}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := openLogStore(t, t.TempDir())
			defer func() { _ = s.Close() }()
			storeRange(t, s, 1, 20)
			if err := s.DeleteRange(tc.lo, tc.hi); err != nil {
				t.Fatal(err)
			}
			checkRange(t, s, tc.first, tc.last)
			var l raft.Log
			for _, i := range tc.gone {
				if err := s.GetLog(i, &l); !errors.Is(err, raft.ErrLogNotFound) {
					t.Errorf("GetLog(%d) after delete: got %v, want raft.ErrLogNotFound", i, err)
				}
			}
			for _, i := range tc.kept {
				if err := s.GetLog(i, &l); err != nil {
					t.Errorf("GetLog(%d): %v", i, err)
				}
			}
		})
	}
}

func TestLogStoreLargeBatchesSpanTransactions(t *testing.T) {
	s := openLogStore(t, t.TempDir())
	defer func() { _ = s.Close() }()
	// A 4 MiB memtable caps a transaction near 600 KiB: these 2 MiB must be split.
	var logs []*raft.Log
	for i := uint64(1); i <= 2048; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{'x'}, 1024)})
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, 1, 2048)
	if err := s.DeleteRange(1, 2000); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, 2001, 2048)
}

func TestLogStoreReopenKeepsRange(t *testing.T) {
	dir := t.TempDir()
	s := openLogStore(t, dir)
	storeRange(t, s, 1, 30)
	if err := s.DeleteRange(1, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openLogStore(t, dir)
	defer func() { _ = s.Close() }()
	checkRange(t, s, 11, 30)
}

func TestStableStore(t *testing.T) {
	dir := t.TempDir()
	s := openLogStore(t, dir)
	if _, err := s.Get([]byte("missing")); err == nil || err.Error() != "not found" {
		t.Errorf("Get of a missing key: got %v, want an error reading exactly \"not found\" (raft matches the text)", err)
	}
	if _, err := s.GetUint64([]byte("missing")); err == nil || err.Error() != "not found" {
		t.Errorf("GetUint64 of a missing key: got %v, want \"not found\"", err)
	}
	if err := s.Set([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("term"), 42); err != nil {
		t.Fatal(err)
	}
	// Stable keys live beside the log and must not show up as log entries.
	checkRange(t, s, 0, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openLogStore(t, dir)
	defer func() { _ = s.Close() }()
	if v, err := s.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Errorf("Get(k) = %q, %v; want v", v, err)
	}
	if v, err := s.GetUint64([]byte("term")); err != nil || v != 42 {
		t.Errorf("GetUint64(term) = %d, %v; want 42", v, err)
	}
}

func TestLogDecodingRejectsCorruption(t *testing.T) {
	enc := encodeLog(testLog(7))
	for i := 0; i < len(enc); i++ {
		var l raft.Log
		// Truncations must fail cleanly, never panic or return a half entry.
		if err := decodeLog(7, enc[:i], &l); err == nil {
			t.Errorf("decoding the first %d of %d bytes succeeded", i, len(enc))
		}
	}
}
