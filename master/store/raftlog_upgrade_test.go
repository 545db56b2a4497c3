package store_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/migrate"

	"github.com/strata-cache/strata/master/mastertest"
	"github.com/strata-cache/strata/master/store"
)

// TestReplicasUpgradedFromTheBadgerLogKeepTheirState: three replicas whose Raft logs are in the
// Badger format of earlier versions (made here from the logs they wrote, as a downgrade would
// leave them) start on the WAL with everything they had: the files, a leader, their terms, and
// they take new writes.
func TestReplicasUpgradedFromTheBadgerLogKeepTheirState(t *testing.T) {
	ctx := deadline(t, 2*time.Minute)
	c := mastertest.New(t, 3, mastertest.Options{})
	createFiles(ctx, t, c, "before", 50)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	terms := map[string]uint64{}
	for _, n := range c.Nodes {
		c.Kill(n)
		terms[n.ID] = toBadgerLog(t, n.Dir)
	}
	for _, n := range c.Nodes {
		c.Restart(n)
	}
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	createFiles(ctx, t, c, "after", 10)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		checkFiles(ctx, t, n, "before", 50)
		checkFiles(ctx, t, n, "after", 10)
		if term := n.Store.Term(); term < terms[n.ID] {
			t.Errorf("%s is at term %d after the upgrade, below the %d it had reached", n.ID, term, terms[n.ID])
		}
		if _, err := os.Stat(filepath.Join(n.Dir, "raft")); !os.IsNotExist(err) {
			t.Errorf("%s still has its Badger log (%v)", n.ID, err)
		}
	}
}

// toBadgerLog rewrites the WAL in dir/raft-wal as the Badger log of earlier versions in
// dir/raft, and returns the term it had reached.
func toBadgerLog(t *testing.T, dir string) uint64 {
	t.Helper()
	w, err := wal.Open(filepath.Join(dir, "raft-wal"))
	if err != nil {
		t.Fatal(err)
	}
	old, err := store.OpenLogStore(filepath.Join(dir, "raft"), logr.Discard(), store.LogStoreOptions{MemTableSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := migrate.CopyLogs(context.Background(), old, w, 1<<20, nil); err != nil {
		t.Fatal(err)
	}
	if err := migrate.CopyStable(context.Background(), old, w, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	term, err := w.GetUint64([]byte("CurrentTerm"))
	if err != nil || term == 0 {
		t.Fatalf("the WAL's term: %d (%v)", term, err)
	}
	for _, err := range []error{old.Close(), w.Close(), os.RemoveAll(filepath.Join(dir, "raft-wal"))} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return term
}
