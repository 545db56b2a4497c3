package fuseconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

const (
	// initTimeout bounds the wait for the kernel's INIT after mount(2).
	initTimeout = 10 * time.Second
	// unmountTries bounds the attempts to unmount a busy mount; the waits between them double
	// from unmountBackoff (about 0.6 s in all), time for files being closed to be released.
	unmountTries   = 6
	unmountBackoff = 10 * time.Millisecond
)

// ErrBusy means a mount could not be unmounted because something uses it: a process has a
// file open in it or its working directory there.
var ErrBusy = errors.New("busy: a process has a file open in it or its working directory there")

// ErrStillMounted means the folder was unmounted but the file system stays in use through
// other mounts of it (bind mounts into pods); it is served until they go.
var ErrStillMounted = errors.New("still mounted elsewhere, such as a pod's volume: served until that is unmounted")

// Spec says how to mount a file system.
type Spec struct {
	// Dir is the mount point, an existing folder.
	Dir string
	// Source is shown in /proc/mounts, such as strata:namespace/name.
	Source string
	// ReadOnly mounts with "ro": the kernel refuses every change before it reaches the server.
	ReadOnly bool
	// Protocol are the options of go-fuse's protocol server; a process taking over must give
	// the same, since the replayed INIT must negotiate what the first did.
	Protocol *fuse.MountOptions
}

// Mount mounts fsys at spec.Dir with mount(2), which needs CAP_SYS_ADMIN, and answers the
// kernel's INIT. The mount is allow_other (pods run as any user) and default_permissions (the
// kernel checks modes and owners, as for any file system). Serve it next.
func Mount(spec Spec, fsys fuse.RawFileSystem, lg logr.Logger) (*Conn, error) {
	fd, err := openDevice()
	if err != nil {
		return nil, err
	}
	opts := fmt.Sprintf("fd=%d,rootmode=%o,user_id=%d,group_id=%d,allow_other,default_permissions,max_read=%d",
		fd, syscall.S_IFDIR, os.Getuid(), os.Getgid(), MaxReadRequest)
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if spec.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(spec.Source, spec.Dir, "fuse.strata", flags, opts); err != nil {
		_ = unix.Close(fd)
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("mounting FUSE at %s: %w (the worker needs CAP_SYS_ADMIN: run it privileged)", spec.Dir, err)
		}
		return nil, fmt.Errorf("mounting FUSE at %s: %w", spec.Dir, err)
	}
	c := newConn(deviceFile(fd), fsys, spec.Protocol, lg)
	fail := func(err error) (*Conn, error) {
		_ = unix.Unmount(spec.Dir, unix.MNT_DETACH)
		_ = c.file.Close()
		return nil, fmt.Errorf("serving FUSE at %s: %w", spec.Dir, err)
	}
	if c.init, err = c.readInit(initTimeout); err != nil {
		return fail(err)
	}
	agreed, err := c.answerInit(c.init, true)
	if err != nil {
		return fail(err)
	}
	c.agreed = *agreed
	return c, nil
}

// Adopt takes over a connection another process mounted (Mount) and handed over: file is its
// /dev/fuse descriptor (the caller keeps it), init the INIT request the kernel sent at mount,
// atMount what it settled. The INIT is replayed through this process's protocol server, which
// must settle the same, and the kernel is asked to send again the requests the other process
// read but never answered. Serve it next.
func Adopt(file *os.File, fsys fuse.RawFileSystem, protocol *fuse.MountOptions, init []byte, atMount fuse.InitOut, lg logr.Logger) (*Conn, error) {
	f, err := adoptDevice(file)
	if err != nil {
		return nil, err
	}
	c := newConn(f, fsys, protocol, lg)
	c.init = init
	agreed, err := c.answerInit(init, false)
	if err == nil {
		err = sameSettings(atMount, *agreed)
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	c.agreed = *agreed
	if err := c.resend(); err != nil {
		lg.Info("the kernel cannot send again the requests the earlier process took with it (Linux 6.9 or later can); a caller of one of them stays blocked until interrupted",
			"reason", err.Error())
	}
	return c, nil
}

// sameSettings checks that replaying INIT here settled what the kernel agreed to at mount: a
// process built with another go-fuse, or configured otherwise (passthrough on or off), could
// answer INIT differently, and would then misread requests or send replies the kernel does
// not expect.
func sameSettings(atMount, now fuse.InitOut) error {
	if atMount.Flags64() != now.Flags64() || atMount.Minor != now.Minor || atMount.MaxWrite != now.MaxWrite ||
		atMount.MaxPages != now.MaxPages || atMount.MaxReadAhead != now.MaxReadAhead {
		return fmt.Errorf("this process would settle FUSE protocol 7.%d, flags %#x, max write %d, max pages %d, read-ahead %d, "+
			"but the mount has 7.%d, flags %#x, max write %d, max pages %d, read-ahead %d: it was mounted by a worker of another version or configuration, and must be mounted afresh",
			now.Minor, now.Flags64(), now.MaxWrite, now.MaxPages, now.MaxReadAhead,
			atMount.Minor, atMount.Flags64(), atMount.MaxWrite, atMount.MaxPages, atMount.MaxReadAhead)
	}
	return nil
}

// pollHackName is the name go-fuse's protocol server answers for itself, whatever the file
// system: a file whose POLL it answers ENOSYS.
const pollHackName = ".go-fuse-epoll-hack"

// DisableFilePolling makes the kernel learn, once per connection, that the file system does
// not support poll(2) on its files. Until it has, adding a file of the mount to an epoll set,
// which Go's os.Open does for every file, sends a POLL request from inside epoll_wait; in this
// very process the reader of /dev/fuse waits on that same epoll_wait, and would never read it.
// The mount at dir must be served.
func DisableFilePolling(dir string) error {
	fd, err := unix.Open(filepath.Join(dir, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("turning off polling of the mount's files: %w", err)
	}
	defer func() { _ = unix.Close(fd) }()
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	return nil
}

// ReadAhead is how far the kernel reads ahead of a sequential reader of a mount: a whole
// request (MaxReadRequest). The kernel's default for FUSE, 128 KiB, cuts a reader's uncached
// pages into requests of 128 KiB however large its reads; with 1 MiB, BenchmarkReadThroughTheMount
// reads 2.2 to 2.3 GB/s instead of 1.7.
const ReadAhead = MaxReadRequest

// SetReadAhead makes ReadAhead the read-ahead of the mount at dir, which must be served,
// through its device's entry in /sys/class/bdi: /sys must be writable (a privileged worker).
func SetReadAhead(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("finding the device of %s: %w", dir, err)
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte(strconv.Itoa(ReadAhead>>10)), 0); err != nil {
		return fmt.Errorf("setting the read-ahead of %s to %d KiB: %w", dir, ReadAhead>>10, err)
	}
	return nil
}

// ConnectionID is the fusectl name of the FUSE connection mounted at dir, which must be
// served (stat asks the server for the root's attributes).
func ConnectionID(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", fmt.Errorf("finding the FUSE connection of %s: %w", dir, err)
	}
	// fusectl names a connection by the kernel's device number (major<<20 | minor).
	return strconv.FormatUint(uint64(unix.Major(st.Dev))<<20|uint64(unix.Minor(st.Dev)), 10), nil
}

// AbortConnection ends the FUSE connection conn (see ConnectionID) of the mount at dir:
// every mount of it then fails with ENOTCONN. It is for a worker that shuts down with mounts
// it cannot unmount.
func AbortConnection(conn, dir string) error {
	if conn == "" {
		return errors.New("the FUSE connection's id is unknown")
	}
	p := filepath.Join("/sys/fs/fuse/connections", conn, "abort")
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		return fmt.Errorf("aborting the FUSE connection of %s (is fusectl mounted at /sys/fs/fuse/connections?): %w", dir, err)
	}
	return nil
}

// UnmountFolder unmounts dir with umount(2), retrying a while if it is busy (ErrBusy after
// that). A folder that is not mounted is fine.
func UnmountFolder(ctx context.Context, dir string) error {
	wait := unmountBackoff
	var err error
	for range unmountTries {
		err = unix.Unmount(dir, 0)
		switch {
		case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EPERM):
			return fmt.Errorf("unmounting %s: %w (the worker needs CAP_SYS_ADMIN: run it privileged)", dir, err)
		case !errors.Is(err, unix.EBUSY):
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("unmounting %s: %w (%w)", dir, ErrBusy, ctx.Err())
		}
		wait *= 2
	}
	return fmt.Errorf("unmounting %s: %w", dir, ErrBusy)
}

// DupFile returns a new descriptor of f, close-on-exec.
func DupFile(f *os.File) (*os.File, error) {
	fd, err := dupFD(f)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// dupFD duplicates f's descriptor without f.Fd, which on a pollable file (the non-blocking
// /dev/fuse) would clear O_NONBLOCK for every descriptor of it.
func dupFD(f *os.File) (int, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var nfd int
	var derr error
	if err := raw.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return 0, err
	}
	if derr != nil {
		return 0, fmt.Errorf("duplicating %s: %w", f.Name(), derr)
	}
	return nfd, nil
}

// logWriter passes go-fuse's log lines to logr.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

var _ io.Writer = logWriter{}

// GoFuseLogger passes go-fuse's log lines to lg.
func GoFuseLogger(lg logr.Logger) *log.Logger {
	return log.New(logWriter{lg.WithName("go-fuse")}, "", 0)
}
