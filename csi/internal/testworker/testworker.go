package testworker

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/mounter"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

// ContentFile is the file each mounted Dataset directory holds; its content is the uid.
const ContentFile = "content.txt"

// Server is one pool's Mounter.
type Server struct {
	workerpb.UnimplementedMounterServer
	// Socket is the path the server listens on.
	Socket string
	root   string

	mu       sync.Mutex
	mounted  map[string]*workerpb.MountDatasetRequest // by uid
	mounts   []*workerpb.MountDatasetRequest
	unmounts []string
	failWith error
	gate     chan struct{}
	entered  chan struct{}
}

// Start serves pool's Mounter on <socketDir>/<pool>/mount.sock until the test ends, as the
// worker of pool on node does: over mutual TLS with a certificate of ca, taking calls from the
// CSI node plugin only.
func Start(t testing.TB, ca *pkitest.Authority, socketDir, pool, node string) *Server {
	t.Helper()
	s := &Server{
		Socket:  filepath.Join(socketDir, pool, "mount.sock"),
		root:    t.TempDir(),
		mounted: map[string]*workerpb.MountDatasetRequest{},
	}
	if err := os.MkdirAll(filepath.Dir(s.Socket), 0o750); err != nil {
		t.Fatalf("creating the worker's socket folder: %v", err)
	}
	lis, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatalf("listening on %s: %v", s.Socket, err)
	}
	authorizer, err := authz.New("testworker", mounter.Policy, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append([]grpc.ServerOption{ca.Credentials(t, pki.Worker(pool, node)).ServerOption()},
		authorizer.ServerOptions()...)...)
	workerpb.RegisterMounterServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return s
}

// Path is where the server mounts the Dataset of uid.
func (s *Server) Path(uid string) string { return filepath.Join(s.root, uid) }

// FailWith makes every later MountDataset and UnmountDataset call return err (nil: succeed).
func (s *Server) FailWith(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failWith = err
}

// Hold makes MountDataset wait until the returned release is called. entered receives once
// per call that waits.
func (s *Server) Hold() (entered <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
	s.entered = make(chan struct{}, 16)
	gate := s.gate
	var once sync.Once
	return s.entered, func() { once.Do(func() { close(gate) }) }
}

// Mounts returns the MountDataset requests served so far.
func (s *Server) Mounts() []*workerpb.MountDatasetRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*workerpb.MountDatasetRequest(nil), s.mounts...)
}

// Unmounts returns the uids of the UnmountDataset requests served so far.
func (s *Server) Unmounts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.unmounts...)
}

// Mounted says whether the Dataset of uid is mounted.
func (s *Server) Mounted(uid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.mounted[uid]
	return ok
}

// MountDataset creates the Dataset's directory, once, and returns its path.
func (s *Server) MountDataset(ctx context.Context, req *workerpb.MountDatasetRequest) (*workerpb.MountDatasetResponse, error) {
	s.mu.Lock()
	gate, entered := s.gate, s.entered
	s.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.mounts = append(s.mounts, proto.Clone(req).(*workerpb.MountDatasetRequest))
	if s.failWith != nil {
		return nil, s.failWith
	}
	if req.GetUid() == "" || req.GetNamespace() == "" || req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "namespace, name and uid are required")
	}
	if prev, ok := s.mounted[req.GetUid()]; ok {
		// As the real worker: other credentials are rotated ones, taken in; anything else
		// about the source is another Dataset.
		prevSource, source := proto.Clone(prev.GetSource()).(*workerpb.DatasetSource), proto.Clone(req.GetSource()).(*workerpb.DatasetSource)
		if prevSource != nil && source != nil {
			prevSource.Credentials, source.Credentials = nil, nil
		}
		if !proto.Equal(prevSource, source) || prev.GetOutput() != req.GetOutput() || (!req.GetOutput() && prev.GetReadOnly() != req.GetReadOnly()) {
			return nil, status.Errorf(codes.FailedPrecondition, "Dataset %s is mounted with another source or read-only flag: unmount it first", req.GetUid())
		}
		s.mounted[req.GetUid()] = proto.Clone(req).(*workerpb.MountDatasetRequest)
		return &workerpb.MountDatasetResponse{Path: s.Path(req.GetUid())}, nil
	}
	dir := s.Path(req.GetUid())
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "creating %s: %v", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, ContentFile), []byte(req.GetUid()), 0o600); err != nil {
		return nil, status.Errorf(codes.Internal, "writing into %s: %v", dir, err)
	}
	s.mounted[req.GetUid()] = proto.Clone(req).(*workerpb.MountDatasetRequest)
	return &workerpb.MountDatasetResponse{Path: dir}, nil
}

// UnmountDataset removes the Dataset's directory; one that is not mounted is no error.
func (s *Server) UnmountDataset(_ context.Context, req *workerpb.UnmountDatasetRequest) (*workerpb.UnmountDatasetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unmounts = append(s.unmounts, req.GetUid())
	if s.failWith != nil {
		return nil, s.failWith
	}
	delete(s.mounted, req.GetUid())
	if err := os.RemoveAll(s.Path(req.GetUid())); err != nil {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", s.Path(req.GetUid()), err)
	}
	return &workerpb.UnmountDatasetResponse{}, nil
}
