package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/strata-cache/strata/internal/tlsbatch"
)

// Credentials are a component's certificate, which a Renewer replaces as it renews, and the CA
// it trusts. The TLS configurations it hands out read the newest certificate at every
// handshake, so a renewal needs no restart and breaks no open connection.
type Credentials struct {
	trust *x509.CertPool
	cert  atomic.Pointer[tls.Certificate]
	id    atomic.Pointer[Identity]
}

// NewCredentials returns credentials that trust the CAs of trust and hold no certificate yet.
func NewCredentials(trust *x509.CertPool) *Credentials {
	return &Credentials{trust: trust}
}

// Set installs a certificate: chainPEM signed by the trusted CA, keyPEM its key.
func (c *Credentials) Set(chainPEM, keyPEM []byte) error {
	cert, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("reading the certificate and its key: %w", err)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: c.trust, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("the certificate is not signed by the trusted CA: %w", err)
	}
	id, err := FromCertificate(cert.Leaf)
	if err != nil {
		return err
	}
	if old := c.id.Load(); old != nil && *old != id {
		return fmt.Errorf("the new certificate is for %s, not %s", id, old)
	}
	c.id.Store(&id)
	c.cert.Store(&cert)
	return nil
}

// Identity is who the current certificate speaks for; zero before the first.
func (c *Credentials) Identity() Identity {
	if id := c.id.Load(); id != nil {
		return *id
	}
	return Identity{}
}

// Lifetime is when the current certificate became valid and when it expires.
func (c *Credentials) Lifetime() (notBefore, notAfter time.Time) {
	if cert := c.cert.Load(); cert != nil {
		return cert.Leaf.NotBefore, cert.Leaf.NotAfter
	}
	return time.Time{}, time.Time{}
}

var errNoCertificate = errors.New("no certificate yet: it has not been issued")

func (c *Credentials) current() (*tls.Certificate, error) {
	if cert := c.cert.Load(); cert != nil {
		return cert, nil
	}
	return nil, errNoCertificate
}

// ServerConfig is TLS 1.3 with a client certificate from the trusted CA required of every
// client, naming a Strata identity, of one of roles when any are given.
func (c *Credentials) ServerConfig(roles ...Role) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Blocks stream in megabytes: full-size records from the first byte cost less per byte
		// than the small records dynamic sizing starts with for interactive traffic.
		DynamicRecordSizingDisabled: true,
		ClientAuth:                  tls.RequireAndVerifyClientCert,
		ClientCAs:                   c.trust,
		GetCertificate:              func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.current() },
		VerifyConnection:            peerRole(roles),
	}
}

// ClientConfig is TLS 1.3 that presents the certificate and accepts only a server whose
// certificate is from the trusted CA, for the name dialled, of one of roles.
func (c *Credentials) ClientConfig(roles ...Role) *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS13,
		DynamicRecordSizingDisabled: true,
		RootCAs:                     c.trust,
		GetClientCertificate:        func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.current() },
		VerifyConnection:            peerRole(roles),
	}
}

// ServerOption is the gRPC server option of ServerConfig.
func (c *Credentials) ServerOption() grpc.ServerOption {
	return grpc.Creds(tlsbatch.Credentials(credentials.NewTLS(c.ServerConfig())))
}

// DialOption is the gRPC dial option of ClientConfig: the server must be one of roles.
func (c *Credentials) DialOption(roles ...Role) grpc.DialOption {
	return grpc.WithTransportCredentials(tlsbatch.Credentials(credentials.NewTLS(c.ClientConfig(roles...))))
}

// LocalServerName is the name a server reached over a Unix socket is verified for: every
// worker's certificate names it, and the client checks the exact identity besides.
const LocalServerName = "localhost"

// DialOptionLocal is a gRPC dial option for a server on this node reached over a Unix socket:
// its certificate must be exactly want's (the worker of one pool on this node).
func (c *Credentials) DialOptionLocal(want Identity) grpc.DialOption {
	cfg := c.ClientConfig(want.Role)
	cfg.ServerName = LocalServerName
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer sent no certificate")
		}
		id, err := FromCertificate(cs.PeerCertificates[0])
		if err != nil {
			return err
		}
		if id != want {
			return fmt.Errorf("the peer is %s, not %s", id, want)
		}
		return nil
	}
	return grpc.WithTransportCredentials(tlsbatch.Credentials(credentials.NewTLS(cfg)))
}

// peerRole refuses a peer whose verified certificate names no Strata identity, or one of
// another role than roles (any role when roles is empty).
func peerRole(roles []Role) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer sent no certificate")
		}
		id, err := FromCertificate(cs.PeerCertificates[0])
		if err != nil {
			return err
		}
		if len(roles) > 0 && !slices.Contains(roles, id.Role) {
			return fmt.Errorf("the peer is %s, not of role %v", id, roles)
		}
		return nil
	}
}
