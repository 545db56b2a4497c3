package store

import (
	"crypto/tls"
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
//
// With TLS, every connection is TLS 1.3 with client certificates both ways: a peer that cannot
// show a master's certificate neither sends nor receives a single Raft message.
type streamLayer struct {
	net.Listener
	advertise string
	tls       *RaftTLS
}

// RaftTLS is the TLS of the Raft transport: Server for the connections peers open, Client for
// those this server opens (its ServerName is set per peer).
type RaftTLS struct {
	Server, Client *tls.Config
}

// Accept waits for a peer's connection; with TLS, the handshake runs on the first read, in the
// goroutine raft serves the connection in, so one slow peer does not hold up the others.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil || s.tls == nil {
		return c, err
	}
	return tls.Server(c, s.tls.Server), nil
}

type hostAddr string

func (a hostAddr) Network() string { return "tcp" }
func (a hostAddr) String() string  { return string(a) }

// Addr returns the advertised address.
func (s *streamLayer) Addr() net.Addr { return hostAddr(s.advertise) }

// Dial connects to a peer's advertised address, resolving it at each dial.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.tls == nil {
		return net.DialTimeout("tcp", string(address), timeout)
	}
	host, _, err := net.SplitHostPort(string(address))
	if err != nil {
		return nil, fmt.Errorf("raft peer address %q: %w", address, err)
	}
	cfg := s.tls.Client.Clone()
	cfg.ServerName = host
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to raft peer %s over TLS: %w", address, err)
	}
	return conn, nil
}

// newTCPTransport listens on bind and advertises advertise (bind's address when empty), over
// TLS when tlsCfg is set.
func newTCPTransport(bind, advertise string, tlsCfg *RaftTLS, logger hclog.Logger) (*raft.NetworkTransport, error) {
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
		Stream:  &streamLayer{Listener: ln, advertise: advertise, tls: tlsCfg},
		MaxPool: 3,
		Timeout: 10 * time.Second,
		Logger:  logger,
	}
	return raft.NewNetworkTransportWithConfig(cfg), nil
}
