package endpoint

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/strata-cache/strata/internal/unixsock"
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

// Listen listens on e. A Unix socket's folder is created, and a stale socket of an earlier run
// is replaced, but never one a running plugin still serves (see internal/unixsock).
func Listen(e Endpoint) (net.Listener, error) {
	if e.Network == "unix" {
		lis, err := unixsock.Listen(e.Address)
		if err != nil {
			// Not the typed nil *net.UnixListener: callers compare the listener with nil.
			return nil, err
		}
		return lis, nil
	}
	lis, err := net.Listen(e.Network, e.Address)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", e, err)
	}
	return lis, nil
}
