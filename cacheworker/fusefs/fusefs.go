package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fs"
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
	dir         string
	server      *fuse.Server
	served      chan struct{}
	conn        string
	passthrough bool
	files       int
	bytes       int64
}

// Mount lists the Dataset's objects and mounts them read-only at dir, an existing empty
// folder. It mounts with mount(2) directly, which needs CAP_SYS_ADMIN, and falls back to the
// fusermount helper. The file system is served until Unmount, or until the kernel ends it.
func Mount(ctx context.Context, dir string, cfg Config) (*Server, error) {
	switch {
	case cfg.Objects == nil || cfg.Blocks == nil:
		return nil, errors.New("a FUSE mount needs a lister and a block reader")
	case cfg.BlockSize <= 0:
		return nil, fmt.Errorf("block size must be positive, got %d", cfg.BlockSize)
	case !filepath.IsAbs(dir):
		return nil, fmt.Errorf("mount point %q is not an absolute path", dir)
	}
	lg := cfg.Log
	if lg.GetSink() == nil {
		lg = logr.Discard()
	}
	m := cfg.Metrics
	if m == nil {
		m = newMetrics()
	}
	t, err := buildTree(ctx, cfg.Objects, lg)
	if err != nil {
		return nil, err
	}
	fsys := &fileSystem{blocks: cfg.Blocks, local: cfg.Local, blockSize: cfg.BlockSize, m: m, log: lg, files: t.files, bytes: t.bytes}
	rootTime := t.root.mtime
	if rootTime.IsZero() {
		rootTime = time.Now()
	}
	root := &rootNode{dirNode: dirNode{fsys: fsys, mtime: rootTime}, tree: t, files: map[uint64]*fileNode{}}

	timeout := cacheTimeout
	goFuseLog := log.New(logWriter{lg.WithName("go-fuse")}, "", 0)
	name := cfg.Name
	if name == "" {
		name = "strata"
	}
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			// Pods run as any user; the modes (0444, 0555) say what they may do.
			AllowOther: true,
			// ro: the kernel refuses every change before it reaches us. default_permissions:
			// the kernel checks the modes, as for any file system.
			Options:          []string{"ro", "default_permissions"},
			DirectMount:      true,
			DirectMountFlags: syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV,
			FsName:           name,
			Name:             "strata",
			MaxWrite:         maxRead,
			// No extended attributes: saves the kernel asking for security labels on every lookup.
			DisableXAttrs: true,
			Logger:        goFuseLog,
		},
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
		// Inode numbers are ours (from the listing), and double as FUSE node ids so that
		// rawFS can find a file node from an OPEN request.
		ExternalNodeID: true,
		RootStableAttr: &fs.StableAttr{Ino: fuse.FUSE_ROOT_ID},
		Logger:         goFuseLog,
	}
	if cfg.DisablePassthrough {
		opts.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	raw := &rawFS{RawFileSystem: fs.NewNodeFS(root, opts), fsys: fsys, files: root.files}
	server, err := fuse.NewServer(raw, dir, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mounting FUSE at %s: %w", dir, err)
	}
	raw.enabled = !cfg.DisablePassthrough && server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0
	s := &Server{dir: dir, server: server, served: make(chan struct{}), passthrough: raw.enabled, files: t.files, bytes: t.bytes}
	m.mounts.Inc()
	go func() {
		defer close(s.served)
		defer m.mounts.Dec()
		server.Serve() // returns once the kernel ends the connection
	}()
	if err := server.WaitMount(); err != nil {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Unmount(uctx) // the error that matters is the one returned
		return nil, fmt.Errorf("serving FUSE at %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err == nil {
		// fusectl names a connection by the kernel's device number (major<<20 | minor).
		s.conn = strconv.FormatUint(uint64(unix.Major(st.Dev))<<20|uint64(unix.Minor(st.Dev)), 10)
	}
	lg.V(1).Info("mounted", "dir", dir, "files", t.files, "bytes", t.bytes, "passthrough", raw.enabled)
	return s, nil
}

// Dir is the mount point.
func (s *Server) Dir() string { return s.dir }

// Passthrough reports whether the kernel agreed to FUSE passthrough for this mount.
func (s *Server) Passthrough() bool { return s.passthrough }

// Files is the number of files mounted.
func (s *Server) Files() int { return s.files }

// Bytes is the total size of the files mounted.
func (s *Server) Bytes() int64 { return s.bytes }

// Done is closed once the file system is no longer served: every mount of it is gone.
func (s *Server) Done() <-chan struct{} { return s.served }

// Unmount unmounts the folder, retrying a while if it is busy (ErrBusy after that), and waits
// for the kernel to end the file system until ctx ends. If other mounts of it remain (a pod's
// bind mount), the folder is unmounted but the file system is still served for them: that is
// ErrStillMounted, and Done tells when they are gone. Unmounting again is harmless.
func (s *Server) Unmount(ctx context.Context) error {
	if err := unmount(ctx, s.dir); err != nil {
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
func (s *Server) Abort() error {
	if s.conn == "" {
		return errors.New("the FUSE connection's id is unknown")
	}
	p := filepath.Join("/sys/fs/fuse/connections", s.conn, "abort")
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		return fmt.Errorf("aborting the FUSE connection of %s (is fusectl mounted at /sys/fs/fuse/connections?): %w", s.dir, err)
	}
	return nil
}

// unmount unmounts dir with umount(2), or through fusermount where that is not permitted.
// A folder that is not mounted is fine.
func unmount(ctx context.Context, dir string) error {
	wait := unmountBackoff
	var err error
	for range unmountTries {
		err = unix.Unmount(dir, 0)
		switch {
		case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EPERM):
			return fusermountUnmount(ctx, dir)
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

// fusermountUnmount unmounts dir with the setuid helper, for mounts made without privileges.
func fusermountUnmount(ctx context.Context, dir string) error {
	for _, bin := range []string{"fusermount3", "fusermount"} {
		p, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, p, "-u", dir).CombinedOutput()
		if err != nil {
			msg := strings.TrimSpace(string(out))
			if strings.Contains(msg, "busy") {
				return fmt.Errorf("unmounting %s: %w: %s", dir, ErrBusy, msg)
			}
			return fmt.Errorf("unmounting %s with %s: %w: %s", dir, bin, err, msg)
		}
		return nil
	}
	return fmt.Errorf("unmounting %s: not permitted, and no fusermount helper found", dir)
}

// logWriter passes go-fuse's log lines to logr.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

var _ io.Writer = logWriter{}
