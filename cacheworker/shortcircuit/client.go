package shortcircuit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/internal/unixsock"
)

// Info describes a block whose descriptor a client received.
type Info struct {
	// Size is the block's length in bytes; the file holds exactly this many.
	Size int64
	// Checksum is the block's CRC-32C (Castagnoli), for clients that verify what they read.
	Checksum uint32
	// Tier is the tier the block was read from, such as mem or nvme.
	Tier string
}

// Client opens blocks through a worker's short-circuit socket. It is safe for concurrent use.
//
// A client keeps one connection and sends one request at a time on it. An open costs the
// worker an open(2) and a sendmsg, tens of microseconds, so serialising them costs little,
// whereas a connection per call would add a socket, a connect, a credentials lookup and a
// server goroutine to every open. Callers that need more opens in parallel than one
// connection gives use several clients.
type Client struct {
	path   string
	dialer net.Dialer

	mu     sync.Mutex
	conn   *net.UnixConn // nil once it failed or was closed by the worker: the next Open dials
	closed bool
	buf    []byte // response line
	oob    []byte // control messages
}

// Dial connects to the short-circuit socket at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	c := &Client{path: path, buf: make([]byte, maxResponse), oob: make([]byte, unix.CmsgSpace(maxFDs*4))}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	return c, nil
}

func (c *Client) dial(ctx context.Context) (*net.UnixConn, error) {
	conn, err := c.dialer.DialContext(ctx, "unix", c.path)
	if err != nil {
		return nil, fmt.Errorf("connecting to short-circuit socket %s: %w", c.path, err)
	}
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("connecting to short-circuit socket %s: got a %T, not a Unix connection", c.path, conn)
	}
	return uc, nil
}

// Open returns block id's file, open read-only, and the block's size, checksum and tier. The
// caller owns the file and closes it; it stays readable if the worker later moves or evicts
// the block. Open fails with an error matching ErrNotFound if the worker does not hold the
// block, and ErrInvalid if the worker refused the request (an invalid id).
//
// If the connection turns out to have been closed by the worker (after an idle timeout or a
// restart), Open dials again and retries once: opening a block has no side effects, so a
// request that may or may not have reached the old connection is safe to send again.
func (c *Client) Open(ctx context.Context, id string) (*os.File, Info, error) {
	f, info, err := c.open(ctx, id)
	if err != nil {
		return nil, Info{}, fmt.Errorf("opening block %s over %s: %w", id, c.path, err)
	}
	return f, info, nil
}

func (c *Client) open(ctx context.Context, id string) (*os.File, Info, error) {
	line, err := encodeRequest(id)
	if err != nil {
		return nil, Info{}, err
	}
	// Checked before anything else, so that a call that is over before it starts does not
	// cost the connection.
	if err := ctx.Err(); err != nil {
		return nil, Info{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, Info{}, ErrClosed
	}
	for attempt := 0; ; attempt++ {
		reused := c.conn != nil
		if !reused {
			conn, err := c.dial(ctx)
			if err != nil {
				return nil, Info{}, err
			}
			c.conn = conn
		}
		f, info, err := c.roundTrip(ctx, id, line)
		var se *serverError
		if err == nil || errors.As(err, &se) {
			return f, info, err
		}
		// After anything but an answer, where the next response would start is unknown.
		_ = c.conn.Close()
		c.conn = nil
		if !reused || attempt > 0 || ctx.Err() != nil || !connectionClosed(err) {
			return nil, Info{}, err
		}
	}
}

// connectionClosed reports whether err says the worker closed the connection, as it does
// after an idle timeout or when it stops.
func connectionClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// roundTrip sends one request and reads its response on c.conn; mu must be held.
func (c *Client) roundTrip(ctx context.Context, id string, line []byte) (*os.File, Info, error) {
	conn := c.conn
	// The deadline in the past is what interrupts the read or write when ctx ends; waiting
	// for the callback keeps it from touching a connection a later call uses.
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(interrupted)
		_ = conn.SetDeadline(time.Unix(1, 0))
	})
	defer func() {
		if !stop() {
			<-interrupted
		}
	}()
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, Info{}, fmt.Errorf("clearing the deadline: %w", err)
	}
	// ctx may have ended before the deadline was cleared, its callback's deadline undone.
	if err := ctx.Err(); err != nil {
		return nil, Info{}, err
	}

	if _, err := conn.Write(line); err != nil {
		return nil, Info{}, ioError(ctx, "sending the request", err)
	}
	h, fds, err := c.readResponse(conn)
	if err != nil {
		return nil, Info{}, ioError(ctx, "reading the response", err)
	}
	return c.accept(id, h, fds)
}

// ioError reports ctx's error rather than the deadline it caused.
func ioError(ctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", what, ctxErr)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// readResponse reads one response line and the descriptors that came with it. On error it
// has closed every descriptor it received.
func (c *Client) readResponse(conn *net.UnixConn) (header, []int, error) {
	var fds []int
	fail := func(err error) (header, []int, error) {
		unixsock.CloseFDs(fds)
		return header{}, nil, err
	}
	n := 0
	for {
		got, oobn, flags, _, err := conn.ReadMsgUnix(c.buf[n:], c.oob)
		if oobn > 0 {
			rights, perr := unixsock.ParseRights(c.oob[:oobn])
			fds = append(fds, rights...)
			if perr != nil {
				return fail(perr)
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return fail(fmt.Errorf("the response carried more than %d descriptors", maxFDs))
		}
		if err != nil {
			return fail(err)
		}
		if got == 0 {
			// ReadMsgUnix reports the end of a stream as an empty read, not io.EOF.
			return fail(io.EOF)
		}
		n += got
		if i := bytes.IndexByte(c.buf[n-got:n], '\n'); i >= 0 {
			if n-got+i != n-1 {
				return fail(errors.New("the worker sent more than one response"))
			}
			break
		}
		if n == len(c.buf) {
			return fail(fmt.Errorf("the response is longer than %d bytes", maxResponse))
		}
	}
	var h header
	if err := json.Unmarshal(c.buf[:n-1], &h); err != nil {
		return fail(fmt.Errorf("decoding the response: %w", err))
	}
	return h, fds, nil
}

// accept turns a decoded response and its descriptors into the result of Open. It closes
// every descriptor it does not return.
func (c *Client) accept(id string, h header, fds []int) (*os.File, Info, error) {
	if h.V != Version {
		unixsock.CloseFDs(fds)
		return nil, Info{}, fmt.Errorf("the worker answered in protocol version %d, this client speaks %d", h.V, Version)
	}
	if h.failed() {
		// An error response carries no descriptor; one that does anyway is not used.
		unixsock.CloseFDs(fds)
		code := h.Code
		if code != codeNotFound && code != codeInvalid {
			code = codeInternal
		}
		return nil, Info{}, &serverError{code: code, msg: h.Error}
	}
	if len(fds) != 1 {
		unixsock.CloseFDs(fds)
		return nil, Info{}, fmt.Errorf("the response carried %d descriptors, not one", len(fds))
	}
	f := os.NewFile(uintptr(fds[0]), "short-circuit block "+id)
	// Blocks are immutable and written whole before they are visible, so the file has
	// exactly the announced size; anything else means the worker sent the wrong descriptor.
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, Info{}, fmt.Errorf("checking the received descriptor: %w", err)
	}
	if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, Info{}, fmt.Errorf("the received descriptor is not a regular file but %v", fi.Mode().Type())
	}
	if fi.Size() != h.Size {
		_ = f.Close()
		return nil, Info{}, fmt.Errorf("the received file has %d bytes, the response announced %d", fi.Size(), h.Size)
	}
	return f, Info{Size: h.Size, Checksum: h.CRC32C, Tier: h.Tier}, nil
}

// Close closes the connection. Files already opened stay open. An Open under way finishes
// first; Opens after Close fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	if err != nil {
		return fmt.Errorf("closing short-circuit connection to %s: %w", c.path, err)
	}
	return nil
}
