// Package tlsbatch makes a TLS connection send the records of one write in one system call,
// and read records through a buffer, with buffers held only while they hold bytes.
//
// TLS 1.3 carries at most 16 KiB of data per record, and crypto/tls hands each record to the
// socket in a write of its own: a gRPC flush of 32 KiB became two system calls where the
// plaintext transport makes one, and the records came back in reads no larger. On a data plane
// that streams megabytes this doubled the system calls per byte, the largest share of what
// TLS cost beside the cipher (docs/benchmarks.md, "Mutual TLS between components").
package tlsbatch

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"google.golang.org/grpc/credentials"
)

const (
	// writeBatch bounds the bytes held before a write system call: gRPC flushes 32 KiB at a
	// time, which with record headers and tags is a little more.
	writeBatch = 64 << 10
	// readBatch is what one read system call may take from the socket.
	readBatch = 64 << 10
)

// Credentials wraps gRPC transport credentials that speak TLS so that every record of one
// write of the secure connection reaches the socket in one system call, and records are read
// through a buffer that takes whatever the socket holds in one read.
func Credentials(c credentials.TransportCredentials) credentials.TransportCredentials {
	return batchingCredentials{TransportCredentials: c}
}

type batchingCredentials struct {
	credentials.TransportCredentials
}

func (c batchingCredentials) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	batched := newRecordBatcher(raw)
	secure, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, batched)
	if err != nil {
		return nil, nil, err
	}
	return &flushingConn{Conn: secure, records: batched}, info, nil
}

func (c batchingCredentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	batched := newRecordBatcher(raw)
	secure, info, err := c.TransportCredentials.ServerHandshake(batched)
	if err != nil {
		return nil, nil, err
	}
	return &flushingConn{Conn: secure, records: batched}, info, nil
}

func (c batchingCredentials) Clone() credentials.TransportCredentials {
	return batchingCredentials{TransportCredentials: c.TransportCredentials.Clone()}
}

// recordBatcher is the socket under a TLS connection. While a write of the secure connection
// is in flight (holding > 0), the records it produces are gathered and sent together when it
// ends; any other write (the handshake, an alert, a key update answered from the read side)
// goes out at once, behind what was gathered, so the bytes keep their order.
//
// Its buffers are borrowed from a pool only while they hold bytes: a write's batch until it is
// sent, and what one read took from the socket until the TLS connection has read it all. An
// idle connection, whose reader waits for the socket to become readable, holds none. A master
// keeps a connection open to every worker of the cluster, most of them idle between two
// heartbeats: 128 KiB of buffers each made a thousand workers cost the master 128 MiB
// (docs/benchmarks.md, "A thousand workers at the master").
type recordBatcher struct {
	net.Conn

	// The read side, used by the TLS connection's reader alone, one call at a time.
	socket   syscall.RawConn // nil when the connection offers no socket: then reader
	reader   *bufio.Reader
	readBuf  *[]byte // borrowed while unread holds bytes
	unread   []byte
	readDone error // the socket's end or failure, returned once unread is drained

	mu       sync.Mutex
	holding  int
	batchBuf *[]byte // borrowed while batch holds bytes
	batch    []byte
	writeErr error // a failed send: the connection is broken, no later record may overtake
}

// buffers are the batches and reads of every connection, 64 KiB each.
var buffers = sync.Pool{New: func() any { b := make([]byte, max(readBatch, writeBatch)); return &b }}

func newRecordBatcher(raw net.Conn) *recordBatcher {
	b := &recordBatcher{Conn: raw}
	if socket, err := rawConnOf(raw); err == nil {
		b.socket = socket
	} else {
		b.reader = bufio.NewReaderSize(raw, readBatch)
	}
	return b
}

// SyscallConn offers the socket, as the connection it wraps did, so that gRPC's TLS
// credentials pass it on.
func (b *recordBatcher) SyscallConn() (syscall.RawConn, error) { return rawConnOf(b.Conn) }

// Read is only called by the TLS connection's reader, one call at a time.
func (b *recordBatcher) Read(p []byte) (int, error) {
	if b.socket == nil {
		return b.reader.Read(p)
	}
	if len(b.unread) == 0 {
		if b.readDone != nil {
			return 0, b.readDone
		}
		if err := b.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, b.unread)
	b.unread = b.unread[n:]
	if len(b.unread) == 0 {
		buffers.Put(b.readBuf)
		b.readBuf, b.unread = nil, nil
	}
	return n, nil
}

// fill waits until the socket is readable, holding no buffer meanwhile, then takes whatever it
// holds, up to readBatch bytes, in one system call into a borrowed buffer, into unread. The end
// of the stream and a failed read are kept in readDone, for every later read, as the socket
// would answer them; a deadline passed or a closed connection are only returned, as net.Conn
// does (a later read, the deadline moved, may succeed).
func (b *recordBatcher) fill() error {
	var n int
	var readErr error
	err := b.socket.Read(func(fd uintptr) bool {
		buf := buffers.Get().(*[]byte)
		for {
			n, readErr = syscall.Read(int(fd), (*buf)[:readBatch])
			if readErr != syscall.EINTR {
				break
			}
		}
		if n <= 0 {
			buffers.Put(buf)
			n = 0
			// Nothing there yet: the poller waits for the socket, and this runs again.
			return readErr != syscall.EAGAIN
		}
		b.readBuf, b.unread = buf, (*buf)[:n]
		return true
	})
	switch {
	case err != nil: // closed, or past the deadline
		return err
	case readErr != nil:
		b.readDone = &net.OpError{Op: "read", Net: b.LocalAddr().Network(), Source: b.LocalAddr(), Addr: b.RemoteAddr(), Err: os.NewSyscallError("read", readErr)}
	case n == 0:
		b.readDone = io.EOF
	}
	return b.readDone
}

func (b *recordBatcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holding == 0 {
		// Not part of a write of the secure connection: at once, behind what was gathered.
		if err := b.sendLocked(); err != nil {
			return 0, err
		}
		return b.writeLocked(p)
	}
	if len(b.batch)+len(p) > writeBatch {
		if err := b.sendLocked(); err != nil {
			return 0, err
		}
		if len(p) >= writeBatch {
			return b.writeLocked(p)
		}
	}
	if b.batchBuf == nil {
		b.batchBuf = buffers.Get().(*[]byte)
		b.batch = (*b.batchBuf)[:0]
	}
	b.batch = append(b.batch, p...)
	return len(p), nil
}

// writeLocked writes p to the socket; a failure is kept for every later write.
func (b *recordBatcher) writeLocked(p []byte) (int, error) {
	if b.writeErr != nil {
		return 0, b.writeErr
	}
	n, err := b.Conn.Write(p)
	b.writeErr = err
	return n, err
}

// sendLocked writes what was gathered, and gives its buffer back.
func (b *recordBatcher) sendLocked() error {
	if b.batchBuf == nil {
		return b.writeErr
	}
	var err error
	if len(b.batch) > 0 {
		_, err = b.writeLocked(b.batch)
	}
	buffers.Put(b.batchBuf)
	b.batchBuf, b.batch = nil, nil
	return err
}

func (b *recordBatcher) hold() {
	b.mu.Lock()
	b.holding++
	b.mu.Unlock()
}

// release ends a hold and sends what was gathered. A failed send is returned by every later
// write: the connection is broken, and no later record may overtake the ones lost.
func (b *recordBatcher) release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holding--
	return b.sendLocked()
}

// flushingConn is the secure connection gRPC writes to: each of its writes is one batch.
type flushingConn struct {
	net.Conn
	records *recordBatcher
}

func (c *flushingConn) Write(p []byte) (int, error) {
	c.records.hold()
	n, err := c.Conn.Write(p)
	return n, errors.Join(err, c.records.release())
}

// SyscallConn keeps what gRPC's TLS credentials offer (the socket, for its socket options).
func (c *flushingConn) SyscallConn() (syscall.RawConn, error) { return rawConnOf(c.Conn) }

func rawConnOf(c net.Conn) (syscall.RawConn, error) {
	if sc, ok := c.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.New("the connection offers no socket")
}
