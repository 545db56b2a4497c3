package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/tierstore"
)

// options are the command-line flags, turned into the store's configuration once by resolve.
type options struct {
	tiersFile          string
	indexDir           string
	eviction           string
	lambda             float64
	promotionThreshold int
	metricsAddr        string
	shutdownTimeout    time.Duration
	verbosity          int
}

func (o *options) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.tiersFile, "tiers", "/etc/strata/tiers.yaml",
		"YAML or JSON file with the TierPool's spec.tiers: a list of {name, medium, paths, quota, watermarks}.")
	fs.StringVar(&o.indexDir, "index-dir", "/var/lib/strata-worker/index",
		"Directory of the block index; keep it on a non-volatile disk so that blocks on PMEM/NVMe/SSD/HDD survive restarts.")
	fs.StringVar(&o.eviction, "eviction", string(eviction.LRU), "Eviction policy of every tier: LRU, LFU or LRFU.")
	fs.Float64Var(&o.lambda, "lrfu-lambda", 0.5, "LRFU's weight of recency against frequency, in [0, 1]: 0 is LFU, 1 is LRU.")
	fs.IntVar(&o.promotionThreshold, "promotion-threshold", tierstore.DefaultPromotionThreshold,
		"Reads a block in a lower tier needs before it moves up a tier.")
	fs.StringVar(&o.metricsAddr, "metrics-addr", ":8080", "Address of /metrics, /healthz and /readyz.")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "Time allowed for a graceful stop.")
	fs.IntVar(&o.verbosity, "v", 0, "Log verbosity (0 info, 1 debug, 2 trace).")
}

// resolve reads the tiers file and returns the store's configuration; tierstore.Open
// validates the rest.
func (o *options) resolve() (tierstore.Config, error) {
	raw, err := os.ReadFile(o.tiersFile)
	if err != nil {
		return tierstore.Config{}, fmt.Errorf("reading the tiers file: %w", err)
	}
	var tiers []datav1alpha1.Tier
	if err := yaml.UnmarshalStrict(raw, &tiers); err != nil {
		return tierstore.Config{}, fmt.Errorf("parsing the tiers file %s: %w", o.tiersFile, err)
	}
	if len(tiers) == 0 {
		return tierstore.Config{}, fmt.Errorf("the tiers file %s lists no tiers", o.tiersFile)
	}
	ev := eviction.Config{Kind: eviction.Kind(o.eviction)}
	if ev.Kind == eviction.LRFU {
		ev.Lambda = o.lambda
	}
	if err := ev.Validate(); err != nil {
		return tierstore.Config{}, err
	}
	return tierstore.Config{
		Tiers:              tierstore.TiersFromAPI(tiers),
		IndexDir:           o.indexDir,
		Eviction:           ev,
		PromotionThreshold: o.promotionThreshold,
	}, nil
}
