package shortcircuit_test

import (
	"bytes"
	"context"
	"errors"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/shortcircuit"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/internal/unixsock"
)

// content is the deterministic payload of a block, different for every id.
func content(id string, size int) []byte {
	h := fnv.New64a()
	h.Write([]byte(id))
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(size)))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// newStore opens a real tier store under root with two tiers, mem and disk, of 64 MiB each.
func newStore(tb testing.TB, root string) *tierstore.Store {
	tb.Helper()
	cfg := tierstore.Config{
		IndexDir: filepath.Join(root, "index"),
		Tiers: []tierstore.Tier{
			{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(root, "mem")}, Quota: 64 << 20},
			{Name: "disk", Medium: datav1alpha1.MediumSSD, Dirs: []string{filepath.Join(root, "disk")}, Quota: 64 << 20},
		},
	}
	s, err := tierstore.Open(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("opening the tier store: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// putBlock stores a clean block of size bytes and returns its bytes.
func putBlock(tb testing.TB, s *tierstore.Store, id string, size int) []byte {
	tb.Helper()
	data := content(id, size)
	if _, err := s.Put(context.Background(), id, bytes.NewReader(data), int64(len(data)), tierstore.PutOptions{Clean: true}); err != nil {
		tb.Fatalf("putting block %s: %v", id, err)
	}
	return data
}

// socketPath is a socket path in a fresh directory. Unix socket paths are limited to 108
// bytes, which t.TempDir's names (built from the test's name) soon exceed, hence a short
// directory of its own.
func socketPath(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "sc-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "sc.sock")
}

// server is a running Server on a socket.
type server struct {
	path   string
	cancel context.CancelFunc
	done   chan error // receives Serve's result
}

// startServer serves opener on a new socket until the test ends, and checks that Serve
// returned nil then.
func startServer(tb testing.TB, opener shortcircuit.BlockOpener, opts ...shortcircuit.Option) *server {
	tb.Helper()
	return startServerLogging(tb, opener, logr.Discard(), opts...)
}

func startServerLogging(tb testing.TB, opener shortcircuit.BlockOpener, log logr.Logger, opts ...shortcircuit.Option) *server {
	tb.Helper()
	path := socketPath(tb)
	lis, err := unixsock.Listen(path)
	if err != nil {
		tb.Fatalf("listening: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{path: path, cancel: cancel, done: make(chan error, 1)}
	srv := shortcircuit.NewServer(opener, log, opts...)
	go func() { s.done <- srv.Serve(ctx, lis) }()
	tb.Cleanup(func() {
		if err := s.stop(); err != nil {
			tb.Errorf("serving: %v", err)
		}
	})
	return s
}

// stop cancels Serve and returns its result; it may be called more than once.
func (s *server) stop() error {
	s.cancel()
	select {
	case err, ok := <-s.done:
		if ok {
			close(s.done)
		}
		return err
	case <-time.After(5 * time.Second):
		return errors.New("serve did not return within 5s of its context's end")
	}
}

// dial connects a client that the test closes when it ends.
func dial(tb testing.TB, path string) *shortcircuit.Client {
	tb.Helper()
	c, err := shortcircuit.Dial(context.Background(), path)
	if err != nil {
		tb.Fatalf("dialing: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// rawConn is a connection that speaks the protocol by hand, for requests no Client sends.
func rawConn(tb testing.TB, path string) *net.UnixConn {
	tb.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		tb.Fatalf("dialing: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// readUntilClosed reads what the peer sends until it closes the connection, and returns it
// with the error that ended the read: io.EOF, or ECONNRESET when the peer closed with our
// bytes still unread, which the kernel reports after the bytes it had queued for us.
func readUntilClosed(c *net.UnixConn, within time.Duration) ([]byte, error) {
	if err := c.SetReadDeadline(time.Now().Add(within)); err != nil {
		return nil, err
	}
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
	}
}

// closedByPeer reports whether err is how a read ends when the other side closed.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// openFDs counts this process's open descriptors.
func openFDs(tb testing.TB) int {
	tb.Helper()
	// The directory's own descriptor is in the listing too, in every count alike.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatalf("listing open descriptors: %v", err)
	}
	return len(entries)
}

// logSink collects log lines of every verbosity.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.lines = append(s.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 1})
}

func (s *logSink) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// counter reads strata_worker_short_circuit_opens_total{result} from reg.
func counter(tb testing.TB, reg *prometheus.Registry, result string) float64 {
	tb.Helper()
	families, err := reg.Gather()
	if err != nil {
		tb.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "strata_worker_short_circuit_opens_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	tb.Fatalf("no strata_worker_short_circuit_opens_total{result=%q}", result)
	return 0
}

// countingOpener counts the opens that reach the store.
type countingOpener struct {
	*tierstore.Store
	mu    sync.Mutex
	calls int
}

func (o *countingOpener) OpenBlock(ctx context.Context, id string) (*os.File, tierstore.BlockInfo, error) {
	o.mu.Lock()
	o.calls++
	o.mu.Unlock()
	return o.Store.OpenBlock(ctx, id)
}

func (o *countingOpener) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls
}
