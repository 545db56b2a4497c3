// Command master runs one replica of the Strata master: the Raft-replicated metadata store,
// its gRPC API, the lost-worker detector and a metrics endpoint.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/daemon"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/cluster"
	"github.com/strata-cache/strata/master/liveness"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/server"
	"github.com/strata-cache/strata/master/store"
)

func main() {
	var opts options
	opts.bind(flag.CommandLine)
	flag.Parse()
	daemon.Main("master", opts.verbosity, func(ctx context.Context, log logr.Logger) error {
		return run(ctx, opts, log)
	})
}

func run(ctx context.Context, opts options, log logr.Logger) error {
	topo, err := opts.resolve()
	if err != nil {
		return err
	}
	log.Info("starting", "id", opts.id, "raftAdvertise", topo.raftAdvertise, "grpcAdvertise", topo.grpcAdvertise,
		"peers", topo.peers, "mayBootstrap", topo.mayBootstrap)

	creds, renewer, err := opts.tls.Load(ctx, log.WithName("tls"))
	if err != nil {
		return err
	}
	if id := creds.Identity(); id != pki.Master(opts.id) {
		return fmt.Errorf("the certificate is for %s, not for master %s (--id)", id, opts.id)
	}

	st, err := store.Open(store.Config{
		ID:                opts.id,
		Dir:               filepath.Clean(opts.dataDir),
		RaftBind:          opts.raftAddr,
		RaftAdvertise:     topo.raftAdvertise,
		RaftTLS:           &store.RaftTLS{Server: creds.ServerConfig(pki.RoleMaster), Client: creds.ClientConfig(pki.RoleMaster)},
		APIAddr:           topo.grpcAdvertise,
		HeartbeatTimeout:  opts.heartbeatTimeout,
		ReadLease:         opts.readLease,
		ElectionTimeout:   opts.electionTimeout,
		SnapshotInterval:  opts.snapshotInterval,
		SnapshotThreshold: opts.snapshotThreshold,
		TrailingLogs:      opts.trailingLogs,
		Logger:            log.WithName("store"),
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := st.Close(); err != nil {
			log.Error(err, "closing the store")
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), store.NewCollector(st))
	rpcMetrics, err := server.NewMetrics(reg)
	if err != nil {
		return fmt.Errorf("registering RPC metrics: %w", err)
	}

	lis, err := net.Listen("tcp", opts.grpcAddr)
	if err != nil {
		return fmt.Errorf("listening for gRPC on %s: %w", opts.grpcAddr, err)
	}
	authorizer, err := authz.New("master", server.Policy, reg, log.WithName("authz"))
	if err != nil {
		return err
	}
	gs := grpc.NewServer(append(daemon.ServerLimits(), creds.ServerOption(),
		grpc.ChainUnaryInterceptor(rpcMetrics.UnaryInterceptor(), authorizer.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(authorizer.StreamInterceptor()))...)
	masterpb.RegisterMasterServer(gs, server.New(st, log.WithName("grpc")))

	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	// Ready once the replica is in a cluster, and, if it joined on an empty disk, holds every
	// write acknowledged before (cluster.Start): a rolling update replaces the next replica only
	// then. Not "has a leader": after a full restart pod 0 must become ready before an
	// OrderedReady StatefulSet starts the peers it needs for a quorum.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "joining the cluster", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	hs := &http.Server{Addr: opts.metricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	g, gctx := errgroup.WithContext(ctx)
	if renewer != nil {
		g.Go(func() error { renewer.Run(gctx); return nil })
	}
	g.Go(func() error {
		if err := gs.Serve(lis); err != nil {
			return fmt.Errorf("serving gRPC: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving metrics: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		// The gRPC server is up first: peers probe this replica while it decides how to start.
		peers, err := client.New(append(topo.peers, topo.grpcAdvertise), client.Options{
			Logger: log.WithName("peers"), DialOptions: []grpc.DialOption{creds.DialOption(pki.RoleMaster)},
		})
		if err != nil {
			return err
		}
		defer func() { _ = peers.Close() }()
		outcome, err := cluster.Start(gctx, st, cluster.ClientPeers{Client: peers}, cluster.Config{
			Peers: topo.peers, MayBootstrap: topo.mayBootstrap, Logger: log.WithName("cluster"),
		})
		if err != nil {
			return err
		}
		ready.Store(true)
		log.Info("in the cluster", "how", outcome)
		return liveness.New(st, liveness.Config{Timeout: opts.lostWorkerTimeout, Logger: log.WithName("liveness")}).Run(gctx)
	})
	g.Go(func() error {
		<-gctx.Done()
		shutdown(opts.shutdownTimeout, st, gs, hs, log)
		return nil
	})
	if err := g.Wait(); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// shutdown hands leadership over (so the cluster does not wait out an election timeout), then
// stops the servers. The store is closed by run.
func shutdown(timeout time.Duration, st *store.Store, gs *grpc.Server, hs *http.Server, log logr.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := st.TransferLeadership(ctx); err != nil {
		log.Error(err, "handing leadership over before stopping")
	}
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		gs.Stop()
		<-stopped
	}
	if err := hs.Shutdown(ctx); err != nil {
		log.Error(err, "stopping the metrics server")
	}
	log.Info("stopped")
}
