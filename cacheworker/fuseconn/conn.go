package fuseconn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

const (
	// MaxRead is the largest read or write request the kernel is asked to send (go-fuse caps
	// it at what the kernel allows): fewer, larger requests for sequential readers and writers.
	MaxRead = 1 << 20
	// MaxReadRequest is the largest READ the kernel is asked for (the mount's max_read): a page
	// short of MaxRead, so that an answer and its header fit a pipe of MaxRead bytes (the
	// largest a worker without CAP_SYS_RESOURCE may make, by default) and can be spliced.
	// Writes stay MaxRead.
	MaxReadRequest = MaxRead - 4096
	// bufferSize holds the largest request, a header and a MaxRead write (the kernel
	// refuses reads into a buffer smaller than that, or than 8 KiB), and the largest reply,
	// a header and a MaxRead read.
	bufferSize = MaxRead + 64<<10
	// notifyResend is FUSE_NOTIFY_RESEND (Linux 6.9): the kernel queues again the requests a
	// server read but never answered, those a killed process took with it.
	notifyResend = 7
	// ioctls of /dev/fuse for passthrough backing files (linux/fuse.h).
	devIocBackingOpen  = 0x4010e501
	devIocBackingClose = 0x4004e502
	// ResendFlag marks the unique id of a request the kernel sends again after
	// FUSE_NOTIFY_RESEND (FUSE_UNIQUE_RESEND): a file system that records what it did per
	// request can tell a request it already carried out from a new one.
	ResendFlag = 1 << 63
)

// Conn is one FUSE connection this process serves: /dev/fuse opened non-blocking, so that
// reads wait in Go's poller and a deadline stops them without losing a request (see Suspend).
type Conn struct {
	file *os.File
	ps   *fuse.ProtocolServer
	log  logr.Logger
	// init is the kernel's INIT request, replayed by a process taking over; agreed is what it
	// settled, which a process taking over must settle too.
	init   []byte
	agreed fuse.InitOut

	// splice answers the READs the file system finds in files (nil: none are).
	splice *splicer

	// wg counts the reader and the requests being answered.
	wg sync.WaitGroup
	// buffers recycles request and reply buffers, of bufferSize bytes.
	buffers sync.Pool
	mu      sync.Mutex
	ended   bool // the kernel ended the connection (every mount of it is gone)
}

// newConn serves fsys on the /dev/fuse descriptor file. READs that fsys finds in files
// (RangeReader) are spliced, unless this host cannot make pipes large enough for them; they
// are then answered the ordinary way, which works everywhere.
func newConn(file *os.File, fsys fuse.RawFileSystem, protocol *fuse.MountOptions, lg logr.Logger) *Conn {
	c := &Conn{file: file, ps: fuse.NewProtocolServer(fsys, protocol), log: lg}
	s, err := newSplicer(file, fsys)
	if err != nil {
		lg.Info("reads are answered by copying, not spliced", "reason", err.Error())
	}
	c.splice = s
	return c
}

// Init is the kernel's INIT request of this connection, for a process taking it over.
func (c *Conn) Init() []byte { return c.init }

// Agreed is what INIT settled: the flags and sizes the kernel works with.
func (c *Conn) Agreed() fuse.InitOut { return c.agreed }

// Dup returns a new descriptor of the connection, for another process to take it over.
func (c *Conn) Dup() (*os.File, error) { return DupFile(c.file) }

// openDevice opens /dev/fuse for a new connection. It is a bare descriptor until mounted:
// the device polls as an error until then, and Go's poller would keep that error (see
// deviceFile).
func openDevice() (int, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, fmt.Errorf("opening /dev/fuse (is the fuse module loaded, and the device in the container?): %w", err)
	}
	return fd, nil
}

// deviceFile makes a mounted /dev/fuse descriptor a pollable file.
func deviceFile(fd int) *os.File { return os.NewFile(uintptr(fd), "/dev/fuse") }

// adoptDevice takes over a /dev/fuse descriptor another process passed.
func adoptDevice(f *os.File) (*os.File, error) {
	fd, err := dupFD(f)
	if err != nil {
		return nil, fmt.Errorf("taking over the FUSE connection: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("taking over the FUSE connection: %w", err)
	}
	return deviceFile(fd), nil
}

// readInit reads the kernel's first request on a new connection, which must be INIT.
func (c *Conn) readInit(timeout time.Duration) ([]byte, error) {
	buf := make([]byte, bufferSize)
	if err := c.file.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	defer func() { _ = c.file.SetReadDeadline(time.Time{}) }()
	n, err := c.file.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("waiting for the kernel's INIT: %w", err)
	}
	// A copy: the request is kept for handovers, the buffer is a MiB.
	return append([]byte(nil), buf[:n]...), nil
}

// answerInit answers (or, replaying, only decodes) the INIT request and returns what was agreed.
func (c *Conn) answerInit(req []byte, reply bool) (*fuse.InitOut, error) {
	out := make([]byte, bufferSize)
	n, st := c.ps.HandleRequest([][]byte{req}, [][]byte{out})
	const header = int(unsafe.Sizeof(fuse.OutHeader{}))
	if !st.Ok() || n < header {
		return nil, fmt.Errorf("answering the kernel's INIT: %v", st)
	}
	h := (*fuse.OutHeader)(unsafe.Pointer(&out[0]))
	if h.Status != 0 {
		return nil, fmt.Errorf("the kernel's INIT was refused: %w", syscall.Errno(-h.Status))
	}
	if reply {
		if _, err := c.file.Write(out[:n]); err != nil {
			return nil, fmt.Errorf("answering the kernel's INIT: %w", err)
		}
	}
	var agreed fuse.InitOut
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&agreed)), unsafe.Sizeof(agreed)), out[header:n])
	return &agreed, nil
}

// resend asks the kernel to queue again the requests a dead server read but never answered.
// Kernels before 6.9 do not know it; their such requests wait for an answer that never comes.
func (c *Conn) resend() error {
	h := fuse.OutHeader{Length: uint32(unsafe.Sizeof(fuse.OutHeader{})), Status: notifyResend}
	_, err := c.file.Write(unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h)))
	return err
}

// Serve starts reading requests; done is called once the reader and every request it
// started have stopped, with whether the kernel ended the connection (rather than Suspend).
func (c *Conn) Serve(done func(ended bool)) {
	c.wg.Add(1)
	go c.loop()
	go func() {
		c.wg.Wait()
		c.mu.Lock()
		ended := c.ended
		c.mu.Unlock()
		done(ended)
	}()
}

// loop reads requests and answers each in a goroutine of its own until the kernel ends the
// connection or Suspend stops it. Requests run concurrently, as the kernel sends them (reads
// ahead, up to max_background in the background, and any number of callers' own): a read that
// waits for a block from the under-store must not hold up the reads of blocks already cached,
// nor the read-ahead of the next block. One reader is enough: reads of one descriptor take
// turns in Go anyway, and answering is what takes time. A request once read is always
// answered, so stopping never strands one.
func (c *Conn) loop() {
	defer c.wg.Done()
	for {
		in := c.buffer()
		n, err := c.file.Read(*in)
		switch {
		case err == nil:
			c.wg.Add(1) // while this reader's own count is held, so never racing Wait
			go c.answer(in, n)
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			c.buffers.Put(in)
			return // suspended
		case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.EINTR), errors.Is(err, syscall.EAGAIN):
			c.buffers.Put(in)
			continue // the request was interrupted before it could be read
		case errors.Is(err, syscall.ENODEV):
		default:
			c.log.Error(err, "reading a FUSE request; the file system is no longer served")
		}
		c.buffers.Put(in)
		c.mu.Lock()
		c.ended = true
		c.mu.Unlock()
		return
	}
}

// answer answers the request in (n bytes of it) and gives the buffer back.
func (c *Conn) answer(in *[]byte, n int) {
	defer c.wg.Done()
	if c.splice != nil {
		answered, err := c.splice.answer((*in)[:n])
		if err != nil {
			c.log.Error(err, "answering a READ from a file; answering it the ordinary way")
		}
		if answered {
			c.buffers.Put(in)
			return
		}
	}
	out := c.buffer()
	defer func() { c.buffers.Put(in); c.buffers.Put(out) }()
	w, st := c.ps.HandleRequest([][]byte{(*in)[:n]}, [][]byte{*out})
	if !st.Ok() {
		c.log.Error(syscall.Errno(st), "decoding a FUSE request")
		return
	}
	if w == 0 {
		return // FORGET and the like take no answer
	}
	if _, err := c.file.Write((*out)[:w]); err != nil && !errors.Is(err, syscall.ENOENT) {
		// ENOENT: the request was interrupted meanwhile, and the kernel no longer waits.
		c.log.Error(err, "answering a FUSE request")
	}
}

// buffer returns a buffer for a request or a reply, of bufferSize bytes.
func (c *Conn) buffer() *[]byte {
	if b, ok := c.buffers.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, bufferSize)
	return &b
}

// Suspend stops serving without ending the connection: the reader stops at its next read,
// the requests it read are answered, and what the kernel queues waits for the next server.
// The mounts stay up only while some process holds the connection (a descriptor from Dup);
// if none does, suspending ends them, as exiting would.
func (c *Conn) Suspend() {
	_ = c.file.SetReadDeadline(time.Unix(1, 0))
	c.wg.Wait()
}

// ioctl runs a /dev/fuse ioctl without taking the descriptor out of the poller (File.Fd
// would make it blocking, and deadlines would no longer stop reads).
func (c *Conn) ioctl(req uintptr, arg unsafe.Pointer) (uintptr, syscall.Errno) {
	raw, err := c.file.SyscallConn()
	if err != nil {
		return 0, syscall.EBADF
	}
	var r uintptr
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) { r, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg)) }); err != nil {
		return 0, syscall.EBADF
	}
	return r, errno
}

// OpenBacking registers file as a passthrough backing file and returns its id.
func (c *Conn) OpenBacking(file *os.File) (int32, syscall.Errno) {
	m := fuse.BackingMap{Fd: int32(file.Fd())}
	id, errno := c.ioctl(devIocBackingOpen, unsafe.Pointer(&m))
	return int32(id), errno
}

// CloseBacking gives a backing id back.
func (c *Conn) CloseBacking(id int32) syscall.Errno {
	_, errno := c.ioctl(devIocBackingClose, unsafe.Pointer(&id))
	return errno
}

// Close closes this process's descriptor of the connection.
func (c *Conn) Close() error {
	if c.splice != nil {
		c.splice.close()
	}
	return c.file.Close()
}

// RequestContext is a context for answering a request that ends when the kernel interrupts it
// (cancel, which go-fuse closes on FUSE_INTERRUPT; nil for none). Call stop when answered.
func RequestContext(cancel <-chan struct{}) (ctx context.Context, stop func()) {
	ctx, cancelCtx := context.WithCancel(context.Background())
	if cancel == nil {
		return ctx, cancelCtx
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-cancel:
			cancelCtx()
		case <-done:
		}
	}()
	return ctx, func() { close(done); cancelCtx() }
}
