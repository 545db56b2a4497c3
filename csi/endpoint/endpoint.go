package endpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Endpoint is where a gRPC service listens.
type Endpoint struct {
	// Network is "unix" or "tcp".
	Network string
	// Address is the socket's absolute path for unix, host:port for tcp.
	Address string
}

// String gives the endpoint back in URL form.
func (e Endpoint) String() string {
	if e.Network == "unix" {
		return "unix://" + e.Address
	}
	return e.Network + "://" + e.Address
}

// Parse reads unix:///abs/path (or unix:/abs/path, or a bare absolute path) and tcp://host:port.
func Parse(s string) (Endpoint, error) {
	switch {
	case strings.HasPrefix(s, "unix://"):
		return unixEndpoint(s, strings.TrimPrefix(s, "unix://"))
	case strings.HasPrefix(s, "unix:"):
		return unixEndpoint(s, strings.TrimPrefix(s, "unix:"))
	case strings.HasPrefix(s, "/"):
		return unixEndpoint(s, s)
	case strings.HasPrefix(s, "tcp://"):
		addr := strings.TrimPrefix(s, "tcp://")
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return Endpoint{}, fmt.Errorf("endpoint %q: tcp endpoints are tcp://host:port: %w", s, err)
		}
		return Endpoint{Network: "tcp", Address: addr}, nil
	default:
		return Endpoint{}, fmt.Errorf("endpoint %q: want unix:///absolute/path.sock or tcp://host:port", s)
	}
}

func unixEndpoint(raw, path string) (Endpoint, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return Endpoint{}, fmt.Errorf("endpoint %q: the socket path must be absolute and clean", raw)
	}
	return Endpoint{Network: "unix", Address: path}, nil
}

// Listen listens on e. For a Unix socket it creates the socket's folder (0750) and removes a
// stale socket of an earlier run.
func Listen(e Endpoint) (net.Listener, error) {
	if e.Network == "unix" {
		if err := prepareUnix(e.Address); err != nil {
			return nil, err
		}
	}
	lis, err := net.Listen(e.Network, e.Address)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", e, err)
	}
	return lis, nil
}

func prepareUnix(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("creating the folder of socket %s: %w", path, err)
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("checking for a stale socket at %s: %w", path, err)
	case fi.Mode()&fs.ModeSocket == 0:
		return fmt.Errorf("%s exists and is not a socket: remove it or choose another endpoint", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the stale socket %s: %w", path, err)
	}
	return nil
}
