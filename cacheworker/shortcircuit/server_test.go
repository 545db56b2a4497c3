package shortcircuit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/shortcircuit"
	"github.com/strata-cache/strata/cacheworker/tierstore"
)

func TestOpenGivesTheWholeBlock(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	store := newStore(t, t.TempDir())
	data := putBlock(t, store, "blk-1", 1<<20+17)
	srv := startServer(t, store)
	c := dial(t, srv.path)

	f, info, err := c.Open(ctx, "blk-1")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	g.Expect(info).To(Equal(shortcircuit.Info{Size: int64(len(data)), Checksum: crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)), Tier: "mem"}))

	got, err := io.ReadAll(f)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(data), "every byte read through the descriptor")
	g.Expect(crc32.Checksum(got, crc32.MakeTable(crc32.Castagnoli))).To(Equal(info.Checksum), "a client can verify the checksum itself")

	_, err = f.WriteAt([]byte("x"), 0)
	g.Expect(err).To(HaveOccurred(), "the descriptor is read-only")
}

func TestOpenFailures(t *testing.T) {
	cases := map[string]struct {
		id           string
		wantNotFound bool
		// reachesStore: whether the request gets as far as the store; invalid ids are
		// refused before anything is opened.
		reachesStore bool
	}{
		"an absent block is reported as ErrNotFound":             {id: "no-such-block", wantNotFound: true, reachesStore: true},
		"an id that climbs out of the tier directory is refused": {id: "../x"},
		"an absolute path is refused":                            {id: "/etc/passwd"},
		"an empty id is refused":                                 {id: ""},
		"an id of a temporary file is refused":                   {id: ".tmp-blk-1"},
		"an id with a newline cannot split the request in two":   {id: "blk-1\n{\"v\":1,\"block\":\"blk-1\"}"},
		"an id longer than block ids may be is refused":          {id: strings.Repeat("a", 300)},
		"an id too long for a request is refused by the client":  {id: strings.Repeat("a", 2000)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			store := newStore(t, t.TempDir())
			data := putBlock(t, store, "blk-1", 100)
			opener := &countingOpener{Store: store}
			srv := startServer(t, opener)
			c := dial(t, srv.path)

			f, _, err := c.Open(ctx, tc.id)
			g.Expect(err).To(HaveOccurred())
			g.Expect(f).To(BeNil())
			g.Expect(err.Error()).To(ContainSubstring("over " + srv.path))
			if tc.wantNotFound {
				g.Expect(err).To(MatchError(shortcircuit.ErrNotFound))
			} else {
				g.Expect(err).To(MatchError(shortcircuit.ErrInvalid))
				g.Expect(err).NotTo(MatchError(shortcircuit.ErrNotFound))
			}
			if tc.reachesStore {
				g.Expect(opener.count()).To(Equal(1))
			} else {
				g.Expect(opener.count()).To(BeZero(), "nothing was opened")
			}

			// The failure was an answer: the same client goes on working.
			f, _, err = c.Open(ctx, "blk-1")
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = f.Close() }()
			got, err := io.ReadAll(f)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(data))
		})
	}
}

func TestManyConcurrentOpensShareOneClient(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	store := newStore(t, t.TempDir())
	blocks := make(map[string][]byte)
	for i := range 8 {
		id := fmt.Sprintf("blk-%d", i)
		blocks[id] = putBlock(t, store, id, 64<<10+i)
	}
	srv := startServer(t, store)
	c := dial(t, srv.path)

	const readers, opens = 16, 25
	errs := make(chan error, readers*opens)
	var wg sync.WaitGroup
	for r := range readers {
		wg.Go(func() {
			for i := range opens {
				id := fmt.Sprintf("blk-%d", (r+i)%len(blocks))
				errs <- readBack(ctx, c, id, blocks[id])
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		g.Expect(err).NotTo(HaveOccurred())
	}
}

// readBack opens id through c, reads it whole and compares it with want.
func readBack(ctx context.Context, c *shortcircuit.Client, id string, want []byte) error {
	f, info, err := c.Open(ctx, id)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	got, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("reading %s: %w", id, err)
	}
	if string(got) != string(want) || info.Size != int64(len(want)) {
		return fmt.Errorf("block %s: read %d bytes (%d announced), want its %d bytes", id, len(got), info.Size, len(want))
	}
	return nil
}

func TestAnOpenFileOutlivesTheBlocksPlace(t *testing.T) {
	cases := map[string]func(ctx context.Context, s *tierstore.Store, id string) error{
		"the block is deleted from the store": func(ctx context.Context, s *tierstore.Store, id string) error {
			return s.Delete(ctx, id)
		},
		"the block moves to a lower tier": func(ctx context.Context, s *tierstore.Store, id string) error {
			return s.Move(ctx, id, "disk")
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			store := newStore(t, t.TempDir())
			data := putBlock(t, store, "blk-1", 256<<10)
			srv := startServer(t, store)
			c := dial(t, srv.path)

			f, _, err := c.Open(ctx, "blk-1")
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = f.Close() }()
			g.Expect(change(ctx, store, "blk-1")).To(Succeed())

			got, err := io.ReadAll(f)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(data), "the open file still reads the block's bytes")
		})
	}
}

func TestADeletedBlockIsNotFoundAfterwards(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	store := newStore(t, t.TempDir())
	putBlock(t, store, "blk-1", 100)
	srv := startServer(t, store)
	c := dial(t, srv.path)

	g.Expect(store.Delete(ctx, "blk-1")).To(Succeed())
	_, _, err := c.Open(ctx, "blk-1")
	g.Expect(err).To(MatchError(shortcircuit.ErrNotFound))
}

func TestMalformedRequestsAreAnsweredAndTheConnectionClosed(t *testing.T) {
	cases := map[string]string{
		"bytes that are not JSON are refused":              "hello, worker\n",
		"JSON that is not a request object is refused":     "[1,2,3]\n",
		"a request with an unknown field is refused":       `{"v":1,"block":"blk-1","offset":4}` + "\n",
		"a request in another protocol version is refused": `{"v":2,"block":"blk-1"}` + "\n",
		"a request without a version is refused":           `{"block":"blk-1"}` + "\n",
		"two requests on one line are refused":             `{"v":1,"block":"blk-1"}{"v":1,"block":"blk-1"}` + "\n",
		"a line longer than the bound is refused":          strings.Repeat("x", 5000) + "\n",
		"binary garbage is refused":                        "\x00\xff\xfe\x01\n",
	}
	store := newStore(t, t.TempDir())
	data := putBlock(t, store, "blk-1", 100)
	srv := startServer(t, store)
	for name, garbage := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			raw := rawConn(t, srv.path)
			_, err := raw.Write([]byte(garbage))
			g.Expect(err).NotTo(HaveOccurred())

			got, err := readUntilClosed(raw, 5*time.Second)
			g.Expect(closedByPeer(err)).To(BeTrue(), "the worker closed the connection, got %v", err)
			var resp struct {
				V     int    `json:"v"`
				Error string `json:"error"`
				Code  string `json:"code"`
			}
			g.Expect(strings.Count(string(got), "\n")).To(Equal(1), "one response line, got %q", got)
			g.Expect(json.Unmarshal(got, &resp)).To(Succeed())
			g.Expect(resp.V).To(Equal(1))
			g.Expect(resp.Code).To(Equal("invalid"))
			g.Expect(resp.Error).NotTo(BeEmpty())

			// Everyone else is still served.
			g.Expect(readBack(context.Background(), dial(t, srv.path), "blk-1", data)).To(Succeed())
		})
	}
}

func TestAWellFormedRequestForABadIDKeepsTheConnection(t *testing.T) {
	g := NewWithT(t)
	store := newStore(t, t.TempDir())
	putBlock(t, store, "blk-1", 100)
	srv := startServer(t, store)
	raw := rawConn(t, srv.path)
	g.Expect(raw.SetDeadline(time.Now().Add(5 * time.Second))).To(Succeed())

	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*4))
	for _, req := range []string{`{"v":1,"block":"../x"}`, `{"v":1,"block":"nope"}`, `{"v":1,"block":"blk-1"}`} {
		_, err := raw.Write([]byte(req + "\n"))
		g.Expect(err).NotTo(HaveOccurred())
		n, oobn, _, _, err := raw.ReadMsgUnix(buf, oob)
		g.Expect(err).NotTo(HaveOccurred(), "the connection is still open for %s", req)
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(msgs).To(HaveLen(1))
			fds, err := unix.ParseUnixRights(&msgs[0])
			g.Expect(err).NotTo(HaveOccurred())
			for _, fd := range fds {
				g.Expect(unix.Close(fd)).To(Succeed())
			}
			g.Expect(fds).To(HaveLen(1))
		}
		g.Expect(string(buf[:n])).To(HaveSuffix("\n"))
		if strings.Contains(req, "blk-1") {
			g.Expect(oobn).To(BeNumerically(">", 0), "a descriptor came with the answer")
			g.Expect(string(buf[:n])).To(ContainSubstring(`"size":100`))
		} else {
			g.Expect(oobn).To(BeZero(), "no descriptor comes with an error")
			g.Expect(string(buf[:n])).To(ContainSubstring(`"code":`))
		}
	}
}

func TestStuckClientsAreLetGo(t *testing.T) {
	cases := map[string]struct {
		opts []shortcircuit.Option
		send string
	}{
		"a client that never sends a request is let go after the idle timeout": {
			opts: []shortcircuit.Option{shortcircuit.WithIdleTimeout(100 * time.Millisecond)},
		},
		"a client that stops in the middle of a request is let go after the I/O timeout": {
			opts: []shortcircuit.Option{shortcircuit.WithIdleTimeout(time.Hour), shortcircuit.WithIOTimeout(100 * time.Millisecond)},
			send: `{"v":1,"blo`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			srv := startServer(t, newStore(t, t.TempDir()), tc.opts...)
			raw := rawConn(t, srv.path)
			if tc.send != "" {
				_, err := raw.Write([]byte(tc.send))
				g.Expect(err).NotTo(HaveOccurred())
			}
			got, err := readUntilClosed(raw, 5*time.Second)
			g.Expect(closedByPeer(err)).To(BeTrue(), "the worker closed the connection, got %v", err)
			g.Expect(got).To(BeEmpty())
		})
	}
}

func TestAClientDialsAgainAfterTheWorkerClosedItsIdleConnection(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	store := newStore(t, t.TempDir())
	data := putBlock(t, store, "blk-1", 100)
	logs := &logSink{}
	srv := startServerLogging(t, store, logs.logger(), shortcircuit.WithIdleTimeout(50*time.Millisecond))
	c := dial(t, srv.path)

	g.Expect(readBack(ctx, c, "blk-1", data)).To(Succeed())
	g.Eventually(logs.text).WithTimeout(5*time.Second).Should(ContainSubstring("i/o timeout"),
		"the worker closes the idle connection")
	g.Expect(readBack(ctx, c, "blk-1", data)).To(Succeed())
}

func TestEachRequestIsLoggedWithThePeersCredentials(t *testing.T) {
	g := NewWithT(t)
	store := newStore(t, t.TempDir())
	data := putBlock(t, store, "blk-1", 100)
	logs := &logSink{}
	srv := startServerLogging(t, store, logs.logger())
	g.Expect(readBack(context.Background(), dial(t, srv.path), "blk-1", data)).To(Succeed())
	g.Expect(srv.stop()).To(Succeed())

	g.Expect(logs.text()).To(SatisfyAll(
		ContainSubstring(`"msg"="short-circuit open"`),
		ContainSubstring(`"block"="blk-1"`),
		ContainSubstring(fmt.Sprintf(`"pid"=%d`, os.Getpid())),
		ContainSubstring(fmt.Sprintf(`"uid"=%d`, os.Getuid())),
	))
}

func TestOpensAreCountedByResult(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	store := newStore(t, t.TempDir())
	data := putBlock(t, store, "blk-1", 100)
	reg := prometheus.NewRegistry()
	m, err := shortcircuit.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	for _, result := range []string{"ok", "not_found", "error"} {
		g.Expect(counter(t, reg, result)).To(BeZero(), "%s is exported before it happens", result)
	}
	srv := startServer(t, store, shortcircuit.WithMetrics(m))
	c := dial(t, srv.path)

	g.Expect(readBack(ctx, c, "blk-1", data)).To(Succeed())
	g.Expect(readBack(ctx, c, "blk-1", data)).To(Succeed())
	_, _, err = c.Open(ctx, "absent")
	g.Expect(err).To(MatchError(shortcircuit.ErrNotFound))
	_, _, err = c.Open(ctx, "../x")
	g.Expect(err).To(MatchError(shortcircuit.ErrInvalid))
	// Stopping the server waits for its connections, so every count is in.
	g.Expect(srv.stop()).To(Succeed())

	g.Expect(counter(t, reg, "ok")).To(BeEquivalentTo(2))
	g.Expect(counter(t, reg, "not_found")).To(BeEquivalentTo(1))
	g.Expect(counter(t, reg, "error")).To(BeEquivalentTo(1))

	_, err = shortcircuit.NewMetrics(reg)
	g.Expect(err).To(HaveOccurred(), "the metrics are registered once per registry")
}

func TestOpensLeakNoDescriptors(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	store := newStore(t, t.TempDir())
	data := putBlock(t, store, "blk-1", 4096)
	srv := startServer(t, store)
	c := dial(t, srv.path)
	// The first open brings the connection and the store's directories to their steady
	// state, so that only what the loop itself opens could change the count.
	g.Expect(readBack(ctx, c, "blk-1", data)).To(Succeed())

	before := openFDs(t)
	for i := range 200 {
		if i%10 == 9 {
			_, _, err := c.Open(ctx, "absent")
			g.Expect(err).To(MatchError(shortcircuit.ErrNotFound))
			continue
		}
		g.Expect(readBack(ctx, c, "blk-1", data)).To(Succeed())
	}
	// Every descriptor the loop received was closed by readBack, and the server closed its
	// copy before answering the next request on the same connection: a leak would add up to
	// 180 here. Not an exact count: descriptors of earlier tests (connections their cleanups
	// close) may go meanwhile, which once made the count one lower.
	g.Expect(openFDs(t)).To(BeNumerically("<=", before))
}
