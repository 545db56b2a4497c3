package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/daemon"
)

// serveClaim is `worker serve-claim`: the server the operator runs in a Dataset's namespace
// for a pvc:// source. It serves the folder of the claim mounted at --claim read-only to the
// workers, which send the token in --token-file.
func serveClaim(args []string) int {
	fs := flag.NewFlagSet("serve-claim", flag.ContinueOnError)
	claim := fs.String("claim", "/claim", "where the claim is mounted")
	sub := fs.String("path", "", "the folder of the claim to serve, relative to it")
	tokenFile := fs.String("token-file", "/var/run/strata/claim-token/token", "file holding the bearer token workers send")
	listen := fs.String("listen", fmt.Sprintf(":%d", understore.ClaimServerPort), "address to serve on")
	verbosity := fs.Int("v", 0, "log verbosity: 0 info, 1 debug, 2 trace")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: worker serve-claim [--claim DIR] [--path SUBDIR] [--token-file FILE] [--listen ADDR]")
		return 2
	}
	daemon.Main("claim-server", *verbosity, func(ctx context.Context, log logr.Logger) error {
		return runClaimServer(ctx, *claim, *sub, *tokenFile, *listen, log)
	})
	return 0
}

func runClaimServer(ctx context.Context, claim, sub, tokenFile, listen string, log logr.Logger) error {
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("reading the token: %w", err)
	}
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
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/", promhttp.InstrumentHandlerCounter(requests, countBytes(served, handler)))

	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", listen, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("Serving the claim", "folder", dir, "address", lis.Addr().String())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	select {
	case err := <-done:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("stopping: %w", err)
	}
	return nil
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
