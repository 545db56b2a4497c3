package shortcircuit_test

import (
	"context"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/shortcircuit"
)

func TestListen(t *testing.T) {
	cases := map[string]struct {
		// setup prepares path and returns the path to listen on.
		setup   func(t *testing.T, path string) string
		wantErr string
		check   func(g Gomega, path string)
	}{
		"a stale socket left by a process that is gone is replaced": {
			setup: func(t *testing.T, path string) string {
				l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				// As a process that crashed would: the socket file stays, nothing accepts.
				l.SetUnlinkOnClose(false)
				_ = l.Close()
				return path
			},
		},
		"missing parent directories are created, private to owner and group": {
			setup: func(_ *testing.T, path string) string {
				return filepath.Join(filepath.Dir(path), "run", "strata", "sc.sock")
			},
			check: func(g Gomega, path string) {
				fi, err := os.Stat(filepath.Dir(path))
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(fi.Mode().Perm()&^0o750).To(BeZero(), "mode %v", fi.Mode().Perm())
			},
		},
		"a socket a live server accepts on is not taken over": {
			setup: func(t *testing.T, path string) string {
				l, err := shortcircuit.Listen(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = l.Close() })
				return path
			},
			wantErr: "in use",
			check: func(g Gomega, path string) {
				c, err := net.Dial("unix", path)
				g.Expect(err).NotTo(HaveOccurred(), "the live server still has its socket")
				_ = c.Close()
			},
		},
		"a regular file in the way is left alone": {
			setup: func(t *testing.T, path string) string {
				if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
					t.Fatal(err)
				}
				return path
			},
			wantErr: "not removing it",
			check: func(g Gomega, path string) {
				g.Expect(os.ReadFile(path)).To(Equal([]byte("precious")))
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			path := tc.setup(t, socketPath(t))

			lis, err := shortcircuit.Listen(path)
			if tc.check != nil {
				defer tc.check(g, path)
			}
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = lis.Close() }()
			fi, err := os.Lstat(path)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(fi.Mode().Type()).To(Equal(fs.ModeSocket))
			g.Expect(fi.Mode().Perm()).To(Equal(fs.FileMode(0o660)))

			// And it serves.
			store := newStore(t, t.TempDir())
			data := putBlock(t, store, "blk-1", 100)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- shortcircuit.NewServer(store, logr.Discard()).Serve(ctx, lis) }()
			defer func() {
				cancel()
				g.Expect(<-done).To(Succeed())
			}()
			c, err := shortcircuit.Dial(ctx, path)
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = c.Close() }()
			g.Expect(readBack(ctx, c, "blk-1", data)).To(Succeed())
		})
	}
}

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
