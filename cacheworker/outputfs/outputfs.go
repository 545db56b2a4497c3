package outputfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"k8s.io/utils/ptr"

	"github.com/strata-cache/strata/cacheworker/fusefs"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/master/masterpb"
)

// SealingDir is the folder, under a Dataset's root at the master, where files are assembled
// while they are sealed; listings leave it out.
const SealingDir = ".strata-sealing"

// Master is the part of the master client an output mount uses.
type Master interface {
	RegisterDataset(ctx context.Context, req *masterpb.RegisterDatasetRequest) (*masterpb.Dataset, error)
	GetDataset(ctx context.Context, req *masterpb.GetDatasetRequest) (*masterpb.Dataset, error)
	CreateFile(ctx context.Context, req *masterpb.CreateFileRequest) (*masterpb.File, error)
	GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error)
	RenameFile(ctx context.Context, from, to string) (*masterpb.File, error)
	DeleteFile(ctx context.Context, path string) (*masterpb.DeleteFileResponse, error)
	ListFiles(ctx context.Context, req *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error)
}

// Blocks is the node's tier store.
type Blocks interface {
	Put(ctx context.Context, id string, r io.Reader, size int64, opts tierstore.PutOptions) (tierstore.BlockInfo, error)
	OpenBlock(ctx context.Context, id string) (*os.File, tierstore.BlockInfo, error)
	Delete(ctx context.Context, id string) error
}

// Locations tells the master where blocks are and reads blocks other workers hold
// (locations.Directory).
type Locations interface {
	Commit(ctx context.Context, info tierstore.BlockInfo, path string, offset int64) error
	ReadBlock(ctx context.Context, id string) ([]byte, error)
}

// Config is one output Dataset's mount.
type Config struct {
	// Dataset and Root are the Dataset's name and root folder at the master.
	Dataset, Root string
	Master        Master
	Store         Blocks
	Locations     Locations
	// BlockSize is the TierPool's block size: sealed files are cut into blocks of this size.
	BlockSize int64
	// StagingDir holds the files being written, one staging file each. Put it on the top tier's
	// file system (tmpfs for MEM), so that writes go to memory. Mount empties it.
	StagingDir string
	// Name is shown as the mount's source in /proc/mounts, such as strata:namespace/name.
	Name string
	// MasterTimeout bounds each call to the master; 0 means DefaultMasterTimeout.
	MasterTimeout time.Duration
	// Metrics receives the counts; nil counts nowhere.
	Metrics *Metrics
	Log     logr.Logger
}

// DefaultMasterTimeout is Config.MasterTimeout's default.
const DefaultMasterTimeout = 30 * time.Second

// rootMode lets pods running as any user create files, as an emptyDir does.
const rootMode = 0o777

// Server is a mounted output Dataset.
type Server struct {
	dir    string
	srv    *fuse.Server
	conn   string
	served chan struct{}
	out    *output
}

// Mount registers the Dataset at the master, lists the files it already has and mounts it,
// writable, at dir (an existing folder) with mount(2), which needs CAP_SYS_ADMIN.
func Mount(ctx context.Context, dir string, cfg Config) (*Server, error) {
	switch {
	case cfg.Master == nil || cfg.Store == nil || cfg.Locations == nil:
		return nil, errors.New("an output mount needs the master, the tier store and the block locations")
	case cfg.BlockSize <= 0:
		return nil, fmt.Errorf("block size must be positive, got %d", cfg.BlockSize)
	case !filepath.IsAbs(dir) || !filepath.IsAbs(cfg.StagingDir):
		return nil, fmt.Errorf("the mount point %q and the staging folder %q must be absolute paths", dir, cfg.StagingDir)
	case cfg.Dataset == "" || !strings.HasPrefix(cfg.Root, "/"):
		return nil, fmt.Errorf("an output mount needs the Dataset's name and root at the master, got %q and %q", cfg.Dataset, cfg.Root)
	}
	if cfg.MasterTimeout <= 0 {
		cfg.MasterTimeout = DefaultMasterTimeout
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = newMetrics()
	}
	if err := resetStaging(cfg.StagingDir, cfg.Log); err != nil {
		return nil, err
	}
	o := &output{cfg: cfg, log: cfg.Log}
	mctx, cancel := context.WithTimeout(ctx, cfg.MasterTimeout)
	defer cancel()
	if _, err := cfg.Master.RegisterDataset(mctx, &masterpb.RegisterDatasetRequest{Name: cfg.Dataset, Root: cfg.Root}); err != nil {
		return nil, fmt.Errorf("registering output Dataset %s at the master: %w", cfg.Dataset, err)
	}
	files, err := o.listSealed(mctx)
	if err != nil {
		return nil, err
	}

	now := time.Now()
	root := &dirNode{o: o, attrs: attrs{mode: rootMode, mtime: now}}
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther: true, DirectMount: true, DirectMountStrict: true,
			FsName: cfg.Name, Name: "strata", MaxWrite: 1 << 20, DisableXAttrs: true,
			// The kernel checks modes and owners, as for any file system.
			Options: []string{"default_permissions"},
			Logger:  fusefs.GoFuseLogger(cfg.Log),
		},
		// Only this process changes the tree the kernel sees (other nodes' files appear at
		// the next mount), so the kernel may trust names and attributes.
		EntryTimeout: ptr.To(time.Minute), AttrTimeout: ptr.To(time.Minute),
		OnAdd: func(ctx context.Context) { o.addSealed(ctx, root, files) },
	}
	rawFS := fs.NewNodeFS(root, opts)
	srv, err := fuse.NewServer(rawFS, dir, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mounting output Dataset %s at %s: %w", cfg.Dataset, dir, err)
	}
	s := &Server{dir: dir, srv: srv, served: make(chan struct{}), out: o}
	go func() {
		srv.Serve()
		close(s.served)
	}()
	if err := srv.WaitMount(); err != nil {
		_ = fusefs.UnmountFolder(context.WithoutCancel(ctx), dir)
		return nil, fmt.Errorf("serving output Dataset %s at %s: %w", cfg.Dataset, dir, err)
	}
	s.conn, _ = fusefs.ConnectionID(dir)
	cfg.Metrics.mounts.Inc()
	go func() { <-s.served; cfg.Metrics.mounts.Dec() }()
	return s, nil
}

// resetStaging makes the staging folder empty: files left there were being written by a
// worker that is gone, whose writers saw their mount end and retry.
func resetStaging(dir string, log logr.Logger) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading the staging folder %s: %w", dir, err)
	}
	if len(entries) > 0 {
		log.Info("discarding files an earlier worker was given but never saw closed; their writers saw the mount end",
			"stagingDir", dir, "files", len(entries))
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("emptying the staging folder %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating the staging folder %s: %w", dir, err)
	}
	return nil
}

// Dir is the mount point.
func (s *Server) Dir() string { return s.dir }

// Done is closed once the kernel has ended the file system: every mount of it is gone.
func (s *Server) Done() <-chan struct{} { return s.served }

// Stopped is Done: a writable mount is never handed to another process.
func (s *Server) Stopped() <-chan struct{} { return s.served }

// Files is the number of sealed files the mount started with.
func (s *Server) Files() int { return s.out.startFiles }

// Bytes is their total size.
func (s *Server) Bytes() int64 { return s.out.startBytes }

// Unmount unmounts the folder and waits for the kernel to end the file system until ctx ends:
// fusefs.ErrStillMounted if a pod's bind mount still holds it (it is served until that goes).
// The kernel releases every open file before it ends the file system, so files still open are
// sealed first.
func (s *Server) Unmount(ctx context.Context) error {
	if err := fusefs.UnmountFolder(ctx, s.dir); err != nil {
		return err
	}
	select {
	case <-s.served:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", s.dir, fusefs.ErrStillMounted)
	}
}

// Abort ends the connection: every mount of it fails with ENOTCONN, and files not yet sealed
// are lost.
func (s *Server) Abort() error { return fusefs.AbortConnection(s.conn, s.dir) }

// output is the state one mount shares between its nodes.
type output struct {
	cfg        Config
	log        logr.Logger
	completion completion

	startFiles int
	startBytes int64
}

// masterPath is the path at the master of rel, a path relative to the Dataset.
func (o *output) masterPath(rel string) string { return o.cfg.Root + "/" + rel }

// masterContext bounds one call to the master.
func (o *output) masterContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), o.cfg.MasterTimeout)
}

// listedFile is a file the master lists, by its path in the Dataset.
type listedFile struct {
	rel  string
	file *masterpb.File
}

// listSealed lists the Dataset's files at the master, leaving out the sealing folder.
func (o *output) listSealed(ctx context.Context) ([]listedFile, error) {
	var files []listedFile
	sealing := o.cfg.Root + "/" + SealingDir + "/"
	after := ""
	for {
		resp, err := o.cfg.Master.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: o.cfg.Root, Recursive: true, StartAfter: after})
		if err != nil {
			return nil, fmt.Errorf("listing output Dataset %s at the master: %w", o.cfg.Dataset, err)
		}
		for _, e := range resp.GetEntries() {
			f := e.GetFile()
			if e.GetDir() || f == nil || strings.HasPrefix(e.GetPath(), sealing) {
				continue
			}
			if !validToken(f.GetClientToken()) {
				o.log.Info("leaving out a file that was not written through an output mount", "file", e.GetPath())
				continue
			}
			files = append(files, listedFile{rel: strings.TrimPrefix(e.GetPath(), o.cfg.Root+"/"), file: f})
		}
		if after = resp.GetNextStartAfter(); after == "" {
			return files, nil
		}
	}
}

// addSealed puts the files the master listed into the tree, as read-only files owned by root.
func (o *output) addSealed(ctx context.Context, root *dirNode, files []listedFile) {
	for _, lf := range files {
		parts := strings.Split(lf.rel, "/")
		dir := root
		for _, p := range parts[:len(parts)-1] {
			child := dir.GetChild(p)
			if child == nil {
				child = o.addDir(ctx, dir, p, time.Unix(0, lf.file.GetModifiedUnixNano()))
			}
			if dir, _ = child.Operations().(*dirNode); dir == nil {
				o.log.Info("leaving out a file hidden by a file of the same name as its folder", "file", lf.rel)
				break
			}
		}
		if dir == nil || o.addFile(ctx, dir, parts[len(parts)-1], lf.file) == nil {
			continue
		}
		o.startFiles++
		o.startBytes += lf.file.GetSize()
	}
}

// BlockID names block index of the file whose token is token.
func BlockID(token string, index int64) string { return fmt.Sprintf("%s-%d", token, index) }

// validToken is a token this package made: 32 lowercase hex digits.
func validToken(t string) bool {
	if len(t) != 32 {
		return false
	}
	for _, c := range t {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
