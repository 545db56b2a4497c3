package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/understore"
)

// BlockReader reads whole blocks of a Dataset's files: the read-through cache.
type BlockReader interface {
	// ReadBlock returns block index of file, of the cache's block size (shorter for the last).
	ReadBlock(ctx context.Context, file string, index int64) ([]byte, error)
}

// LocalBlocks opens the copy of a block that a local tier holds, failing if none does.
type LocalBlocks interface {
	OpenBlock(ctx context.Context, file string, index int64) (*os.File, error)
}

// Lister lists a Dataset's objects: its under-store.
type Lister interface {
	List(ctx context.Context, prefix string) iter.Seq2[understore.ObjectInfo, error]
}

// Config is one Dataset's file system.
type Config struct {
	// Objects lists the Dataset's files, once, when it is mounted.
	Objects Lister
	// Blocks reads the files' blocks through the cache.
	Blocks BlockReader
	// BlockSize is the cache's block size.
	BlockSize int64
	// Local, when set, reads blocks that a local tier holds straight from their files (and
	// hands one-block files to the kernel for passthrough) instead of copying whole blocks out
	// of the cache for every read.
	Local LocalBlocks
	// DisablePassthrough keeps every read going through the worker, even where the kernel
	// could read a local block itself.
	DisablePassthrough bool
	// Name is shown as the mount's source in /proc/mounts, such as strata:namespace/name.
	Name string
	// Metrics receives the counts; nil counts nowhere.
	Metrics *Metrics
	// Log receives read failures (once per file and block) and what the mount leaves out.
	Log logr.Logger
}

const (
	// maxRead is the largest read request the kernel is asked to send (go-fuse caps it at
	// what the kernel allows): fewer, larger requests for sequential readers.
	maxRead = 1 << 20
	// cacheTimeout is how long the kernel may trust names, attributes and missing names
	// without asking. The tree cannot change while mounted, so the only limit is how long a
	// refresh (see doc.go) would be allowed to go unseen without notifying the kernel.
	cacheTimeout = 24 * time.Hour
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

// Server is a mounted Dataset.
type Server struct {
	dir    string
	name   string
	fsys   *fileSystem
	dev    *device
	init   []byte       // the kernel's INIT request, replayed by a process taking over
	agreed fuse.InitOut // what INIT settled, which a process taking over must settle too
	served chan struct{}
	// stopped is closed once this process no longer serves the file system: it ended, or
	// Suspend stopped it.
	stopped chan struct{}
	conn    string
	m       *Metrics

	mu    sync.Mutex
	state *os.File // the encoded state, made at the first Handover
}

// Mount lists the Dataset's objects and mounts them read-only at dir, an existing empty
// folder, with mount(2), which needs CAP_SYS_ADMIN. The file system is served until Unmount,
// until the kernel ends it, or until Suspend hands it to another process (Resume).
func Mount(ctx context.Context, dir string, cfg Config) (*Server, error) {
	switch {
	case cfg.Objects == nil || cfg.Blocks == nil:
		return nil, errors.New("a FUSE mount needs a lister and a block reader")
	case cfg.BlockSize <= 0:
		return nil, fmt.Errorf("block size must be positive, got %d", cfg.BlockSize)
	case !filepath.IsAbs(dir):
		return nil, fmt.Errorf("mount point %q is not an absolute path", dir)
	}
	lg, m := logAndMetrics(cfg)
	t, err := buildTree(ctx, cfg.Objects, lg)
	if err != nil {
		return nil, err
	}
	rootTime := t.root.mtime
	if rootTime.IsZero() {
		rootTime = time.Now()
	}
	name := cfg.Name
	if name == "" {
		name = "strata"
	}
	fsys := newFileSystem(t.flatten(rootTime), cfg, m, lg)
	fd, err := openDevice()
	if err != nil {
		return nil, err
	}
	// ro: the kernel refuses every change before it reaches us. default_permissions: the
	// kernel checks the modes, as for any file system. allow_other: pods run as any user.
	opts := fmt.Sprintf("fd=%d,rootmode=%o,user_id=%d,group_id=%d,allow_other,default_permissions,max_read=%d",
		fd, syscall.S_IFDIR, os.Getuid(), os.Getgid(), maxRead)
	if err := unix.Mount(name, dir, "fuse.strata", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		_ = unix.Close(fd)
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("mounting FUSE at %s: %w (the worker needs CAP_SYS_ADMIN: run it privileged)", dir, err)
		}
		return nil, fmt.Errorf("mounting FUSE at %s: %w", dir, err)
	}
	file := deviceFile(fd)
	s := &Server{dir: dir, name: name, fsys: fsys, served: make(chan struct{}), stopped: make(chan struct{}), m: m}
	s.dev = &device{file: file, ps: fuse.NewProtocolServer(fsys, mountOptions(cfg, lg)), log: lg}
	fail := func(err error) (*Server, error) {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		_ = file.Close()
		if fsys.opens != nil {
			_ = fsys.opens.close()
		}
		return nil, fmt.Errorf("serving FUSE at %s: %w", dir, err)
	}
	if s.init, err = s.dev.readInit(10 * time.Second); err != nil {
		return fail(err)
	}
	agreed, err := s.dev.init(s.init, true)
	if err != nil {
		return fail(err)
	}
	s.agreed = *agreed
	if fsys.opens, err = newOpensTable(len(fsys.nodes)); err != nil {
		return fail(err)
	}
	s.start(agreed, cfg)
	if err := disableFilePolling(dir); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return nil, fmt.Errorf("serving FUSE at %s: %w", dir, err)
	}
	lg.V(1).Info("mounted", "dir", dir, "files", fsys.files, "bytes", fsys.bytes, "passthrough", fsys.passthrough)
	return s, nil
}

// pollHackName is the name go-fuse's protocol server answers for itself, whatever the file
// system: a file whose POLL it answers ENOSYS.
const pollHackName = ".go-fuse-epoll-hack"

// disableFilePolling makes the kernel learn, once per connection, that the file system does
// not support poll(2) on its files. Until it has, adding a file of the mount to an epoll set,
// which Go's os.Open does for every file, sends a POLL request from inside epoll_wait; in this
// very process the reader of /dev/fuse waits on that same epoll_wait, and would never read it.
func disableFilePolling(dir string) error {
	fd, err := unix.Open(filepath.Join(dir, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("turning off polling of the mount's files: %w", err)
	}
	defer func() { _ = unix.Close(fd) }()
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	return nil
}

func logAndMetrics(cfg Config) (logr.Logger, *Metrics) {
	lg := cfg.Log
	if lg.GetSink() == nil {
		lg = logr.Discard()
	}
	m := cfg.Metrics
	if m == nil {
		m = newMetrics()
	}
	return lg, m
}

// start serves the connection once INIT is settled, by this process or the one before.
func (s *Server) start(agreed *fuse.InitOut, cfg Config) {
	fsys := s.fsys
	fsys.dev = s.dev
	fsys.passthrough = !cfg.DisablePassthrough && agreed.Flags64()&fuse.CAP_PASSTHROUGH != 0
	fsys.generation = fsys.opens.nextGeneration()
	s.m.mounts.Inc()
	s.dev.serve(func(ended bool) {
		s.m.mounts.Dec()
		// This process no longer serves the connection: if suspended, another process may;
		// its own descriptors stay with it (Handover duplicated them).
		_ = s.dev.close()
		_ = fsys.opens.close()
		s.mu.Lock()
		if s.state != nil {
			_ = s.state.Close()
			s.state = nil
		}
		s.mu.Unlock()
		if ended {
			close(s.served)
		}
		close(s.stopped)
	})
	// Only once served: the kernel asks the server for the root's attributes.
	s.conn, _ = ConnectionID(s.dir)
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
// every mount of it then fails with ENOTCONN.
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

// Stopped is closed once this process no longer serves the file system: the kernel ended it
// (Done), or Suspend stopped serving it.
func (s *Server) Stopped() <-chan struct{} { return s.stopped }

// Dir is the mount point.
func (s *Server) Dir() string { return s.dir }

// Passthrough reports whether the kernel agreed to FUSE passthrough for this mount.
func (s *Server) Passthrough() bool { return s.fsys.passthrough }

// Files is the number of files mounted.
func (s *Server) Files() int { return s.fsys.files }

// Bytes is the total size of the files mounted.
func (s *Server) Bytes() int64 { return s.fsys.bytes }

// Done is closed once the kernel has ended the file system: every mount of it is gone. It is
// not closed by Suspend.
func (s *Server) Done() <-chan struct{} { return s.served }

// Unmount unmounts the folder, retrying a while if it is busy (ErrBusy after that), and waits
// for the kernel to end the file system until ctx ends. If other mounts of it remain (a pod's
// bind mount), the folder is unmounted but the file system is still served for them: that is
// ErrStillMounted, and Done tells when they are gone. Unmounting again is harmless.
func (s *Server) Unmount(ctx context.Context) error {
	if err := UnmountFolder(ctx, s.dir); err != nil {
		return err
	}
	select {
	case <-s.served:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", s.dir, ErrStillMounted)
	}
}

// Abort ends the file system's connection with the kernel, through fusectl: every mount of it
// then fails with ENOTCONN. It is for a worker that shuts down with mounts it cannot unmount.
func (s *Server) Abort() error { return AbortConnection(s.conn, s.dir) }

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
