package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/masterpb"
)

// batchLog is a log of commands of every kind of outcome, with one of raft's own entries among
// them, as raft would hand it to the state machine.
func batchLog() []*raft.Log {
	cmds := []*masterpb.Command{
		dataset("ds", "/ds"),
		create("/ds/a"),
		create("/ds/a"), // already exists: its file id allocation must not stay
		create("/ds/b"),
		rename("/ds/b", "/ds/c"),
		remove("/ds/missing"), // not found
		worker("w1"),
		commit(1, "/ds/a", 0, "w1", "mem"),
		create("/ds/d"),
		rename("/ds/missing", "/ds/e"), // not found
		remove("/ds/c"),
		create("/ds/c"),
		heartbeatCmd("w1"),
		create("/nowhere/x"),
		create("/ds/f"),
		create("/ds/d"), // already exists
	}
	var logs []*raft.Log
	for i, c := range cmds {
		c.Version = CommandVersion
		c.AtUnixNano = int64(i+1) * 1000
		logs = append(logs, entry(uint64(len(logs)+1), c))
		if i == 6 {
			logs = append(logs, &raft.Log{Index: uint64(len(logs) + 1), Term: 1, Type: raft.LogConfiguration})
		}
	}
	return logs
}

// contents is every key and value of the state machine's database.
func contents(t *testing.T, f *FSM) map[string][]byte {
	t.Helper()
	kv := map[string][]byte{}
	err := f.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.DefaultIteratorOptions)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			kv[string(it.Item().KeyCopy(nil))] = v
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func sameResult(a, b interface{}) error {
	ra, _ := a.(*Result)
	rb, _ := b.(*Result)
	switch {
	case ra == nil || rb == nil:
		if ra != rb {
			return fmt.Errorf("%v against %v", a, b)
		}
		return nil
	case !proto.Equal(ra.Response, rb.Response):
		return fmt.Errorf("response %v against %v", ra.Response, rb.Response)
	case errText(ra.Err) != errText(rb.Err):
		return fmt.Errorf("error %q against %q", errText(ra.Err), errText(rb.Err))
	}
	return nil
}

func TestApplyBatchEndsAsApplyingEachEntryAlone(t *testing.T) {
	logs := batchLog()
	alone := newHarness(t).fsm
	var want []interface{}
	for _, l := range logs {
		want = append(want, alone.Apply(l))
	}
	var outcomes int
	for _, w := range want {
		if r, ok := w.(*Result); ok && r.Err != nil {
			outcomes++
		}
	}
	if outcomes < 4 {
		t.Fatalf("the log has %d commands that fail; the test needs several", outcomes)
	}
	wantState := contents(t, alone)

	for _, size := range []int{1, 2, 3, 5, len(logs)} {
		t.Run(fmt.Sprintf("batches of %d", size), func(t *testing.T) {
			batched := newHarness(t).fsm
			var got []interface{}
			for start := 0; start < len(logs); start += size {
				got = append(got, batched.ApplyBatch(logs[start:min(start+size, len(logs))])...)
			}
			for i := range logs {
				if err := sameResult(got[i], want[i]); err != nil {
					t.Errorf("entry %d: batched %v", logs[i].Index, err)
				}
			}
			gotState := contents(t, batched)
			for k, v := range wantState {
				if !bytes.Equal(gotState[k], v) {
					t.Errorf("key %q: batched %x, alone %x", k, gotState[k], v)
				}
			}
			for k := range gotState {
				if _, ok := wantState[k]; !ok {
					t.Errorf("key %q written by the batches only", k)
				}
			}
			if batched.AppliedIndex() != uint64(len(logs)) {
				t.Errorf("applied index %d, want %d", batched.AppliedIndex(), len(logs))
			}
		})
	}
}

func TestApplyBatchSkipsEntriesAppliedBeforeARestart(t *testing.T) {
	logs := batchLog()
	h := newHarness(t)
	h.fsm.ApplyBatch(logs[:4])
	// Raft hands over again, after a restart that kept the database, entries already applied.
	got := h.fsm.ApplyBatch(logs[2:6])
	if got[0] != nil || got[1] != nil {
		t.Errorf("replayed entries returned %v and %v, want nil", got[0], got[1])
	}
	if r, ok := got[3].(*Result); !ok || !errors.Is(r.Err, ErrNotFound) {
		t.Errorf("entry 6 returned %v, want not found", got[3])
	}
	if ok, _ := h.fsm.Exists("/ds/b"); ok {
		t.Error("/ds/b was renamed by entry 5")
	}
}
