package fusefs

import (
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

// The FUSE connection is served here rather than by go-fuse's fuse.Server because a server
// must be able to take over a connection another process set up: go-fuse's server insists on
// answering the kernel's INIT itself, which the kernel sends once per connection. Requests are
// decoded and answered by go-fuse's ProtocolServer; a process taking over replays the INIT the
// kernel sent at mount (kept in the handed-over state) through its own ProtocolServer, so that
// both agree on what was negotiated, and discards the answer.

const (
	// bufferSize holds the largest request, a header and a maxRead write (the kernel
	// refuses reads into a buffer smaller than that, or than 8 KiB), and the largest reply,
	// a header and a maxRead read.
	bufferSize = maxRead + 64<<10
	// notifyResend is FUSE_NOTIFY_RESEND (Linux 6.9): the kernel queues again the requests a
	// server read but never answered, those a killed process took with it.
	notifyResend = 7
	// ioctls of /dev/fuse for passthrough backing files (linux/fuse.h).
	devIocBackingOpen  = 0x4010e501
	devIocBackingClose = 0x4004e502
)

// device is one FUSE connection: /dev/fuse opened non-blocking, so that reads wait in Go's
// poller and a deadline stops them without losing a request (see suspend).
type device struct {
	file *os.File
	ps   *fuse.ProtocolServer
	log  logr.Logger

	// wg counts the reader and the requests being answered.
	wg sync.WaitGroup
	// buffers recycles request and reply buffers, of bufferSize bytes.
	buffers sync.Pool
	mu      sync.Mutex
	ended   bool // the kernel ended the connection (every mount of it is gone)
}

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

// mountOptions are the options of go-fuse's protocol server, the same for a mount and for a
// takeover, since the replayed INIT must negotiate what the first did.
func mountOptions(cfg Config, log logr.Logger) *fuse.MountOptions {
	o := &fuse.MountOptions{
		MaxWrite:      maxRead,
		MaxBackground: 12,
		// No extended attributes: saves the kernel asking for security labels on every lookup.
		DisableXAttrs: true,
		// The kernel may read files ahead, and list folders with their entries' attributes.
		Logger: GoFuseLogger(log),
	}
	if cfg.DisablePassthrough {
		o.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	return o
}

// readInit reads the kernel's first request on a new connection, which must be INIT.
func (d *device) readInit(timeout time.Duration) ([]byte, error) {
	buf := make([]byte, bufferSize)
	if err := d.file.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	defer func() { _ = d.file.SetReadDeadline(time.Time{}) }()
	n, err := d.file.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("waiting for the kernel's INIT: %w", err)
	}
	// A copy: the request is kept for handovers, the buffer is a MiB.
	return append([]byte(nil), buf[:n]...), nil
}

// init answers (or, replaying, only decodes) the INIT request and returns what was agreed.
func (d *device) init(req []byte, reply bool) (*fuse.InitOut, error) {
	out := make([]byte, bufferSize)
	n, st := d.ps.HandleRequest([][]byte{req}, [][]byte{out})
	const header = int(unsafe.Sizeof(fuse.OutHeader{}))
	if !st.Ok() || n < header {
		return nil, fmt.Errorf("answering the kernel's INIT: %v", st)
	}
	h := (*fuse.OutHeader)(unsafe.Pointer(&out[0]))
	if h.Status != 0 {
		return nil, fmt.Errorf("the kernel's INIT was refused: %w", syscall.Errno(-h.Status))
	}
	if reply {
		if _, err := d.file.Write(out[:n]); err != nil {
			return nil, fmt.Errorf("answering the kernel's INIT: %w", err)
		}
	}
	var agreed fuse.InitOut
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&agreed)), unsafe.Sizeof(agreed)), out[header:n])
	return &agreed, nil
}

// resend asks the kernel to queue again the requests a dead server read but never answered.
// Kernels before 6.9 do not know it; their such requests wait for an answer that never comes.
func (d *device) resend() error {
	h := fuse.OutHeader{Length: uint32(unsafe.Sizeof(fuse.OutHeader{})), Status: notifyResend}
	_, err := d.file.Write(unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h)))
	return err
}

// serve starts reading requests; done is called once the reader and every request it
// started have stopped, with whether the kernel ended the connection (rather than suspend).
func (d *device) serve(done func(ended bool)) {
	d.wg.Add(1)
	go d.loop()
	go func() {
		d.wg.Wait()
		d.mu.Lock()
		ended := d.ended
		d.mu.Unlock()
		done(ended)
	}()
}

// loop reads requests and answers each in a goroutine of its own until the kernel ends the
// connection or suspend stops it. Requests run concurrently, as the kernel sends them (reads
// ahead, up to max_background in the background, and any number of callers' own): a read that
// waits for a block from the under-store must not hold up the reads of blocks already cached,
// nor the read-ahead of the next block. One reader is enough: reads of one descriptor take
// turns in Go anyway, and answering is what takes time. A request once read is always
// answered, so stopping never strands one.
func (d *device) loop() {
	defer d.wg.Done()
	for {
		in := d.buffer()
		n, err := d.file.Read(*in)
		switch {
		case err == nil:
			d.wg.Add(1) // while this reader's own count is held, so never racing Wait
			go d.answer(in, n)
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			d.buffers.Put(in)
			return // suspended
		case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.EINTR), errors.Is(err, syscall.EAGAIN):
			d.buffers.Put(in)
			continue // the request was interrupted before it could be read
		case errors.Is(err, syscall.ENODEV):
		default:
			d.log.Error(err, "reading a FUSE request; the file system is no longer served")
		}
		d.buffers.Put(in)
		d.mu.Lock()
		d.ended = true
		d.mu.Unlock()
		return
	}
}

// answer answers the request in (n bytes of it) and gives the buffer back.
func (d *device) answer(in *[]byte, n int) {
	defer d.wg.Done()
	out := d.buffer()
	defer func() { d.buffers.Put(in); d.buffers.Put(out) }()
	w, st := d.ps.HandleRequest([][]byte{(*in)[:n]}, [][]byte{*out})
	if !st.Ok() {
		d.log.Error(syscall.Errno(st), "decoding a FUSE request")
		return
	}
	if w == 0 {
		return // FORGET and the like take no answer
	}
	if _, err := d.file.Write((*out)[:w]); err != nil && !errors.Is(err, syscall.ENOENT) {
		// ENOENT: the request was interrupted meanwhile, and the kernel no longer waits.
		d.log.Error(err, "answering a FUSE request")
	}
}

// buffer returns a buffer for a request or a reply, of bufferSize bytes.
func (d *device) buffer() *[]byte {
	if b, ok := d.buffers.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, bufferSize)
	return &b
}

// suspend stops serving without ending the connection: the reader stops at its next read,
// the requests it read are answered, and what the kernel queues waits for the next server.
func (d *device) suspend() {
	_ = d.file.SetReadDeadline(time.Unix(1, 0))
	d.wg.Wait()
}

// ioctl runs a /dev/fuse ioctl without taking the descriptor out of the poller (File.Fd
// would make it blocking, and deadlines would no longer stop reads).
func (d *device) ioctl(req uintptr, arg unsafe.Pointer) (uintptr, syscall.Errno) {
	raw, err := d.file.SyscallConn()
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

// openBacking registers file as a passthrough backing file and returns its id.
func (d *device) openBacking(file *os.File) (int32, syscall.Errno) {
	m := fuse.BackingMap{Fd: int32(file.Fd())}
	id, errno := d.ioctl(devIocBackingOpen, unsafe.Pointer(&m))
	return int32(id), errno
}

// closeBacking gives a backing id back.
func (d *device) closeBacking(id int32) syscall.Errno {
	_, errno := d.ioctl(devIocBackingClose, unsafe.Pointer(&id))
	return errno
}

func (d *device) close() error { return d.file.Close() }
