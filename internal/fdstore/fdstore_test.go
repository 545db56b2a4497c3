package fdstore_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/fdstore"
	"github.com/strata-cache/strata/internal/fdstore/fdstoretest"
)

// TestFilesOutliveTheProcessThatPutThem puts the write end of a pipe, closes the putter's own
// copy (as a process that exits would), and gets it back: writes through the descriptor the
// store kept reach the read end, so it is the same open file, not a new one.
func TestFilesOutliveTheProcessThatPutThem(t *testing.T) {
	g := NewWithT(t)
	store, path := fdstoretest.Start(t)
	ctx := context.Background()
	pool, err := fdstore.NewClient(path, "pool-a")
	g.Expect(err).NotTo(HaveOccurred())
	other, err := fdstore.NewClient(path, "pool-b")
	g.Expect(err).NotTo(HaveOccurred())

	r, w, err := os.Pipe()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = r.Close() }()
	g.Expect(pool.Put(ctx, "uid-1", []byte("how to use it"), []*os.File{w})).To(Succeed())
	g.Expect(w.Close()).To(Succeed())
	g.Expect(store.Len()).To(Equal(1))

	g.Expect(pool.Keys(ctx)).To(ConsistOf("uid-1"))
	g.Expect(other.Keys(ctx)).To(BeEmpty(), "owners do not see each other's entries")
	_, _, err = other.Get(ctx, "uid-1")
	g.Expect(err).To(MatchError(fdstore.ErrNotFound))

	data, files, err := pool.Get(ctx, "uid-1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(data).To(Equal([]byte("how to use it")))
	g.Expect(files).To(HaveLen(1))
	_, err = files[0].Write([]byte("still open"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(files[0].Close()).To(Succeed())
	buf := make([]byte, 10)
	_, err = io.ReadFull(r, buf)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(buf)).To(Equal("still open"))

	// Dropping closes the store's copy: the pipe's last writer is gone, so the reader sees EOF.
	g.Expect(pool.Drop(ctx, "uid-1")).To(Succeed())
	g.Expect(pool.Drop(ctx, "uid-1")).To(Succeed(), "dropping twice is fine")
	_, err = r.Read(buf)
	g.Expect(err).To(MatchError(io.EOF))
	g.Expect(store.Len()).To(BeZero())
}

func TestBadRequestsAreRefusedWithTheReason(t *testing.T) {
	g := NewWithT(t)
	_, path := fdstoretest.Start(t)
	ctx := context.Background()
	_, err := fdstore.NewClient(path, "../etc")
	g.Expect(err).To(MatchError(ContainSubstring("owner")))
	c, err := fdstore.NewClient(path, "pool")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Put(ctx, "k", nil, nil)).To(MatchError(ContainSubstring("1 to 16 files")))
	r, w, err := os.Pipe()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = r.Close(); _ = w.Close() }()
	g.Expect(c.Put(ctx, "a/b", nil, []*os.File{w})).To(MatchError(ContainSubstring(`key "a/b"`)))

	absent, err := fdstore.NewClient(filepath.Join(t.TempDir(), "none.sock"), "pool")
	g.Expect(err).NotTo(HaveOccurred())
	_, err = absent.Keys(ctx)
	g.Expect(err).To(MatchError(ContainSubstring("is the CSI node plugin running?")))
}

// TestTheEntriesOfAnOwnerGoneForGoodAreDropped runs the reaper on a clock of its own: an owner
// away for less than the grace period keeps its entries, one away for longer loses them.
func TestTheEntriesOfAnOwnerGoneForGoodAreDropped(t *testing.T) {
	g := NewWithT(t)
	store, path := fdstoretest.Start(t)
	ctx := context.Background()
	clients := map[string]*fdstore.Client{}
	for _, owner := range []string{"restarting", "deleted"} {
		c, err := fdstore.NewClient(path, owner)
		g.Expect(err).NotTo(HaveOccurred())
		clients[owner] = c
		r, w, err := os.Pipe()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(c.Put(ctx, "uid", nil, []*os.File{w})).To(Succeed())
		_ = r.Close()
		_ = w.Close()
	}
	alive := map[string]bool{"restarting": true, "deleted": true}
	reaper := &fdstore.Reaper{Store: store, Grace: 10 * time.Minute, Log: logr.Discard(),
		Alive: func(_ context.Context, owner string) bool { return alive[owner] }}
	start := time.Now()
	reaper.Check(ctx, start)
	alive["restarting"], alive["deleted"] = false, false
	reaper.Check(ctx, start.Add(time.Minute))
	g.Expect(store.Len()).To(Equal(2), "away for less than the grace period")
	alive["restarting"] = true // its worker is back
	reaper.Check(ctx, start.Add(11*time.Minute))
	g.Expect(store.Len()).To(Equal(1))
	// The owners that still have entries, as their clients see them.
	owners := func() []string {
		var out []string
		for owner, c := range clients {
			keys, err := c.Keys(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			if len(keys) > 0 {
				out = append(out, owner)
			}
		}
		return out
	}
	g.Expect(owners()).To(ConsistOf("restarting"))
	reaper.Check(ctx, start.Add(30*time.Minute))
	g.Expect(owners()).To(ConsistOf("restarting"), "an owner that answers keeps its entries however long")
}
