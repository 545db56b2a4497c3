// Command worker runs a Strata cache worker on one node: its tiered block store (recovered from
// the block index at start, memory tiers on tmpfs), the gRPC data plane that serves its blocks
// to peers and clients, the Datasets of the node served over FUSE for the CSI plugin,
// short-circuit reads (open block files handed to local clients over a
// Unix socket), its registration and heartbeats with the master, and the metrics and
// health endpoints.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/membership"
	"github.com/strata-cache/strata/cacheworker/mounter"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/shortcircuit"
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
	"github.com/strata-cache/strata/master/masterpb"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "preload":
			os.Exit(preload(os.Args[2:]))
		case "serve-claim":
			os.Exit(serveClaim(os.Args[2:]))
		}
	}
	var opts options
	opts.bind(flag.CommandLine)
	flag.Parse()
	daemon.Main("worker", opts.verbosity, func(ctx context.Context, log logr.Logger) error {
		return run(ctx, opts, log)
	})
}

// How often the policies and checkpoint settings files are read for changes (the kubelet
// updates a ConfigMap's or a Secret's files about once a minute anyway), and how often every
// block's pin is checked again.
const (
	settingsPoll    = 10 * time.Second
	policiesResweep = 5 * time.Minute
)

// How often the blocks of deleted output Datasets are looked for, and how old a block must be
// to be taken for one (a block being written may belong to a Dataset not registered yet).
const (
	orphanSweepInterval = 5 * time.Minute
	orphanGrace         = 10 * time.Minute
)

// handoverRefillInterval is how often the worker checks that the file descriptor store still
// holds its mounts, putting back what a restarted store lost. Until it does, a restart of this
// worker would end those mounts (nothing else holds their connections), so it is short: one
// small request over a Unix socket a second. An upgrade replaces the CSI plugin and the worker
// of a node at about the same time.
const handoverRefillInterval = time.Second

func run(ctx context.Context, opts options, log logr.Logger) (err error) {
	cfg, err := opts.resolve()
	if err != nil {
		return err
	}
	id, err := opts.resolveIdentity()
	if err != nil {
		return err
	}
	if opts.mountMemory {
		if err := tiermount.EnsureMemoryTiers(cfg.Tiers, log.WithName("tiermount")); err != nil {
			return err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	creds, renewer, err := opts.tls.Load(ctx, log.WithName("tls"))
	if err != nil {
		return err
	}
	// The certificate is the worker's word at the master and to its peers: it must be this
	// pool's worker on this node, or the worker would speak for another.
	if cert := creds.Identity(); id.id != "" && cert.WorkerID() != id.id {
		return fmt.Errorf("the certificate is for %s, not for worker %s (--worker-id, or --pool and --node-name)", cert, id.id)
	}
	authorizer, err := authz.New("worker", dataplane.Policy, reg, log.WithName("authz"))
	if err != nil {
		return err
	}

	// Without a master the worker serves its blocks but reports nothing: enough for a single
	// node, and for tests. With one, the directory exists before the store opens, so that the
	// store can tell it of every block that leaves.
	var dir *locations.Directory
	var masters *masterclient.Client
	var peers *dataplane.Peers
	if len(id.masters) > 0 {
		if masters, err = masterclient.New(id.masters, masterclient.Options{
			Logger: log.WithName("master-client"), DialOptions: []grpc.DialOption{creds.DialOption(pki.RoleMaster)},
		}); err != nil {
			return fmt.Errorf("creating the master client: %w", err)
		}
		defer func() { _ = masters.Close() }()
		peers = dataplane.NewPeers(creds.DialOption(pki.RoleWorker))
		defer func() { _ = peers.Close() }()
		dir = locations.NewDirectory(masters, peers, id.id, log.WithName("locations"))
		cfg.OnRemove = func(info tierstore.BlockInfo) {
			if len(info.Origin) > 0 { // only blocks with an origin were reported
				dir.Forget(info)
			}
		}
	}
	// Output files are checkpointed by the worker that holds them; with the store's persist
	// callback its, nothing that exists nowhere else is ever dropped. It needs the master.
	var checkpoints *checkpoint.Checkpointer
	if dir != nil {
		cpMetrics, err := checkpoint.NewMetrics(reg)
		if err != nil {
			return err
		}
		checkpoints = checkpoint.New(checkpoint.Config{Master: masters, Stored: dir.Enqueue, Metrics: cpMetrics, Log: log.WithName("checkpoint")})
		cfg.Persist = checkpoints.Persist
	}

	cfg.Log = log.WithName("tierstore")
	store, err := tierstore.Open(ctx, cfg)
	if err != nil {
		return err
	}
	// From here on, every goroutine runs in g and everything opened is closed once g is done,
	// in the reverse order of opening, whichever way run returns: a goroutine never outlives
	// what it uses.
	ctx, cancel := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(ctx)
	closers := []func(){func() {
		if err := store.Close(); err != nil {
			log.Error(err, "closing the tier store")
		}
	}}
	defer func() {
		cancel()
		if werr := g.Wait(); err == nil {
			err = werr
		}
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()

	if checkpoints != nil {
		checkpoints.Attach(store)
	}
	cacheMetrics, err := cache.NewMetrics(reg, store)
	if err != nil {
		return err
	}
	dpMetrics, err := dataplane.NewMetrics(reg)
	if err != nil {
		return err
	}

	g.Go(func() error { return store.Run(gctx) })
	if renewer != nil {
		g.Go(func() error { renewer.Run(gctx); return nil })
	}

	var stored dataplane.StoredFunc
	var peerReader cache.PeerReader
	ready := func() bool { return true }
	if dir != nil {
		// Blocks the start-up check dropped (torn, corrupt, gone with a rebooted memory tier)
		// may still be listed at the master from before.
		for _, f := range store.Recovery().Findings {
			if f.ID != "" {
				dir.Forget(tierstore.BlockInfo{ID: f.ID})
			}
		}
		member, err := membership.New(membership.Config{
			ID: id.id, Address: id.advertise, Node: id.node, Interval: opts.heartbeat,
			Report: dir.ReportAll, Log: log.WithName("membership"),
		}, masters, store, reg)
		if err != nil {
			return err
		}
		stored, peerReader = dir.Enqueue, dir
		// Ready once the master knows the worker: until then no peer can find its blocks.
		ready = member.Registered
		g.Go(func() error { return member.Run(gctx) })
		g.Go(func() error { return dir.Run(gctx) })
		sweeper := &locations.Sweeper{Master: masters, Store: store, Grace: orphanGrace, Log: log.WithName("sweeper")}
		g.Go(func() error { sweeper.Run(gctx, orphanSweepInterval); return nil })
	}

	dataLis, err := net.Listen("tcp", opts.dataAddr)
	if err != nil {
		return fmt.Errorf("listening on %s for the data plane: %w", opts.dataAddr, err)
	}
	grpcSrv := grpc.NewServer(append(append(daemon.ServerLimits(), creds.ServerOption()), authorizer.ServerOptions()...)...)
	dataServer := dataplane.NewServer(store, stored, opts.blockSize, dpMetrics, log.WithName("dataplane"))
	syncs := &datasetSync{}
	var kept *listings.Store
	if opts.listingsDir != "" {
		if kept, err = listings.Open(opts.listingsDir); err != nil {
			return err
		}
		dataServer.ServeListings(kept, syncs.Mounted)
	}
	workerpb.RegisterWorkerServer(grpcSrv, dataServer)
	workerpb.RegisterDatasetSyncServer(grpcSrv, syncs)
	if opts.mountSocket == "" {
		syncs.serve(noMounts{})
	}
	serveGRPC(g, gctx, grpcSrv, dataLis, "the data plane", opts.shutdownTimeout)

	if opts.shortCircuit != "" {
		scMetrics, err := shortcircuit.NewMetrics(reg)
		if err != nil {
			return err
		}
		scLis, err := unixsock.Listen(opts.shortCircuit)
		if err != nil {
			return fmt.Errorf("listening on %s for short-circuit reads: %w", opts.shortCircuit, err)
		}
		sc := shortcircuit.NewServer(store, log.WithName("shortcircuit"), shortcircuit.WithMetrics(scMetrics))
		g.Go(func() error { return sc.Serve(gctx, scLis) })
	}

	policies := &policy.Applier{Store: store, Log: log.WithName("policy")}
	if opts.policies != "" {
		policies.Applied = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_worker_policies_applied_total",
			Help: "Changes of the pool's CachePolicies file the worker has applied.",
		})
		reg.MustRegister(policies.Applied)
		g.Go(func() error { policies.Run(gctx, opts.policies, settingsPoll, policiesResweep); return nil })
	}

	if checkpoints != nil {
		g.Go(func() error { checkpoints.Run(gctx); return nil })
		if opts.checkpointsURL != "" {
			fetch := settingsFetcher(opts.checkpointsURL, creds)
			g.Go(func() error {
				periodic.Watch(gctx, opts.checkpointsURL, settingsPoll, log.WithName("checkpoint"), fetch, func(raw []byte) error {
					settings, err := checkpoint.Parse(raw)
					if err != nil {
						return err
					}
					checkpoints.Apply(settings)
					return nil
				})
				return nil
			})
		}
	}

	if opts.mountSocket != "" {
		mcfg := mounter.Config{
			MountsDir: opts.mountsDir, Store: store, BlockSize: opts.blockSize, CacheMetrics: cacheMetrics,
			Peers: peerReader, Stored: stored, Pinned: policies.Pinned, FileRoots: splitList(opts.fileRoots),
			ClaimServerTLS: understore.ClaimClientTLS(creds),
			Listings:       kept,
			Log:            log.WithName("mounter"), Registerer: reg,
		}
		if dir != nil {
			outMetrics, err := outputfs.NewMetrics(reg)
			if err != nil {
				return err
			}
			// Outputs are staged on the top tier's file system (tmpfs for MEM), in a folder
			// the tier store's start-up check leaves alone (it only looks at block files).
			mcfg.Outputs = &mounter.Outputs{Master: masters, Locations: dir, Metrics: outMetrics, Checkpoints: checkpoints,
				StagingDir: filepath.Join(cfg.Tiers[0].Dirs[0], ".staging")}
		}
		if kept != nil && masters != nil {
			mcfg.ListingPeers = dataplane.PoolListings{Peers: peers, Workers: poolPeers(masters, id.id)}
		}
		if opts.fdStoreSocket != "" {
			if mcfg.Handovers, err = fdstore.NewClient(opts.fdStoreSocket, opts.pool); err != nil {
				return err
			}
		}
		mounts, err := mounter.New(mcfg)
		if err != nil {
			return err
		}
		// Take over the mounts an earlier worker process left in the file descriptor store, and
		// detach the dead ones, so that the CSI plugin's next publish mounts them afresh.
		if err := mounts.Recover(ctx); err != nil {
			return err
		}
		closers = append(closers, func() {
			if err := mounts.Close(); err != nil {
				log.Error(err, "unmounting the Datasets")
			}
		})
		syncs.serve(mounts.SyncServer())
		g.Go(func() error { mounts.RefillHandovers(gctx, handoverRefillInterval); return nil })
		mountLis, err := unixsock.Listen(opts.mountSocket)
		if err != nil {
			return fmt.Errorf("listening for the CSI plugin's mount requests: %w", err)
		}
		// The CSI node plugin of this node calls over the socket, with its certificate.
		mountSrv := grpc.NewServer(append(append(daemon.ServerLimits(), creds.ServerOption()),
			authorizer.For(mounter.Policy).ServerOptions()...)...)
		workerpb.RegisterMounterServer(mountSrv, mounts)
		serveGRPC(g, gctx, mountSrv, mountLis, "the mount socket", opts.shutdownTimeout)
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	// The store is open, so recovery has run and what it serves is verified; with a master,
	// the worker is ready once registered.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not registered with the master yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	lis, err := net.Listen("tcp", opts.metricsAddr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", opts.metricsAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
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
	log.Info("worker running", "tiers", store.Tiers(), "data", dataLis.Addr().String(), "metrics", lis.Addr().String(),
		"worker", id.id, "masters", id.masters)
	return g.Wait()
}

// serveGRPC serves srv on lis in g, and stops it once gctx ends: gracefully, within timeout.
// Both are started together, so that whatever makes run return stops the server.
func serveGRPC(g *errgroup.Group, gctx context.Context, srv *grpc.Server, lis net.Listener, what string, timeout time.Duration) {
	g.Go(func() error {
		if err := srv.Serve(lis); err != nil {
			return fmt.Errorf("serving %s: %w", what, err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), timeout)
		defer cancel()
		daemon.StopGRPC(sctx, srv)
		return nil
	})
}

// settingsFetcher reads what the operator serves at url to this worker, with its certificate:
// the checkpoint settings, which carry tenants' keys and are served to the pool's workers alone.
func settingsFetcher(url string, creds *pki.Credentials) func(ctx context.Context) ([]byte, error) {
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: creds.ClientConfig(pki.RoleOperator)}}
	return func(ctx context.Context) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("asking the operator: %w", err)
		}
		defer func() { _ = resp.Body.Close() }()
		raw, err := io.ReadAll(io.LimitReader(resp.Body, maxSettings))
		if err != nil {
			return nil, fmt.Errorf("reading the operator's answer: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("the operator answered %s: %s", resp.Status, strings.TrimSpace(string(raw)))
		}
		return raw, nil
	}
}

// maxSettings bounds the settings a worker takes from the operator.
const maxSettings = 16 << 20

// splitList splits a comma-separated flag, dropping empty elements.
func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// preload is `worker preload [--concurrency N] DIR`: the Dataset preload the operator runs as a
// Job that mounts the Dataset's claim at DIR. It reads every file once, so the worker of its node
// caches all of it, prints the totals as JSON, and exits 1 with the failing file named otherwise
// (on stderr, which the Job's FallbackToLogsOnError makes the pod's termination message, which
// the operator reports).
func preload(args []string) int {
	fs := flag.NewFlagSet("preload", flag.ContinueOnError)
	concurrency := fs.Int("concurrency", 4, "files read at once")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: worker preload [--concurrency N] DIR")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	res, err := warmup.Run(ctx, fs.Arg(0), *concurrency, nil)
	if err != nil {
		msg := fmt.Sprintf("preload read %d files (%d bytes) before failing: %v", res.Files, res.Bytes, err)
		fmt.Fprintln(os.Stderr, msg)
		return 1
	}
	out, _ := json.Marshal(struct {
		warmup.Result
		Seconds float64 `json:"seconds"`
	}{res, time.Since(start).Seconds()})
	fmt.Println(string(out))
	return 0
}

// datasetSync is the DatasetSync service of the data-plane port, which serves before the
// mounter has taken over the mounts an earlier worker left: until then a sync or a description
// is refused as UNAVAILABLE (the operator tries again), not answered with "not mounted".
type datasetSync struct {
	workerpb.UnimplementedDatasetSyncServer
	server atomic.Pointer[mounter.SyncService]
}

func (d *datasetSync) serve(s mounter.SyncService) { d.server.Store(&s) }

var errStarting = status.Error(codes.Unavailable, "the worker is starting: its mounts are not taken over yet")

// SyncDataset implements workerpb.DatasetSyncServer.
func (d *datasetSync) SyncDataset(ctx context.Context, req *workerpb.SyncDatasetRequest) (*workerpb.SyncDatasetResponse, error) {
	s := d.server.Load()
	if s == nil {
		return nil, errStarting
	}
	return (*s).SyncDataset(ctx, req)
}

// DescribeDataset implements workerpb.DatasetSyncServer.
func (d *datasetSync) DescribeDataset(ctx context.Context, req *workerpb.DescribeDatasetRequest) (*workerpb.DescribeDatasetResponse, error) {
	s := d.server.Load()
	if s == nil {
		return nil, errStarting
	}
	return (*s).DescribeDataset(ctx, req)
}

// Mounted says whether the worker mounts Dataset uid: not before its mounts are taken over.
func (d *datasetSync) Mounted(uid string) bool {
	s := d.server.Load()
	return s != nil && (*s).Mounted(uid)
}

// noMounts is the sync service of a worker that serves no mounts (no --mount-socket).
type noMounts struct {
	workerpb.UnimplementedDatasetSyncServer
}

func (noMounts) SyncDataset(context.Context, *workerpb.SyncDatasetRequest) (*workerpb.SyncDatasetResponse, error) {
	return &workerpb.SyncDatasetResponse{}, nil
}

func (noMounts) DescribeDataset(context.Context, *workerpb.DescribeDatasetRequest) (*workerpb.DescribeDatasetResponse, error) {
	return &workerpb.DescribeDatasetResponse{}, nil
}

func (noMounts) Mounted(string) bool { return false }

// poolPeers returns the data-plane addresses of the other live workers of this worker's pool
// (worker ids are "<pool>/<node>"), as the master knows them.
func poolPeers(masters *masterclient.Client, self string) func(ctx context.Context) (map[string]string, error) {
	pool, _, _ := strings.Cut(self, "/")
	return func(ctx context.Context) (map[string]string, error) {
		resp, err := masters.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		for _, w := range resp.GetWorkers() {
			if w.GetId() != self && strings.HasPrefix(w.GetId(), pool+"/") && w.GetState() == masterpb.WorkerState_WORKER_STATE_ALIVE {
				out[w.GetId()] = w.GetAddress()
			}
		}
		return out, nil
	}
}
