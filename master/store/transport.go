package store

import (
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// streamLayer is raft's TCP stream layer with an advertised address that may be a DNS name.
// raft.NewTCPTransport insists on a resolved IP, but a StatefulSet pod keeps its DNS name
// (pod.service) across restarts while its IP changes; advertising the name keeps the Raft
// configuration valid after a pod is rescheduled.
type streamLayer struct {
	net.Listener
	advertise string
}

type hostAddr string

func (a hostAddr) Network() string { return "tcp" }
func (a hostAddr) String() string  { return string(a) }

// Addr returns the advertised address.
func (s *streamLayer) Addr() net.Addr { return hostAddr(s.advertise) }

// Dial connects to a peer's advertised address, resolving it at each dial.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}

// newTCPTransport listens on bind and advertises advertise (bind's address when empty).
func newTCPTransport(bind, advertise string, logger hclog.Logger) (*raft.NetworkTransport, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("listening for raft on %s: %w", bind, err)
	}
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	host, port, err := net.SplitHostPort(advertise)
	if err != nil || host == "" || port == "0" {
		_ = ln.Close()
		return nil, fmt.Errorf("raft advertise address %q must be host:port with a real host and port", advertise)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("raft advertise address %q is unspecified: peers could not dial it", advertise)
	}
	cfg := &raft.NetworkTransportConfig{
		Stream:  &streamLayer{Listener: ln, advertise: advertise},
		MaxPool: 3,
		Timeout: 10 * time.Second,
		Logger:  logger,
	}
	return raft.NewNetworkTransportWithConfig(cfg), nil
}
