package fusefs

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/fuseconn"
)

// Handover is what another process needs to go on serving a mounted file system, as files it
// can receive over a Unix socket (SCM_RIGHTS) and that outlive the process that made them:
// the FUSE connection, whose mounts stay up as long as some process holds it; the state (the
// mount point, the tree with its node ids, the INIT request), written once; and the table of
// open files (see opens.go), shared memory both processes map.
type Handover struct {
	FUSE, State, Opens *os.File
}

// Files lists the handover's files in a fixed order, for passing them on.
func (h Handover) Files() []*os.File { return []*os.File{h.FUSE, h.State, h.Opens} }

// HandoverFromFiles is the inverse of Files.
func HandoverFromFiles(files []*os.File) (Handover, error) {
	if len(files) != 3 {
		return Handover{}, fmt.Errorf("a FUSE handover is 3 files, got %d", len(files))
	}
	return Handover{FUSE: files[0], State: files[1], Opens: files[2]}, nil
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

// state is the part of a handover that only a refresh changes (a refresh makes it anew).
type state struct {
	Dir, Name string
	Init      []byte
	// Agreed is what INIT settled at mount: the flags and sizes the kernel works with.
	Agreed fuse.InitOut
	Nodes  []snapNode
}

// Handover returns new descriptors of the file system's connection, state and open-file
// table, for another process to take it over (Resume) once this one stops (Suspend) or dies.
// The caller closes them. The state is encoded at the first call and kept until a refresh
// changes the tree: a handover made before a refresh does not know its new nodes.
func (s *Server) Handover() (Handover, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == nil {
		s.fsys.treeMu.RLock()
		nodes := snapshotNodes(s.fsys.nodes)
		s.fsys.treeMu.RUnlock()
		f, err := encodeState(state{Dir: s.dir, Name: s.name, Init: s.conn.Init(), Agreed: s.conn.Agreed(), Nodes: nodes})
		if err != nil {
			return Handover{}, err
		}
		s.state = f
	}
	var h Handover
	var err error
	if h.FUSE, err = s.conn.Dup(); err != nil {
		return Handover{}, err
	}
	if h.State, err = fuseconn.DupFile(s.state); err != nil {
		_ = h.Close()
		return Handover{}, err
	}
	if h.Opens, err = fuseconn.DupFile(s.fsys.opens.file); err != nil {
		_ = h.Close()
		return Handover{}, err
	}
	return h, nil
}

// Suspend stops serving without ending the file system: requests being answered are
// answered, and what the kernel queues after waits for the process that resumes it. A reader
// blocks meanwhile rather than failing. The mounts stay up only while some process holds the
// connection (a Handover's FUSE file); if none does, suspending ends them, as exiting would.
func (s *Server) Suspend() {
	s.conn.Suspend()
}

// Resume serves a file system that another process mounted and handed over, typically an
// earlier worker process: the kernel's node ids, open files and negotiated settings carry on,
// and requests the other process read but never answered are asked for again. cfg gives the
// reads (Blocks, Local, BlockSize) and the logs and metrics; its Objects is not used, since
// the tree is the one handed over. The caller keeps h's files and closes them.
func Resume(_ context.Context, h Handover, cfg Config) (*Server, error) {
	switch {
	case cfg.Blocks == nil:
		return nil, errors.New("a FUSE mount needs a block reader")
	case cfg.BlockSize <= 0:
		return nil, fmt.Errorf("block size must be positive, got %d", cfg.BlockSize)
	case h.FUSE == nil || h.State == nil || h.Opens == nil:
		return nil, errors.New("a FUSE handover needs the connection, the state and the table of open files")
	}
	lg, m := logAndMetrics(cfg)
	st, err := decodeState(h.State)
	if err != nil {
		return nil, err
	}
	nodes, err := restoreNodes(st.Nodes)
	if err != nil {
		return nil, fmt.Errorf("taking over the FUSE mount at %s: %w", st.Dir, err)
	}
	fsys := newFileSystem(nodes, cfg, m, lg.WithValues("dir", st.Dir))
	opensFile, err := fuseconn.DupFile(h.Opens)
	if err != nil {
		return nil, err
	}
	if fsys.opens, err = mapOpensTable(opensFile, len(nodes)); err != nil {
		_ = opensFile.Close()
		return nil, fmt.Errorf("taking over the FUSE mount at %s: %w", st.Dir, err)
	}
	conn, err := fuseconn.Adopt(h.FUSE, served(fsys, cfg), protocolOptions(cfg, lg), st.Init, st.Agreed, lg.WithValues("dir", st.Dir))
	if err != nil {
		_ = fsys.opens.close()
		return nil, fmt.Errorf("taking over the FUSE mount at %s: %w", st.Dir, err)
	}
	s := &Server{dir: st.Dir, name: st.Name, fsys: fsys, conn: conn, served: make(chan struct{}), stopped: make(chan struct{}), m: m}
	s.start(cfg)
	m.takeovers.Inc()
	lg.V(1).Info("took over a mount", "dir", st.Dir, "files", fsys.files, "bytes", fsys.bytes, "passthrough", fsys.passthrough)
	return s, nil
}

// encodeState writes st to a new memfd.
func encodeState(st state) (*os.File, error) {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(st); err != nil {
		return nil, fmt.Errorf("encoding the FUSE mount's state: %w", err)
	}
	fd, err := unix.MemfdCreate("strata-fuse-state", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("keeping the FUSE mount's state: %w", err)
	}
	f := os.NewFile(uintptr(fd), "strata-fuse-state")
	if _, err := f.Write(buf.Bytes()); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("keeping the FUSE mount's state: %w", err)
	}
	return f, nil
}

// decodeState reads a state written by encodeState, from its start whatever f's offset.
func decodeState(f *os.File) (state, error) {
	var st state
	if err := gob.NewDecoder(io.NewSectionReader(f, 0, 1<<62)).Decode(&st); err != nil {
		return state{}, fmt.Errorf("reading a FUSE mount's handed-over state: %w", err)
	}
	if st.Dir == "" || len(st.Init) == 0 {
		return state{}, errors.New("a FUSE mount's handed-over state has no mount point or no INIT")
	}
	return st, nil
}
