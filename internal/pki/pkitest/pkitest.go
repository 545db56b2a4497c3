// Package pkitest issues certificates for tests: a CA of the test's own, and credentials for
// any identity, valid for the loopback names that test servers listen on.
package pkitest

import (
	"crypto/x509"
	"net"
	"time"

	"github.com/strata-cache/strata/internal/pki"
)

// TB is what the helpers need of a test: testing.TB, or Ginkgo's GinkgoT().
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Authority is a test CA.
type Authority struct {
	CA *pki.CA
}

// New makes a CA.
func New(tb TB) *Authority {
	tb.Helper()
	ca, err := pki.NewCA("test CA", time.Now())
	if err != nil {
		tb.Fatalf("making a test CA: %v", err)
	}
	return &Authority{CA: ca}
}

// Credentials are credentials for id that trust this CA, valid for localhost and 127.0.0.1.
func (a *Authority) Credentials(tb TB, id pki.Identity) *pki.Credentials {
	tb.Helper()
	return a.CredentialsTrusting(tb, id, a)
}

// CredentialsTrusting are credentials for id signed by this CA that trust the CA of trust: a
// component of another installation, for a test that it is refused.
func (a *Authority) CredentialsTrusting(tb TB, id pki.Identity, trust *Authority) *pki.Credentials {
	tb.Helper()
	cert, key := a.Issue(tb, id)
	// Set checks the certificate against the pool it is given, so a's CA is in it; a peer
	// trusts what trust's CA signed.
	creds := pki.NewCredentials(poolOf(a, trust))
	if err := creds.Set(cert, key); err != nil {
		tb.Fatalf("installing the certificate of %s: %v", id, err)
	}
	return creds
}

// Issue returns a certificate for id and its key, PEM-encoded.
func (a *Authority) Issue(tb TB, id pki.Identity) (certPEM, keyPEM []byte) {
	tb.Helper()
	certPEM, keyPEM, err := a.CA.IssueKeyPair(pki.Leaf{
		Identity: id, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}, time.Now())
	if err != nil {
		tb.Fatalf("issuing a certificate for %s: %v", id, err)
	}
	return certPEM, keyPEM
}

func poolOf(as ...*Authority) *x509.CertPool {
	p := x509.NewCertPool()
	for _, a := range as {
		p.AddCert(a.CA.Cert)
	}
	return p
}
