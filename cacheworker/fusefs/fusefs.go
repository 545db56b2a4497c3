package fusefs

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/fuseconn"
	"github.com/strata-cache/strata/cacheworker/understore"
)

// BlockReader reads whole blocks of a Dataset's files: the read-through cache.
type BlockReader interface {
	// ReadBlock returns block index of version etag of file, of size bytes as listed; the
	// block is of the cache's block size (shorter for the last); understore.ErrChanged if that
	// version is not to be had.
	ReadBlock(ctx context.Context, file, etag string, size, index int64) ([]byte, error)
}

// Prefetcher is what a BlockReader may also do: start reading, in the background, a block a
// sequential reader will want next (cache.Cache.Prefetch).
type Prefetcher interface {
	Prefetch(file, etag string, size, index int64)
}

// LocalBlocks opens the copy of a block of a version of a file that a local tier holds,
// failing if none does.
type LocalBlocks interface {
	OpenBlock(ctx context.Context, file, etag string, index int64) (*os.File, error)
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
	// DisableSplice answers reads of local blocks by copying them through the worker rather
	// than splicing their files into the FUSE device (benchmarks compare the two).
	DisableSplice bool
	// Name is shown as the mount's source in /proc/mounts, such as strata:namespace/name.
	Name string
	// Metrics receives the counts; nil counts nowhere.
	Metrics *Metrics
	// Loads, when set, tells loads from pods' reads (loads.go): shared by a worker's mounts.
	Loads *Loads
	// Log receives read failures (once per file and block) and what the mount leaves out.
	Log logr.Logger
}

const (
	// maxRead is the largest read request the kernel is asked to send.
	maxRead = fuseconn.MaxRead
	// cacheTimeout is how long the kernel may trust names, attributes and missing names
	// without asking. The tree cannot change while mounted, so the only limit is how long a
	// refresh (see doc.go) would be allowed to go unseen without notifying the kernel.
	cacheTimeout = 24 * time.Hour
)

// Server is a mounted Dataset.
type Server struct {
	dir    string
	name   string
	fsys   *fileSystem
	conn   *fuseconn.Conn
	served chan struct{}
	// stopped is closed once this process no longer serves the file system: it ended, or
	// Suspend stopped it.
	stopped chan struct{}
	connID  string // the connection's fusectl name
	m       *Metrics

	mu    sync.Mutex
	state *os.File // the encoded state, made at the first Handover after a change of the tree

	refreshMu sync.Mutex // refreshes take turns
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
	rootTime := t.Root.MTime
	if rootTime.IsZero() {
		rootTime = time.Now()
	}
	name := cfg.Name
	if name == "" {
		name = "strata"
	}
	fsys := newFileSystem(flatten(t, rootTime), cfg, m, lg)
	if fsys.opens, err = newOpensTable(len(fsys.nodes)); err != nil {
		return nil, err
	}
	// ro: the kernel refuses every change before it reaches us.
	conn, err := fuseconn.Mount(fuseconn.Spec{Dir: dir, Source: name, ReadOnly: true, Protocol: protocolOptions(cfg, lg)}, served(fsys, cfg), lg)
	if err != nil {
		_ = fsys.opens.close()
		return nil, err
	}
	s := &Server{dir: dir, name: name, fsys: fsys, conn: conn, served: make(chan struct{}), stopped: make(chan struct{}), m: m}
	s.start(cfg)
	if err := fuseconn.DisableFilePolling(dir); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return nil, fmt.Errorf("serving FUSE at %s: %w", dir, err)
	}
	if err := fuseconn.SetReadAhead(dir); err != nil {
		lg.Info("uncached pages are read in requests of the kernel's default read-ahead", "dir", dir, "reason", err.Error())
	}
	lg.V(1).Info("mounted", "dir", dir, "files", fsys.files, "bytes", fsys.bytes, "passthrough", fsys.passthrough)
	return s, nil
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
func (s *Server) start(cfg Config) {
	fsys := s.fsys
	fsys.conn = s.conn
	agreed := s.conn.Agreed()
	fsys.passthrough = !cfg.DisablePassthrough && agreed.Flags64()&fuse.CAP_PASSTHROUGH != 0
	fsys.generation = fsys.opens.nextGeneration()
	s.m.mounts.Inc()
	s.conn.Serve(func(ended bool) {
		s.m.mounts.Dec()
		// This process no longer serves the connection: if suspended, another process may;
		// its own descriptors stay with it (Handover duplicated them).
		_ = s.conn.Close()
		_ = fsys.opens.close()
		s.mu.Lock()
		if s.state != nil {
			_ = s.state.Close()
			s.state = nil
		}
		s.mu.Unlock()
		if ended {
			fsys.loads.forget(fsys.dataset)
			close(s.served)
		}
		close(s.stopped)
	})
	// Only once served: the kernel asks the server for the root's attributes.
	s.connID, _ = fuseconn.ConnectionID(s.dir)
}

// Stopped is closed once this process no longer serves the file system: the kernel ended it
// (Done), or Suspend stopped serving it.
func (s *Server) Stopped() <-chan struct{} { return s.stopped }

// Dir is the mount point.
func (s *Server) Dir() string { return s.dir }

// Passthrough reports whether the kernel agreed to FUSE passthrough for this mount.
func (s *Server) Passthrough() bool { return s.fsys.passthrough }

// Files is the number of files mounted.
func (s *Server) Files() int { files, _ := s.fsys.counts(); return files }

// Bytes is the total size of the files mounted.
func (s *Server) Bytes() int64 { _, bytes := s.fsys.counts(); return bytes }

// Done is closed once the kernel has ended the file system: every mount of it is gone. It is
// not closed by Suspend.
func (s *Server) Done() <-chan struct{} { return s.served }

// Unmount unmounts the folder, retrying a while if it is busy (fuseconn.ErrBusy after that), and waits
// for the kernel to end the file system until ctx ends. If other mounts of it remain (a pod's
// bind mount), the folder is unmounted but the file system is still served for them: that is
// fuseconn.ErrStillMounted, and Done tells when they are gone. Unmounting again is harmless.
func (s *Server) Unmount(ctx context.Context) error {
	if err := fuseconn.UnmountFolder(ctx, s.dir); err != nil {
		return err
	}
	select {
	case <-s.served:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", s.dir, fuseconn.ErrStillMounted)
	}
}

// Abort ends the file system's connection with the kernel, through fusectl: every mount of it
// then fails with ENOTCONN. It is for a worker that shuts down with mounts it cannot unmount.
func (s *Server) Abort() error { return fuseconn.AbortConnection(s.connID, s.dir) }

// served is what the connection serves: fsys, without its reads from files when the
// configuration turns splicing off.
func served(fsys *fileSystem, cfg Config) fuse.RawFileSystem {
	if cfg.DisableSplice {
		return fuseconn.Copying(fsys)
	}
	return fsys
}

// protocolOptions are the options of go-fuse's protocol server, the same for a mount and for a
// takeover, since the replayed INIT must negotiate what the first did.
func protocolOptions(cfg Config, lg logr.Logger) *fuse.MountOptions {
	o := &fuse.MountOptions{
		MaxWrite:      maxRead,
		MaxBackground: 12,
		// No extended attributes: saves the kernel asking for security labels on every lookup.
		DisableXAttrs: true,
		Logger:        fuseconn.GoFuseLogger(lg),
	}
	if cfg.DisablePassthrough {
		o.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	return o
}
