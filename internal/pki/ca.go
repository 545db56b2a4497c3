package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// Lifetimes of the CA and of the certificates it issues. A leaf lives a day and is renewed
// after two thirds of it, which leaves eight hours for an operator that is down to come back.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	LeafValidity = 24 * time.Hour
	// clockSkew backdates every certificate, so that a peer whose clock runs a little behind
	// does not refuse a certificate issued a moment ago.
	clockSkew = 5 * time.Minute
)

// CA signs the certificates of Strata's components.
type CA struct {
	Cert *x509.Certificate
	key  crypto.Signer
	// CertPEM and KeyPEM are the CA as it is stored.
	CertPEM, KeyPEM []byte
}

// NewCA makes a CA whose certificate is valid from now for CAValidity.
func NewCA(commonName string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"Strata"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-signing the CA: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the CA key: %w", err)
	}
	return ParseCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

// ParseCA reads a CA from its PEM certificate and PKCS#8 key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertificatePEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("the CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("the CA certificate is not a CA's")
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("the CA key is not PEM")
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the CA key: %w", err)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("the CA key is a %T, which cannot sign", parsed)
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, errors.New("the CA key does not belong to the CA certificate")
	}
	return &CA{Cert: cert, key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// Leaf is what a certificate is issued for.
type Leaf struct {
	Identity Identity
	// DNSNames and IPs are the names clients dial the component by (servers only).
	DNSNames []string
	IPs      []net.IP
	// Validity defaults to LeafValidity.
	Validity time.Duration
}

// Issue signs a certificate for pub, valid from now, and returns it PEM-encoded. It serves
// both as a server and as a client certificate: every component is both.
func (ca *CA) Issue(pub crypto.PublicKey, leaf Leaf, now time.Time) ([]byte, error) {
	if err := leaf.Identity.Validate(); err != nil {
		return nil, fmt.Errorf("issuing a certificate: %w", err)
	}
	validity := leaf.Validity
	if validity == 0 {
		validity = LeafValidity
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: leaf.Identity.String(), Organization: []string{"Strata"}},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{leaf.Identity.URI()},
		DNSNames:     leaf.DNSNames,
		IPAddresses:  leaf.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate of %s: %w", leaf.Identity, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// IssueKeyPair makes a key and certifies it for leaf: for a component whose certificate the
// operator hands over in a Secret, since it has no way to prove itself to the issuer.
func (ca *CA) IssueKeyPair(leaf Leaf, now time.Time) (certPEM, keyPEM []byte, _ error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating a key: %w", err)
	}
	certPEM, err = ca.Issue(key.Public(), leaf, now)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the key: %w", err)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Pool is a certificate pool that trusts the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// PoolFromPEM is a certificate pool of the CA certificates in bundle.
func PoolFromPEM(bundle []byte) (*x509.CertPool, error) {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(bundle) {
		return nil, errors.New("the CA bundle holds no PEM certificate")
	}
	return p, nil
}

func parseCertificatePEM(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("drawing a serial number: %w", err)
	}
	return serial, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}
