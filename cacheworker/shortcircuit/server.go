package shortcircuit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/tierstore"
)

// Defaults, in one place.
const (
	// DefaultIdleTimeout is how long a connection may wait for its next request. Clients keep
	// their connection between opens; one that has been quiet this long is closed, and the
	// Client dials again when it next needs a block.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultIOTimeout bounds the rest of a request once its first byte has arrived, and the
	// sending of a response. Both are a few hundred bytes on a local socket, so anything
	// slower is a stuck or hostile client.
	DefaultIOTimeout = 10 * time.Second
)

// acceptBackoffMax caps the pause after an accept that failed for want of resources (such as
// descriptors), which clears only as connections and files are closed.
const acceptBackoffMax = time.Second

// BlockOpener opens a cached block read-only; *tierstore.Store is one. It fails with an
// error matching tierstore.ErrNotFound when the block is absent.
type BlockOpener interface {
	OpenBlock(ctx context.Context, id string) (*os.File, tierstore.BlockInfo, error)
}

// Server hands out descriptors of cached blocks over a Unix socket.
type Server struct {
	opener      BlockOpener
	log         logr.Logger
	metrics     *Metrics
	idleTimeout time.Duration
	ioTimeout   time.Duration
}

// Option configures a Server.
type Option func(*Server)

// WithMetrics counts the server's opens in m. Without it they are counted in metrics nobody
// registers.
func WithMetrics(m *Metrics) Option {
	return func(s *Server) {
		if m != nil {
			s.metrics = m
		}
	}
}

// WithIdleTimeout sets how long a connection may wait for its next request; zero or less
// means DefaultIdleTimeout.
func WithIdleTimeout(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.idleTimeout = d
		}
	}
}

// WithIOTimeout sets how long the rest of a request may take once it has begun, and how long
// sending a response may take; zero or less means DefaultIOTimeout.
func WithIOTimeout(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.ioTimeout = d
		}
	}
}

// NewServer returns a server of the blocks opener opens.
func NewServer(opener BlockOpener, log logr.Logger, opts ...Option) *Server {
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	s := &Server{opener: opener, log: log, idleTimeout: DefaultIdleTimeout, ioTimeout: DefaultIOTimeout}
	for _, o := range opts {
		o(s)
	}
	if s.metrics == nil {
		s.metrics = newMetrics()
	}
	return s
}

// Serve accepts connections on lis and answers their requests until ctx ends. It then closes
// the listener (which removes a socket file Listen created) and every connection, waits for
// the goroutines serving them, and returns nil. It returns an error if accepting fails for
// any other reason, after the same clean-up.
func (s *Server) Serve(ctx context.Context, lis *net.UnixListener) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		_ = lis.Close()
		wg.Wait()
	}()
	// Accept has no context; closing the listener is what ends it.
	wg.Go(func() {
		<-ctx.Done()
		_ = lis.Close()
	})

	backoff := 5 * time.Millisecond
	for {
		c, err := lis.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !outOfResources(err) {
				return fmt.Errorf("accepting short-circuit connections on %s: %w", lis.Addr(), err)
			}
			s.log.Error(err, "accepting a short-circuit connection; pausing", "pause", backoff)
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(2*backoff, acceptBackoffMax)
			continue
		}
		backoff = 5 * time.Millisecond
		wg.Go(func() { s.serveConn(ctx, c) })
	}
}

// outOfResources reports whether accept failed for want of descriptors or memory, which
// closing connections and files clears: the server should pause, not stop.
func outOfResources(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// sleep waits for d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// serveConn answers the requests of one connection until the client closes it, it breaks the
// protocol or a deadline, or ctx ends.
func (s *Server) serveConn(ctx context.Context, c *net.UnixConn) {
	defer func() { _ = c.Close() }()
	// Closing the connection is what interrupts a read or write when the server stops. The
	// wait for the callback keeps it from outliving serveConn.
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(interrupted)
		_ = c.Close()
	})
	defer func() {
		if !stop() {
			<-interrupted
		}
	}()

	cred, err := peerCred(c)
	if err != nil {
		s.log.Error(err, "refusing a short-circuit connection")
		return
	}
	log := s.log.WithValues("pid", cred.Pid, "uid", cred.Uid, "gid", cred.Gid)

	r := bufio.NewReaderSize(c, maxRequest)
	for {
		id, err := s.readRequest(c, r)
		if errors.Is(err, errBadRequest) {
			s.metrics.observe(resultError)
			log.V(1).Info("refusing a malformed short-circuit request; closing the connection", "reason", err.Error())
			if err := s.send(c, encodeError(codeInvalid, err), nil); err != nil {
				log.V(1).Info("sending a short-circuit error", "reason", err.Error())
			}
			return
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				log.V(1).Info("closing a short-circuit connection", "reason", err.Error())
			}
			return
		}
		if err := s.answer(ctx, c, log, id); err != nil {
			log.V(1).Info("closing a short-circuit connection", "reason", err.Error())
			return
		}
	}
}

// peerCred is the connecting process's pid, uid and gid, as the kernel recorded them when it
// connected.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("reading peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("reading peer credentials: %w", err)
	}
	if credErr != nil {
		return nil, fmt.Errorf("reading peer credentials: %w", credErr)
	}
	return cred, nil
}

// readRequest reads the next request and returns its block id. The wait for a request's
// first byte is bounded by the idle timeout and the rest by the I/O timeout, so an idle
// client is let go after a while and a client that stalls mid-request much sooner. Errors
// matching errBadRequest are the client's; others are the connection's.
func (s *Server) readRequest(c *net.UnixConn, r *bufio.Reader) (string, error) {
	if err := c.SetReadDeadline(time.Now().Add(s.idleTimeout)); err != nil {
		return "", fmt.Errorf("setting the idle deadline: %w", err)
	}
	if _, err := r.Peek(1); err != nil {
		return "", fmt.Errorf("waiting for a request: %w", err)
	}
	if err := c.SetReadDeadline(time.Now().Add(s.ioTimeout)); err != nil {
		return "", fmt.Errorf("setting the read deadline: %w", err)
	}
	// The reader's buffer is maxRequest bytes, so a longer line fails with ErrBufferFull
	// instead of growing anything.
	line, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return "", fmt.Errorf("%w: longer than %d bytes", errBadRequest, maxRequest)
	}
	if err != nil {
		return "", fmt.Errorf("reading a request: %w", err)
	}
	return decodeRequest(line[:len(line)-1])
}

// answer opens block id and sends its descriptor, or the reason it could not. Failures to
// open are answers; only a failure to send ends the connection.
func (s *Server) answer(ctx context.Context, c *net.UnixConn, log logr.Logger, id string) error {
	f, info, err := s.open(ctx, id)
	if err != nil {
		code, result := classify(err)
		s.metrics.observe(result)
		if code == codeInternal {
			log.Error(err, "opening a block for a short-circuit read", "block", id)
		} else {
			log.V(1).Info("short-circuit open", "block", id, "result", result, "reason", err.Error())
		}
		return s.send(c, encodeError(code, err), nil)
	}
	// The server's copy of the descriptor is closed once sent: the message in flight holds
	// its own reference to the open file, and the client's copy lives in its own table.
	defer func() { _ = f.Close() }()
	line, err := encodeOK(info.Size, info.Checksum, info.Tier)
	if err != nil {
		s.metrics.observe(resultError)
		log.Error(err, "answering a short-circuit read", "block", id)
		return s.send(c, encodeError(codeInternal, err), nil)
	}
	if err := s.send(c, line, f); err != nil {
		s.metrics.observe(resultError)
		return fmt.Errorf("sending block %s: %w", id, err)
	}
	s.metrics.observe(resultOK)
	log.V(1).Info("short-circuit open", "block", id, "result", resultOK, "tier", info.Tier, "size", info.Size)
	return nil
}

// open validates id before it reaches the opener, so that no opener, however written, is
// asked for a path outside its tiers.
func (s *Server) open(ctx context.Context, id string) (*os.File, tierstore.BlockInfo, error) {
	if err := blockindex.ValidateID(id); err != nil {
		return nil, tierstore.BlockInfo{}, fmt.Errorf("opening block: %w", err)
	}
	f, info, err := s.opener.OpenBlock(ctx, id)
	if err != nil {
		return nil, tierstore.BlockInfo{}, err
	}
	return f, info, nil
}

// classify maps an open's error to the response's code and the metric's result.
func classify(err error) (code, result string) {
	switch {
	case errors.Is(err, tierstore.ErrNotFound):
		return codeNotFound, resultNotFound
	case errors.Is(err, blockindex.ErrInvalidID):
		return codeInvalid, resultError
	default:
		return codeInternal, resultError
	}
}

// send writes one response line, with f's descriptor attached if f is not nil.
func (s *Server) send(c *net.UnixConn, line []byte, f *os.File) error {
	if err := c.SetWriteDeadline(time.Now().Add(s.ioTimeout)); err != nil {
		return fmt.Errorf("setting the write deadline: %w", err)
	}
	if f == nil {
		if _, err := c.Write(line); err != nil {
			return fmt.Errorf("sending a response: %w", err)
		}
		return nil
	}
	// Control, rather than f.Fd, borrows the descriptor without switching the file to
	// blocking mode and keeps f from being closed while the kernel copies it.
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("sending a descriptor: %w", err)
	}
	var n int
	var sendErr error
	if err := rc.Control(func(fd uintptr) {
		n, _, sendErr = c.WriteMsgUnix(line, unix.UnixRights(int(fd)), nil)
	}); err != nil {
		return fmt.Errorf("sending a descriptor: %w", err)
	}
	if sendErr != nil {
		return fmt.Errorf("sending a descriptor: %w", sendErr)
	}
	// A stream socket may take part of the line; the descriptor travelled with the first
	// bytes, the rest follow on their own.
	if n < len(line) {
		if _, err := c.Write(line[n:]); err != nil {
			return fmt.Errorf("sending a response: %w", err)
		}
	}
	return nil
}
