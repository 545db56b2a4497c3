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

// state is the part of a handover that does not change while mounted.
type state struct {
	Dir, Name string
	Init      []byte
	// Agreed is what INIT settled at mount: the flags and sizes the kernel works with.
	Agreed fuse.InitOut
	Nodes  []snapNode
}

// Handover returns new descriptors of the file system's connection, state and open-file
// table, for another process to take it over (Resume) once this one stops (Suspend) or dies.
// The caller closes them. The state is encoded at the first call and kept.
func (s *Server) Handover() (Handover, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == nil {
		f, err := encodeState(state{Dir: s.dir, Name: s.name, Init: s.init, Agreed: s.agreed, Nodes: snapshotNodes(s.fsys.nodes)})
		if err != nil {
			return Handover{}, err
		}
		s.state = f
	}
	var h Handover
	var err error
	if h.FUSE, err = dupFile(s.dev.file); err != nil {
		return Handover{}, err
	}
	if h.State, err = dupFile(s.state); err != nil {
		_ = h.Close()
		return Handover{}, err
	}
	if h.Opens, err = dupFile(s.fsys.opens.file); err != nil {
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
	s.dev.suspend()
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
	opensFile, err := dupFile(h.Opens)
	if err != nil {
		return nil, err
	}
	if fsys.opens, err = mapOpensTable(opensFile, len(nodes)); err != nil {
		_ = opensFile.Close()
		return nil, fmt.Errorf("taking over the FUSE mount at %s: %w", st.Dir, err)
	}
	file, err := adoptDevice(h.FUSE)
	if err != nil {
		_ = fsys.opens.close()
		return nil, err
	}
	s := &Server{dir: st.Dir, name: st.Name, fsys: fsys, init: st.Init, served: make(chan struct{}), stopped: make(chan struct{}), m: m}
	s.dev = &device{file: file, ps: fuse.NewProtocolServer(fsys, mountOptions(cfg, lg)), log: lg}
	agreed, err := s.dev.init(st.Init, false)
	if err != nil {
		_ = file.Close()
		_ = fsys.opens.close()
		return nil, fmt.Errorf("taking over the FUSE mount at %s: %w", st.Dir, err)
	}
	if err := sameSettings(st.Agreed, *agreed); err != nil {
		_ = file.Close()
		_ = fsys.opens.close()
		return nil, fmt.Errorf("taking over the FUSE mount at %s: %w", st.Dir, err)
	}
	s.agreed = *agreed
	if err := s.dev.resend(); err != nil {
		lg.Info("the kernel cannot send again the requests the earlier process took with it (Linux 6.9 or later can); a reader of one of them stays blocked until interrupted",
			"dir", st.Dir, "reason", err.Error())
	}
	s.start(agreed, cfg)
	m.takeovers.Inc()
	lg.V(1).Info("took over a mount", "dir", st.Dir, "files", fsys.files, "bytes", fsys.bytes, "passthrough", fsys.passthrough)
	return s, nil
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

// dupFile returns a new descriptor of f, close-on-exec.
func dupFile(f *os.File) (*os.File, error) {
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
