package registration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/strata-cache/strata/csi/endpoint"
)

// SupportedVersions are the CSI versions the plugin tells the kubelet it speaks.
var SupportedVersions = []string{"1.0.0"}

// SocketPath is where the kubelet looks for driverName's registration socket.
func SocketPath(kubeletDir, driverName string) string {
	return filepath.Join(kubeletDir, "plugins_registry", driverName+"-reg.sock")
}

// Config is what the registration server tells the kubelet.
type Config struct {
	// DriverName is the CSI driver's name.
	DriverName string
	// Endpoint is the CSI socket's path as the kubelet sees it on the host.
	Endpoint string
	Log      logr.Logger
}

// Server is the kubelet's Registration service for one CSI driver.
type Server struct {
	registerapi.UnimplementedRegistrationServer
	cfg        Config
	registered atomic.Bool
}

// New checks cfg and returns the server.
func New(cfg Config) (*Server, error) {
	if cfg.DriverName == "" {
		return nil, errors.New("registration needs the driver's name")
	}
	if !filepath.IsAbs(cfg.Endpoint) {
		return nil, fmt.Errorf("the CSI socket path %q given to the kubelet must be absolute", cfg.Endpoint)
	}
	return &Server{cfg: cfg}, nil
}

// GetInfo tells the kubelet which CSI driver this is and where its socket is.
func (s *Server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	s.cfg.Log.V(1).Info("the kubelet asked for the plugin's information")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.cfg.DriverName,
		Endpoint:          s.cfg.Endpoint,
		SupportedVersions: SupportedVersions,
	}, nil
}

// NotifyRegistrationStatus receives the kubelet's verdict. A refusal is logged and returned as
// an error, so that it shows in the kubelet's log too.
func (s *Server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		s.registered.Store(false)
		s.cfg.Log.Info("the kubelet did not register the CSI driver", "driver", s.cfg.DriverName, "error", st.Error)
		return nil, status.Errorf(codes.FailedPrecondition, "the kubelet did not register CSI driver %s: %s", s.cfg.DriverName, st.Error)
	}
	s.registered.Store(true)
	s.cfg.Log.Info("registered with the kubelet", "driver", s.cfg.DriverName, "endpoint", s.cfg.Endpoint)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Registered says whether the kubelet registered the driver.
func (s *Server) Registered() bool { return s.registered.Load() }

// Serve listens on the Unix socket at socketPath (removing a stale one) and serves until ctx
// ends; then it stops and removes the socket, which deregisters the driver. opts are added to
// the gRPC server's options (an interceptor, for instance).
func (s *Server) Serve(ctx context.Context, socketPath string, opts ...grpc.ServerOption) error {
	lis, err := endpoint.Listen(endpoint.Endpoint{Network: "unix", Address: socketPath})
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	srv := grpc.NewServer(opts...)
	registerapi.RegisterRegistrationServer(srv, s)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		srv.Stop()
	}()
	s.cfg.Log.Info("serving the kubelet's registration API", "socket", socketPath, "csiEndpoint", s.cfg.Endpoint)
	serveErr := srv.Serve(lis)
	cancel()
	<-done
	if err := os.Remove(socketPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.cfg.Log.Info("could not remove the registration socket", "socket", socketPath, "error", err.Error())
	}
	if serveErr != nil && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("serving the registration API on %s: %w", socketPath, serveErr)
	}
	return nil
}
