package shortcircuit_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/shortcircuit"
)

// fakeWorker accepts one connection, reads one request and lets respond answer it. It then
// holds the connection until the client closes it, so that what the client reports is its
// verdict on the answer and not a closed connection.
func fakeWorker(t *testing.T, respond func(c *net.UnixConn)) string {
	t.Helper()
	path := socketPath(t)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return
		}
		respond(c)
		_, _ = io.Copy(io.Discard, c)
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
	})
	return path
}

func TestTheClientRefusesBadAnswers(t *testing.T) {
	const okLine = `{"v":1,"size":0,"crc32c":0,"tier":"mem"}` + "\n"
	cases := map[string]struct {
		line string
		// fds is how many copies of a pipe's write end travel with the line.
		fds  int
		want error
	}{
		"a success header without a descriptor is refused":                               {line: okLine},
		"a success header with two descriptors is refused and both are closed":           {line: okLine, fds: 2},
		"a success header with more descriptors than room is refused and all are closed": {line: okLine, fds: 12},
		"a descriptor that is not a block file is refused":                               {line: okLine, fds: 1},
		"an error header keeps its meaning and a descriptor sent with it is closed": {
			line: `{"v":1,"error":"gone","code":"not_found"}` + "\n", fds: 1, want: shortcircuit.ErrNotFound,
		},
		"an error header with an unknown code is an error of the worker": {
			line: `{"v":1,"error":"quota","code":"over_quota"}` + "\n",
		},
		"a header of another protocol version is refused": {line: `{"v":2,"size":0,"crc32c":0,"tier":"mem"}` + "\n", fds: 1},
		"a header that is not JSON is refused":            {line: "garbage\n", fds: 1},
		"two responses at once are refused":               {line: okLine + okLine, fds: 1},
		"a response longer than the bound is refused":     {line: strings.Repeat("x", 5000), fds: 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			r, w, err := os.Pipe()
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = r.Close() }()
			path := fakeWorker(t, func(c *net.UnixConn) {
				defer func() { _ = w.Close() }()
				var oob []byte
				if tc.fds > 0 {
					fds := make([]int, tc.fds)
					for i := range fds {
						fds[i] = int(w.Fd())
					}
					oob = unix.UnixRights(fds...)
				}
				_, _, _ = c.WriteMsgUnix([]byte(tc.line), oob, nil)
			})
			c := dial(t, path)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()

			f, _, err := c.Open(ctx, "blk-1")
			g.Expect(err).To(HaveOccurred())
			g.Expect(f).To(BeNil())
			g.Expect(err.Error()).To(HavePrefix("opening block blk-1 over " + path + ": "))
			if tc.want != nil {
				g.Expect(err).To(MatchError(tc.want))
			} else {
				g.Expect(errors.Is(err, shortcircuit.ErrNotFound) || errors.Is(err, shortcircuit.ErrInvalid)).To(BeFalse(), "%v", err)
			}

			// Every copy of the write end is closed, the client's included, once the pipe's
			// reader sees its end.
			g.Expect(r.SetReadDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
			_, err = r.Read(make([]byte, 1))
			g.Expect(err).To(MatchError(io.EOF), "no descriptor was leaked")
		})
	}
}

func TestOpenGivesUpWhenTheContextEnds(t *testing.T) {
	g := NewWithT(t)
	path := fakeWorker(t, func(*net.UnixConn) {})
	c := dial(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()

	start := time.Now()
	_, _, err := c.Open(ctx, "blk-1")
	g.Expect(err).To(MatchError(context.DeadlineExceeded))
	g.Expect(time.Since(start)).To(BeNumerically("<", 2*time.Second))

	_, _, err = c.Open(ctx, "blk-1")
	g.Expect(err).To(MatchError(context.DeadlineExceeded), "a context already over fails at once")
}
