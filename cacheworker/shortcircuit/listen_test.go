package shortcircuit_test

import (
	"context"
	"io"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/shortcircuit"
)

func TestServeStopsCleanlyWhenTheContextEnds(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	store := newStore(t, t.TempDir())
	data := putBlock(t, store, "blk-1", 100)
	srv := startServer(t, store)

	// An idle client, a client half-way through a request and an open file: none of them
	// may hold the server up.
	idle := dial(t, srv.path)
	f, _, err := idle.Open(ctx, "blk-1")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	half := rawConn(t, srv.path)
	_, err = half.Write([]byte(`{"v":1,`))
	g.Expect(err).NotTo(HaveOccurred())

	start := time.Now()
	g.Expect(srv.stop()).To(Succeed())
	g.Expect(time.Since(start)).To(BeNumerically("<", 2*time.Second))

	_, err = os.Lstat(srv.path)
	g.Expect(err).To(MatchError(fs.ErrNotExist), "the socket file is removed")
	_, err = readUntilClosed(half, 5*time.Second)
	g.Expect(closedByPeer(err)).To(BeTrue(), "connections are closed, got %v", err)
	_, _, err = idle.Open(ctx, "blk-1")
	g.Expect(err).To(HaveOccurred())
	g.Expect(err).NotTo(MatchError(shortcircuit.ErrNotFound))

	got, err := io.ReadAll(f)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(data), "a file already handed out stays readable")
}

func TestAClosedClientRefusesToOpen(t *testing.T) {
	g := NewWithT(t)
	store := newStore(t, t.TempDir())
	putBlock(t, store, "blk-1", 100)
	srv := startServer(t, store)
	c, err := shortcircuit.Dial(context.Background(), srv.path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Close()).To(Succeed())
	g.Expect(c.Close()).To(Succeed(), "closing twice is harmless")
	_, _, err = c.Open(context.Background(), "blk-1")
	g.Expect(err).To(MatchError(shortcircuit.ErrClosed))
}

func TestDialFailsWithoutAServer(t *testing.T) {
	g := NewWithT(t)
	path := socketPath(t)
	_, err := shortcircuit.Dial(context.Background(), path)
	g.Expect(err).To(MatchError(ContainSubstring("connecting to short-circuit socket " + path)))
	g.Expect(strings.Contains(err.Error(), "no such file")).To(BeTrue(), "%v", err)
}
