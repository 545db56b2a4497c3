// Command operator runs the Strata operator: a controller-runtime manager, leader-elected, with
// the reconcilers of package controllers.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/controllers"
)

const (
	// leaderElectionID names the Lease the replicas of the operator compete for.
	leaderElectionID = "operator.data.strata.dev"
	// eventSource is the component name on the Events the operator records.
	eventSource = "strata-operator"
)

// options are the command-line flags.
type options struct {
	metricsAddr             string
	probeAddr               string
	leaderElect             bool
	leaderElectionNamespace string
	zap                     zap.Options
}

func main() {
	var opts options
	flag.StringVar(&opts.metricsAddr, "metrics-bind-address", ":8080",
		"Address the metrics endpoint (plain HTTP) binds to; 0 disables it.")
	flag.StringVar(&opts.probeAddr, "health-probe-bind-address", ":8081",
		"Address the /healthz and /readyz endpoints bind to.")
	flag.BoolVar(&opts.leaderElect, "leader-elect", true,
		"Elect a leader among the replicas, so that one reconciles at a time.")
	flag.StringVar(&opts.leaderElectionNamespace, "leader-election-namespace", os.Getenv("POD_NAMESPACE"),
		"Namespace of the leader-election Lease; defaults to $POD_NAMESPACE, then to the pod's own namespace.")
	opts.zap.BindFlags(flag.CommandLine)
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts.zap)))
	log := ctrl.Log.WithName("setup")

	if err := run(opts); err != nil {
		log.Error(err, "operator stopped")
		os.Exit(1)
	}
}

func run(opts options) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("registering client-go types: %w", err)
	}
	if err := datav1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("registering %s types: %w", datav1alpha1.GroupVersion, err)
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: opts.metricsAddr},
		HealthProbeBindAddress:  opts.probeAddr,
		LeaderElection:          opts.leaderElect,
		LeaderElectionID:        leaderElectionID,
		LeaderElectionNamespace: opts.leaderElectionNamespace,
		// The process exits as soon as the manager stops, so the Lease can be released at once
		// and the next replica takes over without waiting for it to expire.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}

	if err := (&controllers.TierPoolReconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorderFor(eventSource),
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the TierPool controller: %w", err)
	}

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}

	ctrl.Log.WithName("setup").Info("starting manager", "leaderElect", opts.leaderElect,
		"leaderElectionNamespace", opts.leaderElectionNamespace)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}
