package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/strata-cache/strata/csi/driver"
	"github.com/strata-cache/strata/csi/endpoint"
	"github.com/strata-cache/strata/csi/registration"
	"github.com/strata-cache/strata/internal/pki"
)

// version is the build's version, set with -ldflags "-X main.version=...".
var version = "dev"

// Modes of the binary.
const (
	modeNode       = "node"
	modeController = "controller"
)

// options are the command-line flags, checked once by resolve.
type options struct {
	mode             string
	csiEndpoint      string
	nodeName         string
	kubeletDir       string
	registrationPath string
	workerSocketDir  string
	stateDir         string
	metricsAddr      string
	vendorVersion    string
	shutdownTimeout  time.Duration
	verbosity        int
	// tls is where the node plugin's certificate comes from: it speaks mutual TLS to the
	// node's workers.
	tls pki.Flags
}

func (o *options) bind(fs *flag.FlagSet) {
	o.tls.Bind(fs)
	fs.StringVar(&o.mode, "mode", "", "What to serve: node (Identity, Node and the kubelet registration socket; a DaemonSet) or controller (Identity and Controller; a Deployment).")
	fs.StringVar(&o.csiEndpoint, "csi-endpoint", "unix:///var/lib/kubelet/plugins/"+driver.DriverName+"/csi.sock",
		"CSI endpoint: unix:///path.sock (the node plugin must use a Unix socket the kubelet can reach) or tcp://host:port.")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of the Kubernetes Node (node mode); defaults to $NODE_NAME. It is the CSI node id.")
	fs.StringVar(&o.kubeletDir, "kubelet-dir", "/var/lib/kubelet",
		"The kubelet's root folder (node mode): target paths must lie under its pods/ folder, and the registration socket goes in its plugins_registry/ folder.")
	fs.StringVar(&o.registrationPath, "kubelet-registration-path", "",
		"Path of the CSI socket on the host, as the kubelet dials it (node mode); defaults to the path of --csi-endpoint.")
	fs.StringVar(&o.workerSocketDir, "worker-socket-dir", "/run/strata",
		"Host folder of the cache workers' sockets (node mode): the worker of pool P serves its Mounter on <dir>/P/mount.sock.")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/strata-csi",
		"Folder of the plugin's state file (publications on a node, output volumes on the controller); it must outlive the pod: a host folder for the node plugin, a persistent volume for the controller.")
	fs.StringVar(&o.metricsAddr, "metrics-addr", ":8080", "Address of /metrics, /healthz and /readyz; empty disables them.")
	fs.StringVar(&o.vendorVersion, "vendor-version", version, "Version reported by GetPluginInfo; defaults to the build's version.")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "Time allowed for calls under way to finish when the plugin stops.")
	fs.IntVar(&o.verbosity, "v", 0, "Log verbosity (0 info, 1 every successful CSI call, 2 trace).")
}

// config is the checked configuration.
type config struct {
	mode             string
	csiEndpoint      endpoint.Endpoint
	nodeName         string
	kubeletDir       string
	registrationPath string
	registrationSock string
	workerSocketDir  string
	stateDir         string
	metricsAddr      string
	vendorVersion    string
	shutdownTimeout  time.Duration
	tls              pki.Flags
}

// resolve checks the flags, once, at start-up.
func (o *options) resolve() (config, error) {
	ep, err := endpoint.Parse(o.csiEndpoint)
	if err != nil {
		return config{}, fmt.Errorf("--csi-endpoint: %w", err)
	}
	if err := absoluteClean("--state-dir", o.stateDir); err != nil {
		return config{}, err
	}
	if o.vendorVersion == "" {
		return config{}, errors.New("--vendor-version must not be empty")
	}
	cfg := config{
		mode: o.mode, csiEndpoint: ep, stateDir: o.stateDir, metricsAddr: o.metricsAddr,
		vendorVersion: o.vendorVersion, shutdownTimeout: o.shutdownTimeout,
	}
	switch o.mode {
	case modeController:
		return cfg, nil
	case modeNode:
	case "":
		return config{}, errors.New("--mode is required: node or controller")
	default:
		return config{}, fmt.Errorf("--mode=%q: want node or controller", o.mode)
	}

	if o.nodeName == "" {
		return config{}, errors.New("--node-name (or $NODE_NAME) is required in node mode: it is the node id the kubelet and the scheduler know")
	}
	if ep.Network != "unix" {
		return config{}, fmt.Errorf("--csi-endpoint=%s: the node plugin serves the kubelet on a Unix socket", ep)
	}

	for flagName, dir := range map[string]string{"--kubelet-dir": o.kubeletDir, "--worker-socket-dir": o.workerSocketDir} {
		if err := absoluteClean(flagName, dir); err != nil {
			return config{}, err
		}
	}
	cfg.nodeName, cfg.kubeletDir, cfg.workerSocketDir = o.nodeName, o.kubeletDir, o.workerSocketDir
	cfg.registrationPath = o.registrationPath
	if cfg.registrationPath == "" {
		cfg.registrationPath = ep.Address
	}
	if err := absoluteClean("--kubelet-registration-path", cfg.registrationPath); err != nil {
		return config{}, err
	}
	cfg.registrationSock = registration.SocketPath(o.kubeletDir, driver.DriverName)
	if o.tls.CAFile == "" {
		return config{}, fmt.Errorf("the node plugin speaks to the node's workers: %w", pki.ErrNoTLS)
	}
	cfg.tls = o.tls
	return cfg, nil
}

func absoluteClean(flagName, p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%s=%q must be a clean absolute path", flagName, p)
	}
	return nil
}
