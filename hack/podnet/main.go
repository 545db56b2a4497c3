package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

func main() {
	os.Exit(runMain())
}

// runMain parses the flags, wires the daemon and returns the exit code; it is separate from main so
// its deferred calls run before the process exits.
func runMain() int {
	cfg := DefaultConfig()
	logConfig := textlogger.NewConfig()
	flags := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	flags.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"),
		"Name of the node this instance runs on (default: $NODE_NAME).")
	flags.StringVar(&cfg.CNIConfDir, "cni-conf-dir", cfg.CNIConfDir,
		"Directory the container runtime loads CNI configurations from; "+confListName+" is written there.")
	flags.DurationVar(&cfg.ResyncPeriod, "resync-period", cfg.ResyncPeriod,
		"How often to reconcile without a Node event, so routes deleted by hand come back.")
	flags.IntVar(&cfg.RouteProtocol, "route-protocol", cfg.RouteProtocol,
		"Route protocol number that marks the routes this daemon owns.")
	flags.StringVar(&cfg.ControlPlaneEndpoint, "control-plane-endpoint", os.Getenv("CONTROL_PLANE_ENDPOINT"),
		"API server host:port to use instead of the kubernetes Service, which needs kube-proxy (default: $CONTROL_PLANE_ENDPOINT).")
	logConfig.AddFlags(flags)
	// ExitOnError: a bad flag exits with status 2 after printing the usage.
	_ = flags.Parse(os.Args[1:])

	log := textlogger.NewLogger(logConfig)
	// client-go logs through klog; route it to the same logger and format.
	klog.SetLogger(log)
	if err := cfg.Validate(); err != nil {
		log.Error(err, "Invalid configuration")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx = logr.NewContext(ctx, log)

	client, err := newClient(cfg)
	if err != nil {
		log.Error(err, "Creating the Kubernetes client")
		return 1
	}
	if err := run(ctx, cfg, client, newNetlinkRoutes(cfg.RouteProtocol)); err != nil {
		log.Error(err, "Pod network daemon failed")
		return 1
	}
	return 0
}

// newClient uses the pod's service account. Only the address may be overridden: the token and the
// cluster CA stay, and the API server's certificate names the control-plane endpoint too.
func newClient(cfg Config) (kubernetes.Interface, error) {
	restConfig, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the in-cluster configuration: %w", err)
	}
	if cfg.ControlPlaneEndpoint != "" {
		restConfig.Host = "https://" + cfg.ControlPlaneEndpoint
	}
	restConfig.UserAgent = "strata-podnet"
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("creating the client for %s: %w", restConfig.Host, err)
	}
	return client, nil
}
