// Command worker runs a Strata cache worker on one node: its tiered block store (recovered from
// the block index at start), background promotion, and the metrics and health endpoints. The
// data plane, FUSE and registration with the master are added by later components.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/internal/daemon"
)

func main() {
	var opts options
	opts.bind(flag.CommandLine)
	flag.Parse()
	daemon.Main("worker", opts.verbosity, func(ctx context.Context, log logr.Logger) error {
		return run(ctx, opts, log)
	})
}

func run(ctx context.Context, opts options, log logr.Logger) error {
	cfg, err := opts.resolve()
	if err != nil {
		return err
	}
	cfg.Log = log.WithName("tierstore")
	store, err := tierstore.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.Error(err, "closing the tier store")
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if _, err := cache.NewMetrics(reg, store); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	mux.HandleFunc("/healthz", ok)
	// Ready as soon as the store is open: recovery has run, so what it serves is verified.
	mux.HandleFunc("/readyz", ok)
	lis, err := net.Listen("tcp", opts.metricsAddr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", opts.metricsAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return store.Run(gctx) })
	g.Go(func() error {
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving metrics: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), opts.shutdownTimeout)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	log.Info("worker running", "tiers", store.Tiers(), "metrics", lis.Addr().String())
	return g.Wait()
}
