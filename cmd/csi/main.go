// Command csi runs Strata's CSI driver csi.strata.dev. With --mode=node (a DaemonSet) it
// serves the Identity and Node services on the kubelet's CSI socket and registers itself with
// the kubelet; with --mode=controller (a Deployment) it serves Identity and Controller for
// dynamic provisioning of output volumes. Both serve Prometheus metrics and health endpoints.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/strata-cache/strata/csi/bindmount"
	"github.com/strata-cache/strata/csi/driver"
	"github.com/strata-cache/strata/csi/endpoint"
	"github.com/strata-cache/strata/csi/registration"
	"github.com/strata-cache/strata/internal/daemon"
	"github.com/strata-cache/strata/internal/fdstore"
	"github.com/strata-cache/strata/internal/pki"
)

func main() {
	var opts options
	opts.bind(flag.CommandLine)
	flag.Parse()
	daemon.Main("csi", opts.verbosity, func(ctx context.Context, log logr.Logger) error {
		cfg, err := opts.resolve()
		if err != nil {
			return err
		}
		return run(ctx, cfg, log)
	})
}

func run(ctx context.Context, cfg config, log logr.Logger) error {
	// k8s.io/mount-utils logs through klog: into the same JSON log.
	klog.SetLogger(log.WithName("mount"))
	log = log.WithValues("mode", cfg.mode)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := driver.NewMetrics(reg)
	if err != nil {
		return err
	}
	grpcSrv := grpc.NewServer(append(daemon.ServerLimits(), grpc.UnaryInterceptor(metrics.UnaryInterceptor(log.WithName("calls"))))...)

	var regSrv *registration.Server
	var fds *fdstore.Server
	var renewer *pki.Renewer
	switch cfg.mode {
	case modeNode:
		// The plugin's word to the node's workers; it can mount nothing new without it. It is
		// had in the background: the plugin holds the pods' mounts (the fdstore) and unmounts
		// whatever the issuer's state, and a publish before the certificate says so.
		creds, r, err := cfg.tls.Prepare(log.WithName("tls"))
		if err != nil {
			return err
		}
		if r == nil {
			if err := checkIdentity(creds, cfg.nodeName); err != nil {
				return err
			}
		}
		renewer = r
		workers := driver.WorkerSockets{Dir: cfg.workerSocketDir, Node: cfg.nodeName, Credentials: creds}
		node, err := driver.NewNode(driver.NodeConfig{
			NodeID: cfg.nodeName, KubeletDir: cfg.kubeletDir, StateDir: cfg.stateDir,
			Mounter: bindmount.New(), Workers: workers, Log: log.WithName("node"),
		})
		if err != nil {
			return err
		}
		csi.RegisterIdentityServer(grpcSrv, driver.NewIdentity(cfg.vendorVersion, workers.AnyAnswering))
		csi.RegisterNodeServer(grpcSrv, node)
		// The workers' FUSE connections are held here, so that pods' mounts outlive a worker
		// restart; this plugin never touches a pod's mount, so its own restarts are harmless
		// (the workers put their mounts back).
		fds = fdstore.NewServer(log.WithName("fdstore"))
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "strata", Subsystem: "csi", Name: "fdstore_entries",
			Help: "FUSE mounts of the node's workers whose connections the node plugin holds, so that they outlive a worker restart.",
		}, func() float64 { return float64(fds.Len()) }))
		if regSrv, err = registration.New(registration.Config{
			DriverName: driver.DriverName, Endpoint: cfg.registrationPath, Log: log.WithName("registration"),
		}); err != nil {
			return err
		}
	case modeController:
		controller, err := driver.NewController(driver.ControllerConfig{StateDir: cfg.stateDir, Log: log.WithName("controller")})
		if err != nil {
			return err
		}
		csi.RegisterIdentityServer(grpcSrv, driver.NewIdentity(cfg.vendorVersion, nil))
		csi.RegisterControllerServer(grpcSrv, controller)
	}

	var metricsLis net.Listener
	if cfg.metricsAddr != "" {
		if metricsLis, err = net.Listen("tcp", cfg.metricsAddr); err != nil {
			return fmt.Errorf("listening on %s for metrics: %w", cfg.metricsAddr, err)
		}
	}
	// The CSI socket listens before the registration socket appears: the kubelet calls
	// NodeGetInfo as soon as it has registered the driver.
	csiLis, err := endpoint.Listen(cfg.csiEndpoint)
	if err != nil {
		if metricsLis != nil {
			_ = metricsLis.Close()
		}
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	if renewer != nil {
		g.Go(func() error {
			if err := renewer.First(gctx); err != nil {
				return err
			}
			if err := checkIdentity(renewer.Credentials, cfg.nodeName); err != nil {
				return err
			}
			renewer.Run(gctx)
			return nil
		})
	}
	if fds != nil {
		if err := fds.Start(fdstore.SocketPath(cfg.workerSocketDir)); err != nil {
			return err
		}
		g.Go(func() error { <-gctx.Done(); return fds.Stop() })
		workers := driver.WorkerSockets{Dir: cfg.workerSocketDir}
		reaper := &fdstore.Reaper{Store: fds, Grace: abandonedMountsGrace, Log: log.WithName("fdstore"),
			Alive: func(ctx context.Context, pool string) bool {
				var d net.Dialer
				dctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				c, err := d.DialContext(dctx, "unix", workers.Socket(pool))
				if err != nil {
					return false
				}
				_ = c.Close()
				return true
			}}
		g.Go(func() error { reaper.Run(gctx, time.Minute); return nil })
	}
	g.Go(func() error {
		if err := grpcSrv.Serve(csiLis); err != nil {
			return fmt.Errorf("serving CSI on %s: %w", cfg.csiEndpoint, err)
		}
		return nil
	})
	if regSrv != nil {
		g.Go(func() error {
			return regSrv.Serve(gctx, cfg.registrationSock,
				append(daemon.ServerLimits(), grpc.UnaryInterceptor(metrics.UnaryInterceptor(log.WithName("registration"))))...)
		})
	}
	var httpSrv *http.Server
	if metricsLis != nil {
		httpSrv = &http.Server{Handler: observability(reg, regSrv), ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			if err := httpSrv.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving metrics: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), cfg.shutdownTimeout)
		defer cancel()
		daemon.StopGRPC(sctx, grpcSrv)
		if httpSrv != nil {
			return httpSrv.Shutdown(sctx)
		}
		return nil
	})
	log.Info("CSI driver running", "driver", driver.DriverName, "version", cfg.vendorVersion,
		"endpoint", cfg.csiEndpoint.String(), "node", cfg.nodeName, "registration", cfg.registrationSock, "metrics", cfg.metricsAddr)
	return g.Wait()
}

// checkIdentity refuses a certificate that is not this node's CSI node plugin's.
func checkIdentity(creds *pki.Credentials, node string) error {
	if id := creds.Identity(); id != pki.CSINode(node) {
		return fmt.Errorf("the certificate is for %s, not for the CSI node plugin of %s (--node-name)", id, node)
	}
	return nil
}

// abandonedMountsGrace is how long the node plugin keeps holding the mounts of a pool whose
// worker does not answer: far longer than a restart or an upgrade takes, so that only a
// deleted pool's mounts are dropped.
const abandonedMountsGrace = 10 * time.Minute

// observability serves /metrics, /healthz and /readyz. The node plugin is ready once the
// kubelet has registered it; the controller as soon as it serves.
func observability(reg *prometheus.Registry, regSrv *registration.Server) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if regSrv != nil && !regSrv.Registered() {
			http.Error(w, "the kubelet has not registered the driver yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
