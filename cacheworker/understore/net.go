package understore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"syscall"
)

// unreachable reports whether err means the store could not be talked to at all: no route,
// nothing listening, a DNS name that does not resolve, a timeout, a TLS handshake that failed.
// A cancelled or expired context is the caller's doing, not the store's, and does not count.
func unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var (
		dnsErr  *net.DNSError
		opErr   *net.OpError
		netErr  net.Error
		certErr *tls.CertificateVerificationError
		authErr x509.UnknownAuthorityError
	)
	switch {
	case errors.As(err, &dnsErr), errors.As(err, &opErr), errors.As(err, &certErr), errors.As(err, &authErr):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return true
	case errors.As(err, &netErr) && netErr.Timeout():
		return true
	}
	return false
}
