package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/daemon"
	"github.com/strata-cache/strata/internal/periodic"
	"github.com/strata-cache/strata/internal/pki"
)

// serveClaim is `worker serve-claim`: the server the operator runs in a Dataset's namespace
// for a pvc:// source. It serves the folder of the claim mounted at --claim read-only over
// mutual TLS to Strata's workers and operator, which send the token in --token-file.
func serveClaim(args []string) int {
	fs := flag.NewFlagSet("serve-claim", flag.ContinueOnError)
	opts := claimServerOptions{refresh: certificateRefresh}
	fs.StringVar(&opts.claim, "claim", "/claim", "where the claim is mounted")
	fs.StringVar(&opts.sub, "path", "", "the folder of the claim to serve, relative to it")
	fs.StringVar(&opts.tokenFile, "token-file", "/var/run/strata/claim-token/token", "file holding the bearer token workers send")
	fs.StringVar(&opts.tlsDir, "tls-dir", "/var/run/strata/claim-tls",
		"folder with the server's certificate (tls.crt, tls.key) and Strata's CA (ca.crt), as the operator's Secret holds them; re-read as the kubelet updates them")
	fs.StringVar(&opts.listen, "listen", fmt.Sprintf(":%d", understore.ClaimServerPort), "address to serve HTTPS on")
	fs.StringVar(&opts.healthListen, "health-listen", fmt.Sprintf(":%d", understore.ClaimServerHealthPort),
		"address to serve /healthz and /metrics on, in plain HTTP")
	verbosity := fs.Int("v", 0, "log verbosity: 0 info, 1 debug, 2 trace")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: worker serve-claim [--claim DIR] [--path SUBDIR] [--token-file FILE] [--tls-dir DIR] [--listen ADDR] [--health-listen ADDR]")
		return 2
	}
	daemon.Main("claim-server", *verbosity, func(ctx context.Context, log logr.Logger) error {
		return runClaimServer(ctx, opts, log)
	})
	return 0
}

type claimServerOptions struct {
	claim, sub, tokenFile, tlsDir, listen, healthListen string
	// refresh is how often the certificate files are read again.
	refresh time.Duration
}

// certificateRefresh is how often the claim server looks for the certificate the operator
// renewed; the operator renews with a third of the old one's lifetime left, days ahead.
const certificateRefresh = time.Minute

func runClaimServer(ctx context.Context, opts claimServerOptions, log logr.Logger) error {
	token, err := os.ReadFile(opts.tokenFile)
	if err != nil {
		return fmt.Errorf("reading the token: %w", err)
	}
	creds, err := claimServerCredentials(opts.tlsDir)
	if err != nil {
		return err
	}
	claim, sub, listen := opts.claim, opts.sub, opts.listen
	dir := filepath.Join(claim, filepath.FromSlash(sub))
	if !strings.HasPrefix(dir+"/", filepath.Clean(claim)+"/") {
		return fmt.Errorf("--path %q leaves the claim", sub)
	}
	store, err := understore.NewLocal(understore.LocalConfig{Dir: dir, AllowedRoots: []string{claim}})
	if err != nil {
		return fmt.Errorf("opening the claim's folder (does %q exist in the claim?): %w", sub, err)
	}
	defer func() { _ = store.Close() }()
	handler, err := understore.NewClaimServer(store, strings.TrimSpace(string(token)), log)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_claim_server_requests_total",
		Help: "Requests to the claim server of a pvc:// Dataset, by method and status code.",
	}, []string{"method", "code"})
	served := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "strata_claim_server_sent_bytes_total",
		Help: "Bytes of the claim's files sent to workers.",
	})
	reg.MustRegister(requests, served)
	health := http.NewServeMux()
	health.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	health.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })

	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", listen, err)
	}
	healthLis, err := net.Listen("tcp", opts.healthListen)
	if err != nil {
		_ = lis.Close()
		return fmt.Errorf("listening on %s: %w", opts.healthListen, err)
	}
	servers := []*http.Server{
		{Handler: promhttp.InstrumentHandlerCounter(requests, countBytes(served, handler)), TLSConfig: understore.ClaimServerTLS(creds), ReadHeaderTimeout: 10 * time.Second},
		{Handler: health, ReadHeaderTimeout: 10 * time.Second},
	}
	log.Info("Serving the claim", "folder", dir, "address", lis.Addr().String(), "identity", creds.Identity(), "health", healthLis.Addr().String())

	var wg sync.WaitGroup
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer func() { stopWatching(); wg.Wait() }()
	wg.Go(func() {
		periodic.Watch(watchCtx, "the certificate in "+opts.tlsDir, opts.refresh, log, readKeyPair(opts.tlsDir), func(raw []byte) error {
			cert, key, _ := bytes.Cut(raw, keyPairSeparator)
			return creds.Set(cert, key)
		})
	})
	done := make(chan error, len(servers))
	go func() { done <- servers[0].ServeTLS(lis, "", "") }()
	go func() { done <- servers[1].Serve(healthLis) }()
	var serveErr error
	select {
	case err := <-done:
		serveErr = fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) && serveErr == nil {
			serveErr = fmt.Errorf("stopping: %w", err)
		}
	}
	return serveErr
}

// The files of the claim server's TLS Secret, as the operator writes them.
const (
	claimTLSCert = "tls.crt"
	claimTLSKey  = "tls.key"
	claimTLSCA   = "ca.crt"
)

// claimServerCredentials are the certificate in dir, trusting the CA beside it.
func claimServerCredentials(dir string) (*pki.Credentials, error) {
	files := pki.Flags{
		CAFile:   filepath.Join(dir, claimTLSCA),
		CertFile: filepath.Join(dir, claimTLSCert),
		KeyFile:  filepath.Join(dir, claimTLSKey),
	}
	creds, _, err := files.Prepare(logr.Discard())
	if err != nil {
		return nil, fmt.Errorf("reading Strata's CA and the certificate in %s: %w", dir, err)
	}
	if id := creds.Identity(); id.Role != pki.RoleClaimServer {
		return nil, fmt.Errorf("the certificate in %s is for %s, not a claim server", dir, id)
	}
	return creds, nil
}

// keyPairSeparator joins a certificate and its key into one content for periodic.Watch, so that
// a pair read while the kubelet swapped the files, refused, is tried again at the next look.
var keyPairSeparator = []byte("\x00")

func readKeyPair(dir string) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		cert, err := os.ReadFile(filepath.Join(dir, claimTLSCert))
		if err != nil {
			return nil, fmt.Errorf("reading the certificate: %w", err)
		}
		key, err := os.ReadFile(filepath.Join(dir, claimTLSKey))
		if err != nil {
			return nil, fmt.Errorf("reading the certificate's key: %w", err)
		}
		return slices.Concat(cert, keyPairSeparator, key), nil
	}
}

// countBytes adds what next writes to counter.
func countBytes(counter prometheus.Counter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(countingWriter{w, counter}, r)
	})
}

type countingWriter struct {
	http.ResponseWriter
	counter prometheus.Counter
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.counter.Add(float64(n))
	return n, err
}

// Unwrap lets http.ResponseController reach the writer's Flush.
func (c countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }
