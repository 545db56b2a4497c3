// Package tlsbatch makes a TLS connection send the records of one write in one system call,
// and read records through a buffer.
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
	"net"
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
type recordBatcher struct {
	net.Conn
	reader *bufio.Reader

	mu      sync.Mutex
	writer  *bufio.Writer
	holding int
}

func newRecordBatcher(raw net.Conn) *recordBatcher {
	return &recordBatcher{
		Conn:   raw,
		reader: bufio.NewReaderSize(raw, readBatch),
		writer: bufio.NewWriterSize(raw, writeBatch),
	}
}

// SyscallConn offers the socket, as the connection it wraps did, so that gRPC's TLS
// credentials pass it on.
func (b *recordBatcher) SyscallConn() (syscall.RawConn, error) { return rawConnOf(b.Conn) }

// Read is only called by the TLS connection's reader, one call at a time.
func (b *recordBatcher) Read(p []byte) (int, error) { return b.reader.Read(p) }

func (b *recordBatcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.writer.Write(p)
	if err == nil && b.holding == 0 {
		err = b.writer.Flush()
	}
	return n, err
}

func (b *recordBatcher) hold() {
	b.mu.Lock()
	b.holding++
	b.mu.Unlock()
}

// release ends a hold and sends what was gathered. A failed send is kept by the writer and
// returned by every later write: the connection is broken, and no later record may overtake
// the ones lost.
func (b *recordBatcher) release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holding--
	return b.writer.Flush()
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
