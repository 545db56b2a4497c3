package tlsbatch_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	"github.com/strata-cache/strata/internal/tlsbatch"
)

// countingConn counts the reads and writes that reach the socket: the batcher reads the
// socket itself (SyscallConn) when it may, else through Read.
type countingConn struct {
	net.Conn
	reads, writes atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

func (c *countingConn) SyscallConn() (syscall.RawConn, error) {
	raw, err := c.Conn.(syscall.Conn).SyscallConn()
	if err != nil {
		return nil, err
	}
	return countingSocket{RawConn: raw, reads: &c.reads}, nil
}

// countingSocket counts the reads that ended (took bytes, or found the end or an error).
type countingSocket struct {
	syscall.RawConn
	reads *atomic.Int64
}

func (s countingSocket) Read(f func(fd uintptr) bool) error {
	return s.RawConn.Read(func(fd uintptr) bool {
		done := f(fd)
		if done {
			s.reads.Add(1)
		}
		return done
	})
}

// socketless is a connection that offers no socket (as an in-memory pipe): the batcher reads
// it through a buffer of its own.
type socketless struct{ net.Conn }

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// pair is a server and a client connection, batched, over TCP on loopback, handshaken, with
// their sockets counting system calls.
type pair struct {
	server, client             net.Conn
	serverSocket, clientSocket *countingConn
	serverInfo                 credentials.AuthInfo
}

func connect(t *testing.T) pair { t.Helper(); return connectOver(t, false) }

// connectOver connects a pair whose client's and server's connections offer no socket when
// hideSockets.
func connectOver(t *testing.T, hideSockets bool) pair {
	t.Helper()
	wrap := func(c *countingConn) net.Conn {
		if hideSockets {
			return socketless{c}
		}
		return c
	}
	ca := pkitest.New(t)
	serverCreds := tlsbatch.Credentials(credentials.NewTLS(ca.Credentials(t, pki.Worker("pool", "node-a")).ServerConfig()))
	clientCfg := ca.Credentials(t, pki.Worker("pool", "node-b")).ClientConfig(pki.RoleWorker)
	clientCfg.ServerName = pki.LocalServerName
	clientCreds := tlsbatch.Credentials(credentials.NewTLS(clientCfg))

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lis.Close() }()
	type accepted struct {
		conn   net.Conn
		socket *countingConn
		info   credentials.AuthInfo
		err    error
	}
	done := make(chan accepted, 1)
	go func() {
		raw, err := lis.Accept()
		if err != nil {
			done <- accepted{err: err}
			return
		}
		socket := &countingConn{Conn: raw}
		conn, info, err := serverCreds.ServerHandshake(wrap(socket))
		done <- accepted{conn: conn, socket: socket, info: info, err: err}
	}()
	raw, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	clientSocket := &countingConn{Conn: raw}
	client, _, err := clientCreds.ClientHandshake(context.Background(), lis.Addr().String(), wrap(clientSocket))
	if err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	a := <-done
	if a.err != nil {
		t.Fatalf("server handshake: %v", a.err)
	}
	t.Cleanup(func() { _ = client.Close(); _ = a.conn.Close() })
	return pair{server: a.conn, client: client, serverSocket: a.socket, clientSocket: clientSocket, serverInfo: a.info}
}

// crypto/tls alone makes a system call per record each way (16 KiB of data at most in each):
// six of each for the six records below.
func TestRecordsTravelInBatches(t *testing.T) {
	// Six full records: few enough for loopback's socket buffers to hold them all, so that the
	// write ends before the first read and the reads find all of them there.
	const size = 6 * 16 << 10
	p := connect(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	writes, reads := p.serverSocket.writes.Load(), p.clientSocket.reads.Load()
	if n, err := p.server.Write(want); err != nil || n != size {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, size)
	}
	got := make([]byte, size)
	if _, err := io.ReadFull(p.client, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the client read other bytes than were written")
	}
	writes, reads = p.serverSocket.writes.Load()-writes, p.clientSocket.reads.Load()-reads
	// The records with their headers and tags fill a batch of 64 KiB and part of another.
	if writes > 2 {
		t.Errorf("one write of %d bytes made %d writes to the socket, want 2", size, writes)
	}
	// Two reads of 64 KiB take them, and perhaps one more for the session ticket the server
	// sent after the handshake, if it had not arrived with the handshake's last read.
	if reads > 3 {
		t.Errorf("%d bytes took %d reads of the socket, want at most 3", size, reads)
	}
}

func TestBatchedConnectionKeepsThePeersIdentity(t *testing.T) {
	p := connect(t)
	info, ok := p.serverInfo.(credentials.TLSInfo)
	if !ok {
		t.Fatalf("the server's AuthInfo is %T, want credentials.TLSInfo", p.serverInfo)
	}
	if len(info.State.PeerCertificates) == 0 {
		t.Fatal("the server saw no client certificate")
	}
	id, err := pki.FromCertificate(info.State.PeerCertificates[0])
	if err != nil || id != pki.Worker("pool", "node-b") {
		t.Fatalf("the client is %v (%v), want %v", id, err, pki.Worker("pool", "node-b"))
	}
}

// Writes from several goroutines (gRPC's writer and a close, say) each arrive whole and in the
// order each goroutine made them.
func TestConcurrentWritesArriveWhole(t *testing.T) {
	for name, hideSockets := range map[string]bool{"over the socket": false, "over a connection without one": true} {
		t.Run(name, func(t *testing.T) { concurrentWritesArriveWhole(t, connectOver(t, hideSockets)) })
	}
}

func concurrentWritesArriveWhole(t *testing.T, p pair) {
	const writers, messages, size = 4, 40, 40 << 10
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for seq := range messages {
				msg := bytes.Repeat([]byte{byte(w*messages + seq)}, size)
				binary.BigEndian.PutUint32(msg[0:], uint32(w))
				binary.BigEndian.PutUint32(msg[4:], uint32(seq))
				if _, err := p.server.Write(msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	next := make([]uint32, writers)
	msg := make([]byte, size)
	for range writers * messages {
		if _, err := io.ReadFull(p.client, msg); err != nil {
			t.Fatal(err)
		}
		w, seq := binary.BigEndian.Uint32(msg[0:]), binary.BigEndian.Uint32(msg[4:])
		if w >= writers || seq != next[w] {
			t.Fatalf("message %d of writer %d arrived when %v were next", seq, w, next)
		}
		next[w]++
		fill := byte(int(w)*messages + int(seq))
		if bytes.Count(msg[8:], []byte{fill}) != size-8 {
			t.Fatalf("message %d of writer %d arrived mixed with other bytes", seq, w)
		}
	}
	wg.Wait()
}

// An idle connection holds no buffer: a master keeps one open to every worker. The reader
// that waits for the next record waits for the socket, not in a buffer.
func TestAnIdleConnectionHoldsNoBuffer(t *testing.T) {
	p := connect(t)
	msg := bytes.Repeat([]byte("x"), 100<<10)
	for range 3 {
		if _, err := p.server.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p.client, msg); err != nil {
			t.Fatal(err)
		}
		if held := tlsbatch.HeldBuffers(p.server) + tlsbatch.HeldBuffers(p.client); held != 0 {
			t.Fatalf("the connections hold %d buffers between messages, want none", held)
		}
	}
	// A reader waiting for the next message: the connection still holds none when it arrives
	// and has been read.
	read := make(chan error, 1)
	go func() { _, err := io.ReadFull(p.client, msg); read <- err }()
	if _, err := p.server.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if held := tlsbatch.HeldBuffers(p.client); held != 0 {
		t.Fatalf("the reader holds %d buffers once it read the message, want none", held)
	}
}

// A read that passed its deadline fails with a timeout; once the deadline moves, reading goes
// on, as on the socket itself (gRPC and crypto/tls set deadlines around handshakes).
func TestAReadPastItsDeadlineCanBeMadeAgain(t *testing.T) {
	p := connect(t)
	buf := make([]byte, 16)
	if err := p.client.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	var netErr net.Error
	if _, err := p.client.Read(buf); !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("a read past its deadline: %v, want a timeout", err)
	}
	if err := p.client.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.server.Write([]byte("after the timeout")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("after the timeout"))
	if _, err := io.ReadFull(p.client, got); err != nil || string(got) != "after the timeout" {
		t.Fatalf("read %q, %v after the deadline moved", got, err)
	}
}
