package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/callerpod"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/membership"
	"github.com/strata-cache/strata/cacheworker/mounter"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/replication"
	"github.com/strata-cache/strata/cacheworker/tiermount"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/warmup"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/daemon"
	"github.com/strata-cache/strata/internal/fdstore"
	"github.com/strata-cache/strata/internal/periodic"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/unixsock"
	masterclient "github.com/strata-cache/strata/master/client"
)

// worker is a worker process's parts, built and not yet started. build opens and makes every
// part and registers what each runs (tasks) and what closes it (closers); run starts the tasks,
// each in a goroutine it owns, and once all have returned closes the parts in the reverse
// order of opening. A worker that fails to build starts nothing and closes what it opened, so
// no goroutine ever outlives what it uses.
type worker struct {
	log     logr.Logger
	opts    options
	id      identity
	reg     *prometheus.Registry
	creds   *pki.Credentials
	authz   *authz.Authorizer
	tasks   []func(ctx context.Context) error
	closers []func()

	// The master's parts; nil without a master.
	masters     *masterclient.Client
	peers       *dataplane.Peers
	dir         *locations.Directory
	checkpoints *checkpoint.Checkpointer

	store *tierstore.Store
	// stored reports a block stored to the master, and peerReader reads blocks other workers
	// hold; both nil without a master.
	stored     dataplane.StoredFunc
	peerReader cache.PeerReader
	// ready says whether the worker serves (the master knows it).
	ready func() bool

	syncs    *datasetSync
	kept     *listings.Store
	policies *policy.Applier
	// summary is what the worker logs once it runs.
	summary []any
}

// goes registers a task that runs while the worker runs.
func (w *worker) goes(task func(ctx context.Context) error) { w.tasks = append(w.tasks, task) }

// closes registers what closes a part once every task has returned.
func (w *worker) closes(f func()) { w.closers = append(w.closers, f) }

func (w *worker) close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
	w.closers = nil
}

// run starts every task and waits until ctx ends or one fails, which stops the others; then it
// closes every part.
func (w *worker) run(ctx context.Context) error {
	defer w.close()
	g, gctx := errgroup.WithContext(ctx)
	for _, task := range w.tasks {
		g.Go(func() error { return task(gctx) })
	}
	w.log.Info("worker running", w.summary...)
	return g.Wait()
}

// build makes every part of the worker opts describe, in the order each needs the others,
// and starts none.
func build(ctx context.Context, opts options, log logr.Logger) (_ *worker, err error) {
	w := &worker{log: log, opts: opts, reg: prometheus.NewRegistry(), ready: func() bool { return true }}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	cfg, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if w.id, err = opts.resolveIdentity(); err != nil {
		return nil, err
	}
	if opts.mountMemory {
		if err := tiermount.EnsureMemoryTiers(cfg.Tiers, log.WithName("tiermount")); err != nil {
			return nil, err
		}
	}
	w.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := w.buildIdentity(ctx); err != nil {
		return nil, err
	}
	if len(w.id.masters) > 0 {
		if err := w.buildMasterParts(&cfg); err != nil {
			return nil, err
		}
	}
	if err := w.buildStore(ctx, cfg); err != nil {
		return nil, err
	}
	cacheMetrics, err := cache.NewMetrics(w.reg, w.store)
	if err != nil {
		return nil, err
	}
	if err := w.buildDataPlane(); err != nil {
		return nil, err
	}
	if err := w.buildSettings(); err != nil {
		return nil, err
	}
	if opts.mountSocket != "" {
		if err := w.buildMounter(ctx, cacheMetrics, cfg.Tiers[0].Dirs[0]); err != nil {
			return nil, err
		}
	}
	if err := w.buildHTTP(); err != nil {
		return nil, err
	}
	return w, nil
}

// buildIdentity loads the worker's certificate, which must be this pool's worker on this node
// (it is the worker's word at the master and to its peers), and its authorizer.
func (w *worker) buildIdentity(ctx context.Context) error {
	creds, renewer, err := w.opts.tls.Load(ctx, w.log.WithName("tls"))
	if err != nil {
		return err
	}
	if cert := creds.Identity(); w.id.id != "" && cert.WorkerID() != w.id.id {
		return fmt.Errorf("the certificate is for %s, not for worker %s (--worker-id, or --pool and --node-name)", cert, w.id.id)
	}
	w.creds = creds
	if renewer != nil {
		w.goes(func(ctx context.Context) error { renewer.Run(ctx); return nil })
	}
	w.authz, err = authz.New("worker", dataplane.Policy, w.reg, w.log.WithName("authz"))
	return err
}

// buildMasterParts makes the master client, the peers' connections and the block directory,
// before the store opens, so that the store can tell the directory of every block that leaves;
// and the checkpointer of outputs, which the store asks before it drops a block that exists
// nowhere else. Without a master the worker serves its blocks but reports nothing: enough for a
// single node, and for tests.
func (w *worker) buildMasterParts(cfg *tierstore.Config) error {
	masters, err := masterclient.New(w.id.masters, masterclient.Options{
		Logger: w.log.WithName("master-client"), DialOptions: []grpc.DialOption{w.creds.DialOption(pki.RoleMaster)},
	})
	if err != nil {
		return fmt.Errorf("creating the master client: %w", err)
	}
	w.masters = masters
	w.closes(func() { _ = masters.Close() })
	w.peers = dataplane.NewPeers(w.creds.DialOption(pki.RoleWorker))
	w.closes(func() { _ = w.peers.Close() })
	w.dir = locations.NewDirectory(masters, w.peers, w.id.id, w.log.WithName("locations"))
	cfg.OnRemove = func(info tierstore.BlockInfo) {
		if len(info.Origin) > 0 { // only blocks with an origin were reported
			w.dir.Forget(info)
		}
	}
	cpMetrics, err := checkpoint.NewMetrics(w.reg)
	if err != nil {
		return err
	}
	w.checkpoints = checkpoint.New(checkpoint.Config{Master: masters, Stored: w.dir.Enqueue, Metrics: cpMetrics, Log: w.log.WithName("checkpoint")})
	cfg.Persist = w.checkpoints.Persist
	return nil
}

// buildStore opens the tier store (its start-up check runs here) and, with a master, the parts
// that keep the master's view of it: membership, the directory's reports and the sweeper of
// blocks of deleted outputs.
func (w *worker) buildStore(ctx context.Context, cfg tierstore.Config) error {
	cfg.Log = w.log.WithName("tierstore")
	store, err := tierstore.Open(ctx, cfg)
	if err != nil {
		return err
	}
	w.store = store
	w.closes(func() {
		if err := store.Close(); err != nil {
			w.log.Error(err, "closing the tier store")
		}
	})
	w.goes(store.Run)
	if w.dir == nil {
		return nil
	}
	w.checkpoints.Attach(store)
	// Blocks the start-up check dropped (torn, corrupt, gone with a rebooted memory tier) may
	// still be listed at the master from before.
	for _, f := range store.Recovery().Findings {
		if f.ID != "" {
			w.dir.Forget(tierstore.BlockInfo{ID: f.ID})
		}
	}
	member, err := membership.New(membership.Config{
		ID: w.id.id, Address: w.id.advertise, Node: w.id.node, Interval: w.opts.heartbeat,
		Report: w.dir.ReportAll, Log: w.log.WithName("membership"),
	}, w.masters, store, w.reg)
	if err != nil {
		return err
	}
	w.stored, w.peerReader = w.dir.Enqueue, w.dir
	// Ready once the master knows the worker: until then no peer can find its blocks.
	w.ready = member.Registered
	w.goes(member.Run)
	w.goes(w.dir.Run)
	sweeper := &locations.Sweeper{Master: w.masters, Store: store, Grace: orphanGrace, Log: w.log.WithName("sweeper")}
	w.goes(func(ctx context.Context) error { sweeper.Run(ctx, orphanSweepInterval); return nil })
	return nil
}

// buildDataPlane makes the gRPC data plane (blocks, kept listings, Dataset syncs).
func (w *worker) buildDataPlane() error {
	dpMetrics, err := dataplane.NewMetrics(w.reg)
	if err != nil {
		return err
	}
	lis, err := w.listen(w.opts.dataAddr, "the data plane")
	if err != nil {
		return err
	}
	srv := grpc.NewServer(append(append(daemon.ServerLimits(), w.creds.ServerOption()), w.authz.ServerOptions()...)...)
	dataServer := dataplane.NewServer(w.store, w.stored, w.opts.blockSize, dpMetrics, w.log.WithName("dataplane"))
	w.syncs = &datasetSync{}
	if w.opts.listingsDir != "" {
		if w.kept, err = listings.Open(w.opts.listingsDir); err != nil {
			return err
		}
		dataServer.ServeListings(w.kept, w.syncs.Mounted)
	}
	workerpb.RegisterWorkerServer(srv, dataServer)
	workerpb.RegisterDatasetSyncServer(srv, w.syncs)
	if w.opts.mountSocket == "" {
		w.syncs.serve(noMounts{})
	}
	w.servesGRPC(srv, lis, "the data plane")
	w.summary = append(w.summary, "data", lis.Addr().String())
	return nil
}

// buildSettings makes what follows the pool's settings: its CachePolicies file, and the
// checkpoint settings the operator serves.
func (w *worker) buildSettings() error {
	w.policies = &policy.Applier{Store: w.store, Log: w.log.WithName("policy")}
	if w.opts.policies != "" {
		w.policies.Applied = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_worker_policies_applied_total",
			Help: "Changes of the pool's CachePolicies file the worker has applied.",
		})
		w.reg.MustRegister(w.policies.Applied)
		w.goes(func(ctx context.Context) error {
			w.policies.Run(ctx, w.opts.policies, settingsPoll, policiesResweep)
			return nil
		})
	}
	if w.dir == nil {
		return nil // without a master, neither replicas nor checkpoints
	}
	repMetrics, err := replication.NewMetrics(w.reg)
	if err != nil {
		return err
	}
	replicator := replication.New(replication.Config{
		Self: w.id.id, Node: w.id.node, Store: w.store, Master: w.masters, Sender: w.peers,
		Policies: w.policies.Current, Metrics: repMetrics, Log: w.log.WithName("replication"),
	})
	w.goes(func(ctx context.Context) error { replicator.Run(ctx, replicationPass); return nil })
	w.goes(func(ctx context.Context) error { w.checkpoints.Run(ctx); return nil })
	if url := w.opts.checkpointsURL; url != "" {
		fetch := settingsFetcher(url, w.creds)
		w.goes(func(ctx context.Context) error {
			periodic.Watch(ctx, url, settingsPoll, w.log.WithName("checkpoint"), fetch, func(raw []byte) error {
				settings, err := checkpoint.Parse(raw)
				if err != nil {
					return err
				}
				w.checkpoints.Apply(settings)
				return nil
			})
			return nil
		})
	}
	return nil
}

// buildMounter makes the mounter that serves the node's Datasets to the CSI plugin, takes over
// the mounts an earlier worker process left in the file descriptor store (detaching the dead
// ones, so that the plugin's next publish mounts them afresh), and its socket. Outputs are
// staged in stagingRoot, the top tier's file system (tmpfs for MEM).
func (w *worker) buildMounter(ctx context.Context, cacheMetrics *cache.Metrics, stagingRoot string) error {
	mcfg := mounter.Config{
		MountsDir: w.opts.mountsDir, Store: w.store, BlockSize: w.opts.blockSize, CacheMetrics: cacheMetrics,
		Peers: w.peerReader, Stored: w.stored, Pinned: w.policies.Pinned, FileRoots: splitList(w.opts.fileRoots),
		ClaimServerTLS: understore.ClaimClientTLS(w.creds),
		Listings:       w.kept, KeepIdle: w.opts.keepIdleMounts, LoaderUID: warmup.LoaderUID,
		Log: w.log.WithName("mounter"), Registerer: w.reg,
	}
	if w.dir != nil {
		outMetrics, err := outputfs.NewMetrics(w.reg)
		if err != nil {
			return err
		}
		// In a folder the tier store's start-up check leaves alone (it only looks at block files).
		mcfg.Outputs = &mounter.Outputs{Master: w.masters, Locations: w.dir, Metrics: outMetrics, Checkpoints: w.checkpoints,
			StagingDir: filepath.Join(stagingRoot, ".staging"), KeepsReadCopies: w.policies.KeepsReadCopies,
			Callers: w.callerOf}
	}
	if w.kept != nil && w.masters != nil {
		mcfg.ListingPeers = dataplane.PoolListings{Peers: w.peers, Workers: poolPeers(w.masters, w.id.id)}
	}
	if w.opts.fdStoreSocket != "" {
		var err error
		if mcfg.Handovers, err = fdstore.NewClient(w.opts.fdStoreSocket, w.opts.pool); err != nil {
			return err
		}
	}
	mounts, err := mounter.New(mcfg)
	if err != nil {
		return err
	}
	w.closes(func() {
		if err := mounts.Close(); err != nil {
			w.log.Error(err, "unmounting the Datasets")
		}
	})
	if err := mounts.Recover(ctx); err != nil {
		return err
	}
	w.syncs.serve(mounts.SyncServer())
	w.goes(func(ctx context.Context) error { mounts.RefillHandovers(ctx, handoverRefillInterval); return nil })
	lis, err := w.listenUnix(w.opts.mountSocket, "the CSI plugin's mount requests")
	if err != nil {
		return err
	}
	// The CSI node plugin of this node calls over the socket, with its certificate.
	srv := grpc.NewServer(append(append(daemon.ServerLimits(), w.creds.ServerOption()),
		w.authz.For(mounter.Policy).ServerOptions()...)...)
	workerpb.RegisterMounterServer(srv, mounts)
	w.servesGRPC(srv, lis, "the mount socket")
	return nil
}

// buildHTTP makes the metrics and health endpoints. The store is open by then, so recovery has
// run and what the worker serves is verified; with a master, it is ready once registered.
func (w *worker) buildHTTP() error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{Registry: w.reg}))
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) { _, _ = rw.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !w.ready() {
			http.Error(rw, "not registered with the master yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = rw.Write([]byte("ok\n"))
	})
	lis, err := w.listen(w.opts.metricsAddr, "metrics")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	w.goes(func(context.Context) error {
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving metrics: %w", err)
		}
		return nil
	})
	w.goes(func(ctx context.Context) error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.shutdownTimeout)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	w.summary = append(w.summary, "tiers", w.store.Tiers(), "metrics", lis.Addr().String(), "worker", w.id.id, "masters", w.id.masters)
	return nil
}

// listen listens on TCP addr for what; the listener is closed with the worker (a server that
// served it has closed it already, which is harmless).
func (w *worker) listen(addr, what string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s for %s: %w", addr, what, err)
	}
	w.closes(func() { _ = lis.Close() })
	return lis, nil
}

// listenUnix is listen on a Unix socket at path.
func (w *worker) listenUnix(path, what string) (*net.UnixListener, error) {
	lis, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s for %s: %w", path, what, err)
	}
	w.closes(func() { _ = lis.Close() })
	return lis, nil
}

// servesGRPC registers serving srv on lis, and stopping it once the worker stops: gracefully,
// within the shutdown timeout.
func (w *worker) servesGRPC(srv *grpc.Server, lis net.Listener, what string) {
	w.goes(func(context.Context) error {
		if err := srv.Serve(lis); err != nil {
			return fmt.Errorf("serving %s: %w", what, err)
		}
		return nil
	})
	w.goes(func(ctx context.Context) error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.shutdownTimeout)
		defer cancel()
		daemon.StopGRPC(sctx, srv)
		return nil
	})
}

// callerOf is the pod and container of the process pid (of the node's PID namespace, which the
// worker shares), for the output mounts to seal files as that pod's attempt.
func (w *worker) callerOf(pid uint32) (callerpod.Caller, bool) {
	c, ok, err := callerpod.Of(pid)
	if err != nil {
		w.log.V(1).Info("cannot tell which pod writes an output file; it is published when closed", "pid", pid, "error", err.Error())
	}
	return c, ok
}
