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
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/callerpod"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/fuseconn"
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
	SealFile(ctx context.Context, req *masterpb.SealFileRequest) (*masterpb.File, error)
	GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error)
	RenameFile(ctx context.Context, from, to string) (*masterpb.File, error)
	DeleteFile(ctx context.Context, path string) (*masterpb.DeleteFileResponse, error)
	ListFiles(ctx context.Context, req *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error)
	Lookup(ctx context.Context, req *masterpb.LookupRequest) (*masterpb.ListEntry, error)
}

// Blocks is the node's tier store.
type Blocks interface {
	Put(ctx context.Context, id string, r io.Reader, size int64, opts tierstore.PutOptions) (tierstore.BlockInfo, error)
	Adopt(ctx context.Context, id, path string, size int64, opts tierstore.PutOptions) (tierstore.BlockInfo, error)
	OpenVerified(ctx context.Context, id string) (io.ReadCloser, tierstore.BlockInfo, error)
	OpenBlock(ctx context.Context, id string) (*os.File, tierstore.BlockInfo, error)
	Delete(ctx context.Context, id string) error
}

// Locations tells the master where blocks are and reads blocks other workers hold
// (locations.Directory).
type Locations interface {
	Commit(ctx context.Context, info tierstore.BlockInfo, path string, offset int64) error
	// CommitRequest is what Commit would send, for sending it with others (SealFile).
	CommitRequest(info tierstore.BlockInfo, path string, offset int64) *masterpb.CommitBlockRequest
	ReadBlock(ctx context.Context, id string) ([]byte, error)
	// Report records a block this worker holds as a copy of a published version, unless the
	// file has another version now.
	Report(ctx context.Context, info tierstore.BlockInfo) error
}

// Checkpoints writes large files through to their Dataset's checkpoint target before their
// seal returns, and reads back from its checkpoint a block no worker holds any more
// (checkpoint.Checkpointer).
type Checkpoints interface {
	// WriteThrough writes f to the under-store if it is above the Dataset's sync write
	// threshold, before it is published, and returns the version written, or "" if it wrote
	// nothing.
	WriteThrough(ctx context.Context, f checkpoint.SealedFile) (string, error)
	// Published says f is published at the master, with what WriteThrough returned.
	Published(ctx context.Context, f checkpoint.SealedFile, written string)
	ReadBack(ctx context.Context, r checkpoint.ReadBackRequest) ([]byte, error)
}

// Config is one output Dataset's mount.
type Config struct {
	// Dataset and Root are the Dataset's name and root folder at the master.
	Dataset, Root string
	Master        Master
	Store         Blocks
	Locations     Locations
	// Checkpoints, when set, writes files above the Dataset's syncWriteThreshold to its
	// under-store before their seal returns, hears of every file published, and reads lost
	// blocks back from their checkpoints. Nil does none of it.
	Checkpoints Checkpoints
	// BlockSize is the TierPool's block size: sealed files are cut into blocks of this size.
	BlockSize int64
	// StagingDir holds the files being written, a staging file per block. Put it on the top
	// tier's file system (tmpfs for MEM), so that writes go to memory and a seal links the
	// files into the tier instead of copying them. Mount empties it.
	StagingDir string
	// Name is shown as the mount's source in /proc/mounts, such as strata:namespace/name.
	Name string
	// MasterTimeout bounds each call to the master; 0 means DefaultMasterTimeout.
	MasterTimeout time.Duration
	// Metrics receives the counts; nil counts nowhere.
	Metrics *Metrics
	// DisableSplice answers reads of sealed files' local blocks by copying them through the
	// worker rather than splicing their files into the FUSE device (benchmarks compare the two).
	DisableSplice bool
	// KeepsReadCopies, when set, says whether a block of the Dataset read from another worker
	// is kept in the top tier and reported as a copy of it (a replica, for a CachePolicy that
	// replicates selectively).
	KeepsReadCopies func(dataset string) bool
	// Callers, when set, says which pod and container a process calling the mount (by PID) runs
	// in: files are sealed as the attempt of that pod (masterpb.File.attempt), and a file sealed
	// by another pod's or container's attempt that is not settled yet may be written again (a
	// Job's retry of a killed pod). Nil, or a caller in no pod, publishes files at once.
	Callers func(pid uint32) (callerpod.Caller, bool)
	// RecoveryPoll is how often, at most, a read that waits for a lost file to be written again
	// asks the master whether it is back; 0 means DefaultRecoveryPoll.
	RecoveryPoll time.Duration
	// OnNewJournal, when set, is given the mount's handover whenever its journal is compacted
	// into a new file: whoever holds the handover (the CSI plugin's file descriptor store) must
	// hold this one instead. An error keeps the old journal in use. The caller keeps h's files.
	OnNewJournal func(h Handover) error
	Log          logr.Logger
}

// DefaultMasterTimeout is Config.MasterTimeout's default.
const DefaultMasterTimeout = 30 * time.Second

// Server is a mounted output Dataset.
type Server struct {
	dir    string
	conn   *fuseconn.Conn
	connID string
	fsys   *fileSystem
	out    *output
	served chan struct{}
	// stopped is closed once this process no longer serves the file system: it ended, or
	// Suspend stopped it.
	stopped chan struct{}
}

// Mount registers the Dataset at the master, lists the files it already has and mounts it,
// writable, at dir (an existing folder) with mount(2), which needs CAP_SYS_ADMIN. The file
// system is served until Unmount, until the kernel ends it, or until Suspend hands it to
// another process (Resume).
func Mount(ctx context.Context, dir string, cfg Config) (*Server, error) {
	cfg, err := checkConfig(dir, cfg)
	if err != nil {
		return nil, err
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
	j, err := newJournal(cfg.Log)
	if err != nil {
		return nil, err
	}
	fsys := newFileSystem(o)
	conn, err := fuseconn.Mount(fuseconn.Spec{Dir: dir, Source: cfg.Name, Protocol: protocolOptions(cfg.Log)}, served(fsys, cfg), cfg.Log)
	if err != nil {
		_ = j.close()
		return nil, fmt.Errorf("mounting output Dataset %s: %w", cfg.Dataset, err)
	}
	fail := func(err error) (*Server, error) {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		_ = conn.Close()
		_ = j.close()
		return nil, fmt.Errorf("serving output Dataset %s at %s: %w", cfg.Dataset, dir, err)
	}
	mount := mountRecord{Dir: dir, Source: cfg.Name, Init: conn.Init(), Agreed: conn.Agreed(), StagingDir: cfg.StagingDir, BlockSize: cfg.BlockSize}
	if fsys.t, err = newTree(j, mount, nodeState{Mode: rootMode, MtimeNs: time.Now().UnixNano()}); err != nil {
		return fail(err)
	}
	o.addSealed(fsys.t, files)
	s := &Server{dir: dir, conn: conn, fsys: fsys, out: o, served: make(chan struct{}), stopped: make(chan struct{})}
	if err := s.start(); err != nil {
		return fail(err)
	}
	if err := fuseconn.DisableFilePolling(dir); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return nil, fmt.Errorf("serving output Dataset %s at %s: %w", cfg.Dataset, dir, err)
	}
	if err := fuseconn.SetReadAhead(dir); err != nil {
		o.log.Info("uncached pages are read in requests of the kernel's default read-ahead", "dir", dir, "reason", err.Error())
	}
	return s, nil
}

// Resume serves an output mount that another process mounted and handed over, typically an
// earlier worker process, killed or not: the kernel's node ids, the files being written (their
// bytes staged in cfg.StagingDir, which must be the mount's) and their open handles carry on,
// and requests the other process read but never answered are asked for again. The caller
// keeps h's files and closes them.
func Resume(ctx context.Context, h Handover, cfg Config) (*Server, error) {
	if h.FUSE == nil || h.Journal == nil {
		return nil, errors.New("an output mount's handover needs the connection and the journal")
	}
	j, records, err := readJournal(h.Journal, cfg.Log)
	if err != nil {
		return nil, err
	}
	mount := records[0].Mount
	if cfg, err = checkConfig(mount.Dir, cfg); err != nil {
		_ = j.close()
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		_ = j.close()
		return nil, fmt.Errorf("taking over the output mount at %s: %w", mount.Dir, err)
	}
	if filepath.Clean(cfg.StagingDir) != filepath.Clean(mount.StagingDir) {
		return fail(fmt.Errorf("its files are staged in %s, not %s", mount.StagingDir, cfg.StagingDir))
	}
	if mount.BlockSize > 0 && mount.BlockSize != cfg.BlockSize {
		// Its files are staged, and were sealed, in blocks of the size it was mounted with.
		cfg.Log.Info("the output mount keeps the block size it was mounted with", "blockSize", mount.BlockSize, "poolBlockSize", cfg.BlockSize)
		cfg.BlockSize = mount.BlockSize
	}
	j.mount.BlockSize = cfg.BlockSize // an older version's journal said nothing: its files are cut now
	o := &output{cfg: cfg, log: cfg.Log}
	fsys := newFileSystem(o)
	if fsys.t, err = replay(j, records, cfg.StagingDir, cfg.BlockSize, o.storedBlockFile(ctx)); err != nil {
		return fail(err)
	}
	o.dropUnknownStaged(fsys.t)
	fsys.generation = uint32(j.starts)
	conn, err := fuseconn.Adopt(h.FUSE, served(fsys, cfg), protocolOptions(cfg.Log), mount.Init, mount.Agreed, cfg.Log.WithValues("dir", mount.Dir))
	if err != nil {
		return fail(err)
	}
	s := &Server{dir: mount.Dir, conn: conn, fsys: fsys, out: o, served: make(chan struct{}), stopped: make(chan struct{})}
	if err := s.start(); err != nil {
		_ = conn.Close()
		return fail(err)
	}
	cfg.Metrics.takeovers.Inc()
	cfg.Log.V(1).Info("took over an output mount", "dir", mount.Dir, "nodes", len(fsys.t.nodes))
	return s, nil
}

// checkConfig validates cfg and fills in its defaults.
func checkConfig(dir string, cfg Config) (Config, error) {
	switch {
	case cfg.Master == nil || cfg.Store == nil || cfg.Locations == nil:
		return cfg, errors.New("an output mount needs the master, the tier store and the block locations")
	case cfg.BlockSize <= 0:
		return cfg, fmt.Errorf("block size must be positive, got %d", cfg.BlockSize)
	case !filepath.IsAbs(dir) || !filepath.IsAbs(cfg.StagingDir):
		return cfg, fmt.Errorf("the mount point %q and the staging folder %q must be absolute paths", dir, cfg.StagingDir)
	case cfg.Dataset == "" || !strings.HasPrefix(cfg.Root, "/"):
		return cfg, fmt.Errorf("an output mount needs the Dataset's name and root at the master, got %q and %q", cfg.Dataset, cfg.Root)
	}
	if cfg.MasterTimeout <= 0 {
		cfg.MasterTimeout = DefaultMasterTimeout
	}
	if cfg.RecoveryPoll <= 0 {
		cfg.RecoveryPoll = DefaultRecoveryPoll
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = newMetrics()
	}
	if cfg.Name == "" {
		cfg.Name = "strata"
	}
	return cfg, nil
}

// storedBlockFile gives the file of a block the tier store holds with length bytes, or "":
// for cutting a file an older version staged whole, and began sealing (see convertWhole).
func (o *output) storedBlockFile(ctx context.Context) func(id string, length int64) string {
	return func(id string, length int64) string {
		f, info, err := o.cfg.Store.OpenBlock(ctx, id)
		if err != nil {
			return ""
		}
		_ = f.Close() // its name is what is wanted
		if info.Size != length {
			return ""
		}
		return f.Name()
	}
}

// served is the file system the connection serves: fsys, hiding that it answers reads from
// files (fuseconn.RangeReader) when the configuration turns splicing off.
func served(fsys *fileSystem, cfg Config) fuse.RawFileSystem {
	if cfg.DisableSplice {
		return fuseconn.Copying(fsys)
	}
	return fsys
}

// protocolOptions are the options of go-fuse's protocol server, the same for a mount and for a
// takeover, since the replayed INIT must negotiate what the first did.
func protocolOptions(lg logr.Logger) *fuse.MountOptions {
	return &fuse.MountOptions{
		MaxWrite:      fuseconn.MaxRead,
		MaxBackground: 12,
		DisableXAttrs: true,
		Logger:        fuseconn.GoFuseLogger(lg),
	}
}

// start serves the connection, as the next process to do so.
func (s *Server) start() error {
	fsys := s.fsys
	fsys.generation++
	fsys.t.j.onNew = s.journalReplaced
	fsys.t.j.compactions = s.out.cfg.Metrics.compactions
	if err := fsys.t.j.append(record{Kind: recStart}); err != nil {
		return err
	}
	m := s.out.cfg.Metrics
	m.mounts.Inc()
	s.conn.Serve(func(ended bool) {
		m.mounts.Dec()
		// This process no longer serves the connection: if suspended, another process may;
		// its own descriptors stay with it (Handover duplicated them).
		_ = s.conn.Close()
		_ = fsys.t.j.close()
		fsys.closeStaged()
		if ended {
			close(s.served)
		}
		close(s.stopped)
	})
	// Only once served: the kernel asks the server for the root's attributes.
	s.connID, _ = fuseconn.ConnectionID(s.dir)
	return nil
}

// journalReplaced hands a compacted journal, with the connection, to whoever holds the
// mount's handover (Config.OnNewJournal).
func (s *Server) journalReplaced(f *os.File) error {
	if s.out.cfg.OnNewJournal == nil {
		return nil
	}
	conn, err := s.conn.Dup()
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	return s.out.cfg.OnNewJournal(Handover{FUSE: conn, Journal: f})
}

// HandOn gives the mount's current handover to Config.OnNewJournal, in turn with compactions,
// so that the holder never ends up holding a journal the mount no longer appends to (as it
// could if it took a Handover while a compaction handed it the next journal).
func (s *Server) HandOn() error {
	if s.out.cfg.OnNewJournal == nil {
		return errors.New("the output mount has no holder to hand its journal on to (Config.OnNewJournal)")
	}
	j := s.fsys.t.j
	j.mu.Lock()
	defer j.mu.Unlock()
	journal, err := fuseconn.DupFile(j.file)
	if err != nil {
		return err
	}
	defer func() { _ = journal.Close() }()
	return s.journalReplaced(journal)
}

// Handover is what another process needs to go on serving an output mount, as files it can
// receive over a Unix socket and that outlive the process that made them: the FUSE connection
// and the journal of the tree.
type Handover struct {
	FUSE, Journal *os.File
}

// Files lists the handover's files in a fixed order, for passing them on.
func (h Handover) Files() []*os.File { return []*os.File{h.FUSE, h.Journal} }

// HandoverFromFiles is the inverse of Files.
func HandoverFromFiles(files []*os.File) (Handover, error) {
	if len(files) != 2 {
		return Handover{}, fmt.Errorf("an output mount's handover is 2 files, got %d", len(files))
	}
	return Handover{FUSE: files[0], Journal: files[1]}, nil
}

// Close closes the handover's files.
func (h Handover) Close() error {
	var errs []error
	for _, f := range h.Files() {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// Handover returns new descriptors of the mount's connection and journal, for another process
// to take it over (Resume) once this one stops (Suspend) or dies. The caller closes them.
func (s *Server) Handover() (Handover, error) {
	fuseFile, err := s.conn.Dup()
	if err != nil {
		return Handover{}, err
	}
	journal, err := s.fsys.t.j.dup()
	if err != nil {
		_ = fuseFile.Close()
		return Handover{}, err
	}
	return Handover{FUSE: fuseFile, Journal: journal}, nil
}

// Suspend stops serving without ending the file system: requests being answered are
// answered, and what the kernel queues after waits for the process that resumes it. The
// mounts stay up only while some process holds the connection (a Handover's FUSE file).
func (s *Server) Suspend() { s.conn.Suspend() }

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

// dropUnknownStaged removes the staging files of a taken-over mount that no file of its tree
// names: made by a create that was killed before it was recorded, and that the kernel sends
// again, or left half made by a restore that was killed (stagedFile.restore).
func (o *output) dropUnknownStaged(t *tree) {
	keep := t.stagedTokens()
	entries, err := os.ReadDir(o.cfg.StagingDir)
	if err != nil {
		o.log.Error(err, "listing the staging folder", "stagingDir", o.cfg.StagingDir)
		return
	}
	for token, names := range stagingNames(entries) {
		for _, name := range names {
			if keep[token] && isBlockStagingName(token, name) {
				continue
			}
			if err := os.Remove(filepath.Join(o.cfg.StagingDir, name)); err != nil {
				o.log.Error(err, "removing a staging file no file names", "name", name)
			}
		}
	}
}

// closeStaged closes this process's staging files; they stay for the process taking over.
func (fsys *fileSystem) closeStaged() {
	fsys.t.mu.RLock()
	nodes := make([]*node, 0, len(fsys.t.nodes))
	for _, n := range fsys.t.nodes {
		nodes = append(nodes, n)
	}
	fsys.t.mu.RUnlock()
	for _, n := range nodes {
		n.mu.Lock()
		if n.staged != nil {
			n.staged.close()
		}
		n.mu.Unlock()
	}
}

// Dir is the mount point.
func (s *Server) Dir() string { return s.dir }

// Done is closed once the kernel has ended the file system: every mount of it is gone. It is
// not closed by Suspend.
func (s *Server) Done() <-chan struct{} { return s.served }

// Stopped is closed once this process no longer serves the file system: the kernel ended it
// (Done), or Suspend stopped serving it.
func (s *Server) Stopped() <-chan struct{} { return s.stopped }

// Files is the number of sealed files the mount started with.
func (s *Server) Files() int { return s.out.startFiles }

// Bytes is their total size.
func (s *Server) Bytes() int64 { return s.out.startBytes }

// Unmount unmounts the folder and waits for the kernel to end the file system until ctx ends:
// fuseconn.ErrStillMounted if a pod's bind mount still holds it (it is served until that goes).
// The kernel releases every open file before it ends the file system, so files still open are
// sealed first.
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

// Abort ends the connection: every mount of it fails with ENOTCONN, and files not yet sealed
// are lost.
func (s *Server) Abort() error { return fuseconn.AbortConnection(s.connID, s.dir) }

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
func (o *output) addSealed(t *tree, files []listedFile) {
	for _, lf := range files {
		parts := strings.Split(lf.rel, "/")
		dir := t.get(rootID)
		for _, p := range parts[:len(parts)-1] {
			child := t.child(dir, p)
			if child == nil {
				child = o.addDir(t, dir, p, time.Unix(0, lf.file.GetModifiedUnixNano()))
			}
			if child == nil || !child.dir {
				o.log.Info("leaving out a file hidden by a file of the same name as its folder", "file", lf.rel)
				dir = nil
				break
			}
			dir = child
		}
		if dir == nil || o.addFile(t, dir, parts[len(parts)-1], lf.file) == nil {
			continue
		}
		o.startFiles++
		o.startBytes += lf.file.GetSize()
	}
}

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
