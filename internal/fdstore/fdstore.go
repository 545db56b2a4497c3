// Package fdstore keeps open files for processes that may restart: a process puts files
// under a key with some bytes of its own (what it needs to use them again), and its successor
// gets them back after it restarted. The CSI node plugin runs the store and the workers use
// it for their FUSE connections: a FUSE mount stays up as long as some process holds its
// /dev/fuse descriptor, so a worker's mounts outlive the worker (see fusefs.Handover).
//
// The protocol, over a Unix stream socket, is one request and one answer per connection, each
// a JSON line; the files of a put or of a get's answer travel as SCM_RIGHTS with the line.
// Entries are grouped by owner (a worker's pool), so that the workers of several pools on a
// node share one store without seeing each other's entries. The store keeps entries in memory
// only: the bytes may hold credentials, and a store that restarts is refilled by its clients
// (Client.Keys tells a client what the store lacks).
package fdstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/internal/periodic"
	"github.com/strata-cache/strata/internal/unixsock"
)

const (
	// maxMessage bounds a request or an answer, bytes and files' line included.
	maxMessage = 4 << 20
	// maxFiles bounds the files of one entry; the kernel passes at most 253 per message.
	maxFiles = 16
	// callTimeout bounds a call that has no deadline of its own.
	callTimeout = 10 * time.Second
)

// namePattern is what owners and keys may be: they are compared, never used as paths, but
// bounding them keeps log lines and memory sane.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,252}$`)

type request struct {
	Op    string `json:"op"` // put, get, keys, drop
	Owner string `json:"owner"`
	Key   string `json:"key,omitempty"`
	Data  []byte `json:"data,omitempty"`
}

type answer struct {
	Error string   `json:"error,omitempty"`
	Keys  []string `json:"keys,omitempty"`
	Data  []byte   `json:"data,omitempty"`
	Found bool     `json:"found,omitempty"`
}

// SocketPath is where the store listens, given the host folder of the node's worker sockets
// (/run/strata): a folder of its own, so that workers mount only it, not each other's sockets.
func SocketPath(socketRoot string) string {
	return filepath.Join(socketRoot, "fdstore", "fdstore.sock")
}

// ErrNotFound is a get of a key the store does not hold.
var ErrNotFound = errors.New("not in the file descriptor store")

type entry struct {
	data  []byte
	files []*os.File
}

func (e *entry) close() {
	for _, f := range e.files {
		_ = f.Close()
	}
}

// Server is the store.
type Server struct {
	log logr.Logger

	mu      sync.Mutex
	entries map[string]map[string]*entry // owner → key → entry
	lis     *net.UnixListener
}

// NewServer returns an empty store.
func NewServer(log logr.Logger) *Server {
	return &Server{log: log, entries: map[string]map[string]*entry{}}
}

// Start listens on path, making its folder, and serves the store there until Stop.
func (s *Server) Start(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating the file descriptor store's folder: %w", err)
	}
	l, err := unixsock.Listen(path)
	if err != nil {
		return fmt.Errorf("listening for the file descriptor store: %w", err)
	}
	s.mu.Lock()
	s.lis = l
	s.mu.Unlock()
	go s.serve(l)
	return nil
}

// Stop stops listening; the files held stay held (Close lets them go).
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return nil
	}
	return s.lis.Close()
}

func (s *Server) serve(l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			s.log.Error(err, "accepting on the file descriptor store's socket")
			time.Sleep(100 * time.Millisecond) // such as EMFILE: give descriptors time to be freed
			continue
		}
		go s.handle(c)
	}
}

// Close closes every file the store holds, as a store that restarted would have none.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, byKey := range s.entries {
		for _, e := range byKey {
			e.close()
		}
	}
	s.entries = map[string]map[string]*entry{}
}

// Len is the number of entries held, for metrics and tests.
func (s *Server) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, byKey := range s.entries {
		n += len(byKey)
	}
	return n
}

func (s *Server) handle(c *net.UnixConn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(callTimeout))
	var req request
	files, err := receive(c, &req)
	if err == nil {
		err = validName("owner", req.Owner)
	}
	if err == nil && req.Op != "keys" {
		err = validName("key", req.Key)
	}
	if err != nil {
		closeFiles(files)
		_ = send(c, answer{Error: err.Error()}, nil)
		return
	}
	log := s.log.WithValues("owner", req.Owner, "key", req.Key)
	var ans answer
	var out []*os.File
	switch req.Op {
	case "put":
		if len(files) == 0 {
			ans.Error = "a put carries at least one file"
			break
		}
		log.V(1).Info("holding files", "files", len(files))
		s.put(req.Owner, req.Key, &entry{data: req.Data, files: files})
		files = nil
	case "get":
		if e := s.get(req.Owner, req.Key); e != nil {
			ans.Found, ans.Data, out = true, e.data, e.files
		}
	case "keys":
		ans.Keys = s.keys(req.Owner)
	case "drop":
		s.drop(req.Owner, req.Key)
		log.V(1).Info("dropped files")
	default:
		ans.Error = fmt.Sprintf("unknown operation %q", req.Op)
	}
	closeFiles(files)
	if err := send(c, ans, out); err != nil {
		log.Error(err, "answering a file descriptor store request", "op", req.Op)
	}
}

func (s *Server) put(owner, key string, e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byKey := s.entries[owner]
	if byKey == nil {
		byKey = map[string]*entry{}
		s.entries[owner] = byKey
	}
	if old := byKey[key]; old != nil {
		old.close()
	}
	byKey[key] = e
}

func (s *Server) get(owner, key string) *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries[owner][key]
}

func (s *Server) keys(owner string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.entries[owner]))
	for k := range s.entries[owner] {
		keys = append(keys, k)
	}
	return keys
}

func (s *Server) drop(owner, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[owner][key]; e != nil {
		e.close()
		delete(s.entries[owner], key)
	}
}

// Client is a process's view of the store: its own owner's entries.
type Client struct {
	path, owner string
}

// NewClient returns a client of the store listening at path, for owner's entries.
func NewClient(path, owner string) (*Client, error) {
	if err := validName("owner", owner); err != nil {
		return nil, err
	}
	return &Client{path: path, owner: owner}, nil
}

// Put hands the store files and data under key, replacing what it held there. The caller
// keeps its own files.
func (c *Client) Put(ctx context.Context, key string, data []byte, files []*os.File) error {
	if len(files) == 0 || len(files) > maxFiles {
		return fmt.Errorf("a put carries 1 to %d files, got %d", maxFiles, len(files))
	}
	_, _, err := c.call(ctx, request{Op: "put", Key: key, Data: data}, files)
	return err
}

// Get returns the data and new descriptors of the files held under key, or ErrNotFound. The
// store keeps its own; the caller closes the files it got.
func (c *Client) Get(ctx context.Context, key string) ([]byte, []*os.File, error) {
	ans, files, err := c.call(ctx, request{Op: "get", Key: key}, nil)
	if err != nil {
		return nil, nil, err
	}
	if !ans.Found {
		closeFiles(files)
		return nil, nil, fmt.Errorf("key %s: %w", key, ErrNotFound)
	}
	return ans.Data, files, nil
}

// Keys lists the keys the store holds for this client's owner.
func (c *Client) Keys(ctx context.Context) ([]string, error) {
	ans, _, err := c.call(ctx, request{Op: "keys"}, nil)
	return ans.Keys, err
}

// Drop closes the store's files under key; dropping a key not held is fine.
func (c *Client) Drop(ctx context.Context, key string) error {
	_, _, err := c.call(ctx, request{Op: "drop", Key: key}, nil)
	return err
}

func (c *Client) call(ctx context.Context, req request, files []*os.File) (answer, []*os.File, error) {
	req.Owner = c.owner
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.path)
	if err != nil {
		return answer{}, nil, fmt.Errorf("reaching the file descriptor store at %s (is the CSI node plugin running?): %w", c.path, err)
	}
	uc := conn.(*net.UnixConn)
	defer func() { _ = uc.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	if err := send(uc, req, files); err != nil {
		return answer{}, nil, fmt.Errorf("file descriptor store %s: %s: %w", c.path, req.Op, err)
	}
	var ans answer
	got, err := receive(uc, &ans)
	if err != nil {
		return answer{}, nil, fmt.Errorf("file descriptor store %s: %s: %w", c.path, req.Op, err)
	}
	if ans.Error != "" {
		closeFiles(got)
		return answer{}, nil, fmt.Errorf("file descriptor store %s refused %s: %s", c.path, req.Op, ans.Error)
	}
	return ans, got, nil
}

// send writes v as a JSON line, with files as SCM_RIGHTS.
func send(c *net.UnixConn, v any, files []*os.File) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, 0, len(files))
		for _, f := range files {
			// SyscallConn, not Fd: Fd would make a non-blocking descriptor (a FUSE connection)
			// blocking for every process that holds it.
			fd, err := rawFD(f)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
		}
		oob = unix.UnixRights(fds...)
	}
	n, _, err := c.WriteMsgUnix(line, oob, nil)
	if err != nil {
		return err
	}
	if n < len(line) {
		_, err = c.Write(line[n:])
	}
	return err
}

// rawFD returns f's descriptor number, valid while f is open.
func rawFD(f *os.File) (int, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var fd int
	if err := raw.Control(func(u uintptr) { fd = int(u) }); err != nil {
		return 0, err
	}
	return fd, nil
}

// receive reads one JSON line into v, and the files that came with it.
func receive(c *net.UnixConn, v any) ([]*os.File, error) {
	var buf bytes.Buffer
	chunk := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(maxFiles*4))
	var fds []int
	for !bytes.HasSuffix(buf.Bytes(), []byte{'\n'}) {
		n, oobn, _, _, err := c.ReadMsgUnix(chunk, oob)
		if oobn > 0 {
			got, perr := unixsock.ParseRights(oob[:oobn])
			fds = append(fds, got...)
			if perr != nil {
				unixsock.CloseFDs(fds)
				return nil, perr
			}
		}
		buf.Write(chunk[:n])
		if err != nil || n == 0 {
			unixsock.CloseFDs(fds)
			if err == nil {
				err = errors.New("connection closed before a whole message")
			}
			return nil, err
		}
		if buf.Len() > maxMessage {
			unixsock.CloseFDs(fds)
			return nil, fmt.Errorf("message longer than %d bytes", maxMessage)
		}
	}
	if err := json.Unmarshal(buf.Bytes(), v); err != nil {
		unixsock.CloseFDs(fds)
		return nil, fmt.Errorf("decoding a message: %w", err)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		unix.CloseOnExec(fd)
		files[i] = os.NewFile(uintptr(fd), "held")
	}
	return files, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

func validName(what, s string) error {
	if !namePattern.MatchString(s) {
		return fmt.Errorf("%s %q: want letters, digits, '.', '_' and '-', at most 253", what, s)
	}
	return nil
}

// Reaper drops the entries of owners that are gone for good: a worker whose TierPool was
// deleted never comes back for its mounts, and holding them would keep their pods' reads
// waiting forever. An owner is gone once alive has said no for a whole grace period; dropping
// its entries ends the mounts, so that their pods fail (ENOTCONN) rather than hang.
type Reaper struct {
	Store *Server
	// Alive tells whether owner still has a process that may take its entries back.
	Alive func(ctx context.Context, owner string) bool
	// Grace is how long an owner may be away: longer than a worker takes to restart.
	Grace time.Duration
	Log   logr.Logger

	lastSeen map[string]time.Time
}

// Run checks every interval until ctx ends.
func (r *Reaper) Run(ctx context.Context, interval time.Duration) {
	periodic.Every(ctx, interval, r.Check)
}

// Check looks at every owner once, at time now, and drops those away for longer than Grace.
func (r *Reaper) Check(ctx context.Context, now time.Time) {
	if r.lastSeen == nil {
		r.lastSeen = map[string]time.Time{}
	}
	owners := r.Store.owners()
	for _, owner := range owners {
		seen, known := r.lastSeen[owner]
		switch {
		case r.Alive(ctx, owner), !known:
			r.lastSeen[owner] = now
		case now.Sub(seen) > r.Grace:
			n := r.Store.dropOwner(owner)
			delete(r.lastSeen, owner)
			r.Log.Info("dropped the mounts of a worker gone for good; their pods now fail instead of waiting",
				"owner", owner, "entries", n, "away", now.Sub(seen).Round(time.Second).String())
		}
	}
	for owner := range r.lastSeen {
		if !slices.Contains(owners, owner) {
			delete(r.lastSeen, owner)
		}
	}
}

func (s *Server) owners() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var owners []string
	for o, byKey := range s.entries {
		if len(byKey) > 0 {
			owners = append(owners, o)
		}
	}
	return owners
}

func (s *Server) dropOwner(owner string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	byKey := s.entries[owner]
	for _, e := range byKey {
		e.close()
	}
	delete(s.entries, owner)
	return len(byKey)
}
