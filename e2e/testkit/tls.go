package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/master/client"
)

// tlsFlags are how testkit speaks to Strata's components: with a certificate the test issued
// (--ca-file, --cert-file, --key-file), with one it forged from a CA of its own (--forge, what
// a hostile pod could make), or with none at all (plaintext).
type tlsFlags struct {
	pki.Flags
	forge string
}

func (f *tlsFlags) bind(fs *flag.FlagSet) {
	f.Bind(fs) // without --ca-file, testkit speaks plaintext
	fs.StringVar(&f.forge, "forge", "", "present a certificate for this identity URI, signed by a CA testkit makes itself")
}

// dialOptions are the gRPC options to reach the masters and the workers, from one reading of
// the flags' files (none: the clients' default, plaintext).
func (f *tlsFlags) dialOptions(ctx context.Context) (toMaster, toWorker []grpc.DialOption, err error) {
	switch {
	case f.forge != "":
		cfg, err := f.forged()
		if err != nil {
			return nil, nil, err
		}
		opt := grpc.WithTransportCredentials(credentials.NewTLS(cfg))
		return []grpc.DialOption{opt}, []grpc.DialOption{opt}, nil
	case f.CAFile != "":
		creds, _, err := f.Load(ctx, logr.Discard())
		if err != nil {
			return nil, nil, err
		}
		return []grpc.DialOption{creds.DialOption(pki.RoleMaster)}, []grpc.DialOption{creds.DialOption(pki.RoleWorker)}, nil
	}
	return nil, nil, nil
}

// clients are a client of the masters at addrs (comma-separated) and one of the workers' data
// planes, both speaking as the flags say; close them when done.
func (f *tlsFlags) clients(ctx context.Context, addrs string, opts client.Options) (*client.Client, *dataplane.Peers, error) {
	toMaster, toWorker, err := f.dialOptions(ctx)
	if err != nil {
		return nil, nil, err
	}
	opts.DialOptions = toMaster
	mc, err := client.New(strings.Split(addrs, ","), opts)
	if err != nil {
		return nil, nil, err
	}
	return mc, dataplane.NewPeers(toWorker...), nil
}

// forged is a TLS configuration that trusts Strata's CA (public knowledge: it is in every
// certificate a server presents) and presents a certificate for --forge from a CA of testkit's.
func (f *tlsFlags) forged() (*tls.Config, error) {
	ca, err := pki.NewCA("forged", time.Now())
	if err != nil {
		return nil, err
	}
	u, err := parseURI(f.forge)
	if err != nil {
		return nil, err
	}
	id, err := pki.ParseURI(u)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	certPEM, err := ca.Issue(key.Public(), pki.Leaf{Identity: id, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, time.Now())
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if f.CAFile != "" {
		bundle, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		roots.AppendCertsFromPEM(bundle)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, Certificates: []tls.Certificate{cert}}, nil
}
