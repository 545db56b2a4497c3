package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"time"

	"github.com/go-logr/logr"
)

// Obtainer asks for a certificate for the key of a certificate request (DER), and returns the
// certificate PEM-encoded.
type Obtainer interface {
	Obtain(ctx context.Context, csr []byte) ([]byte, error)
}

// Backoff between failed attempts to obtain a certificate.
const (
	minRetry = time.Second
	maxRetry = time.Minute
)

// Renewer keeps Credentials holding a valid certificate: a new key and certificate after two
// thirds of the current one's lifetime, retried with backoff until it is had.
type Renewer struct {
	Credentials *Credentials
	Source      Obtainer
	Log         logr.Logger
	// After waits (time.After unless a test sets it).
	After func(time.Duration) <-chan time.Time
}

// First obtains the first certificate, trying until it is had or ctx ends: a component cannot
// speak to any other without one.
func (r *Renewer) First(ctx context.Context) error {
	for retry := minRetry; ; retry = min(2*retry, maxRetry) {
		err := r.renew(ctx)
		if err == nil {
			return nil
		}
		r.Log.Error(err, "no certificate yet; trying again", "in", retry)
		select {
		case <-ctx.Done():
			return fmt.Errorf("obtaining the first certificate: %w", err)
		case <-r.after(retry):
		}
	}
}

// Run renews the certificate until ctx ends.
func (r *Renewer) Run(ctx context.Context) {
	retry := minRetry
	for {
		wait := retry
		if notBefore, notAfter := r.Credentials.Lifetime(); !notAfter.IsZero() {
			renewAt := notBefore.Add(notAfter.Sub(notBefore) * 2 / 3)
			wait = max(time.Until(renewAt), 0)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.after(wait):
		}
		if err := r.renew(ctx); err != nil {
			_, notAfter := r.Credentials.Lifetime()
			r.Log.Error(err, "renewing the certificate; trying again", "in", retry, "expires", notAfter)
			select {
			case <-ctx.Done():
				return
			case <-r.after(retry):
			}
			retry = min(2*retry, maxRetry)
			continue
		}
		retry = minRetry
		_, notAfter := r.Credentials.Lifetime()
		r.Log.Info("renewed the certificate", "identity", r.Credentials.Identity(), "expires", notAfter)
	}
}

func (r *Renewer) after(d time.Duration) <-chan time.Time {
	if r.After != nil {
		return r.After(d)
	}
	return time.After(d)
}

// renew makes a new key, has it certified and installs both.
func (r *Renewer) renew(ctx context.Context) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating a key: %w", err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return fmt.Errorf("making a certificate request: %w", err)
	}
	chain, err := r.Source.Obtain(ctx, csr)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding the key: %w", err)
	}
	return r.Credentials.Set(chain, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}
