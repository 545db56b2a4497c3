package pki

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/go-logr/logr"
)

// Flags say where a component gets its certificate: from the operator's issuer, proving itself
// with its pod's projected token (what Strata's pods do), or from files (a tool run by hand
// with a certificate an administrator issued). Either way it trusts the CA of CAFile.
type Flags struct {
	CAFile    string
	Issuer    string
	TokenFile string
	CertFile  string
	KeyFile   string
}

// Bind adds the flags to fs.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.CAFile, "ca-file", "", "PEM bundle of Strata's CA (the operator's strata-ca-bundle ConfigMap): every peer's certificate must be signed by it.")
	fs.StringVar(&f.Issuer, "issuer", "", "https://host:port of the operator's certificate issuer, which certifies this pod for its projected token.")
	fs.StringVar(&f.TokenFile, "token-file", "", "The pod's projected ServiceAccount token for the issuer (audience issuer.strata.dev).")
	fs.StringVar(&f.CertFile, "cert-file", "", "A PEM certificate to use instead of asking the issuer (with --key-file).")
	fs.StringVar(&f.KeyFile, "key-file", "", "The key of --cert-file.")
}

// ErrNoTLS is returned when the flags name no CA: no component speaks without TLS.
var ErrNoTLS = errors.New("--ca-file is required, with --issuer and --token-file or with --cert-file and --key-file: Strata's components speak only mutual TLS")

// Load returns the component's credentials with their first certificate, and the renewer that
// keeps them valid (nil for a certificate from files, which is not renewed). It waits for the
// issuer until ctx ends.
func (f *Flags) Load(ctx context.Context, log logr.Logger) (*Credentials, *Renewer, error) {
	creds, renewer, err := f.Prepare(log)
	if err != nil || renewer == nil {
		return creds, renewer, err
	}
	if err := renewer.First(ctx); err != nil {
		return nil, nil, err
	}
	log.Info("certified", "identity", creds.Identity())
	return creds, renewer, nil
}

// Prepare is Load without the wait: with a certificate from the issuer, the credentials hold
// none until the renewer's First returns. For a component that has work to do before it speaks
// to another (the CSI node plugin holds pods' mounts, whatever the issuer's state).
func (f *Flags) Prepare(log logr.Logger) (*Credentials, *Renewer, error) {
	if f.CAFile == "" {
		return nil, nil, ErrNoTLS
	}
	bundle, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--ca-file: %w", err)
	}
	trust, err := PoolFromPEM(bundle)
	if err != nil {
		return nil, nil, fmt.Errorf("--ca-file %s: %w", f.CAFile, err)
	}
	creds := NewCredentials(trust)
	switch {
	case f.CertFile != "" || f.KeyFile != "":
		if f.CertFile == "" || f.KeyFile == "" {
			return nil, nil, errors.New("--cert-file and --key-file go together")
		}
		cert, err := os.ReadFile(f.CertFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--cert-file: %w", err)
		}
		key, err := os.ReadFile(f.KeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--key-file: %w", err)
		}
		if err := creds.Set(cert, key); err != nil {
			return nil, nil, fmt.Errorf("--cert-file %s: %w", f.CertFile, err)
		}
		return creds, nil, nil
	case f.Issuer != "" && f.TokenFile != "":
		issuer, err := NewIssuerClient(f.Issuer, f.TokenFile, trust)
		if err != nil {
			return nil, nil, err
		}
		return creds, &Renewer{Credentials: creds, Source: issuer, Log: log}, nil
	}
	return nil, nil, ErrNoTLS
}
