package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/yaml"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/internal/pki"
)

// options are the command-line flags, turned into the store's configuration once by resolve.
type options struct {
	// Identity and peers: what the master knows this worker by and where others reach it.
	workerID       string
	nodeName       string
	pool           string
	masterAddrs    string
	dataAddr       string
	advertiseAddr  string
	heartbeat      time.Duration
	mountMemory    bool
	mountSocket    string
	fdStoreSocket  string
	policies       string
	checkpointsURL string
	mountsDir      string
	keepIdleMounts time.Duration
	blockSize      int64
	fileRoots      string
	// tls is where the worker's certificate comes from: its data plane and its calls to the
	// master and to peers are mutual TLS.
	tls pki.Flags

	tiersFile          string
	indexDir           string
	listingsDir        string
	eviction           string
	lambda             float64
	promotionThreshold int
	metricsAddr        string
	shutdownTimeout    time.Duration
	verbosity          int
}

func (o *options) bind(fs *flag.FlagSet) {
	o.tls.Bind(fs)
	fs.StringVar(&o.workerID, "worker-id", "",
		"Unique id of this worker at the master, such as <pool>/<node>; defaults to <pool>/<node-name>.")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of the Kubernetes Node this worker runs on; defaults to $NODE_NAME.")
	fs.StringVar(&o.pool, "pool", "", "Name of the TierPool this worker serves; its blocks live in a folder of that name under each tier path.")
	fs.StringVar(&o.masterAddrs, "master", "",
		"Comma-separated gRPC addresses of the master replicas; empty runs the worker without a master (no registration, no peer reads).")
	fs.StringVar(&o.dataAddr, "data-addr", ":7100", "Address the gRPC data plane listens on.")
	fs.StringVar(&o.advertiseAddr, "advertise-addr", "",
		"host:port that peers and clients dial to reach the data plane; defaults to $POD_IP and the port of --data-addr.")
	fs.DurationVar(&o.heartbeat, "heartbeat-interval", 3*time.Second, "How often the worker reports its tiers to the master.")
	fs.StringVar(&o.mountSocket, "mount-socket", "",
		"Unix socket of the Mounter service, through which the node's CSI plugin asks the worker to serve Datasets; empty disables it.")
	fs.StringVar(&o.policies, "policies", "",
		"File with the CachePolicies of the pool's Datasets, which the operator keeps up to date; watched and applied live. Empty applies none.")
	fs.StringVar(&o.checkpointsURL, "checkpoints-url", "",
		"https URL where the operator serves the checkpoint targets and settings of the pool's output Datasets, credentials included, to the pool's workers (mutual TLS); polled and applied live. Empty checkpoints nothing, and memory full of output refuses writes.")
	fs.StringVar(&o.fdStoreSocket, "fd-store-socket", "",
		"Unix socket of the CSI node plugin's file descriptor store, which holds the Datasets' FUSE connections so that pods' mounts outlive a worker restart; empty ends them with the worker.")
	fs.StringVar(&o.mountsDir, "mounts-dir", "/var/lib/strata-worker/mounts",
		"Folder of the Datasets' FUSE mount points (one per Dataset UID); a host folder with bidirectional mount propagation.")
	fs.DurationVar(&o.keepIdleMounts, "keep-idle-mounts", 10*time.Minute,
		"How long a Dataset stays mounted on the node after the last pod reading it goes, so that the next pod reads its files "+
			"from the kernel's page cache (which goes with the mount) instead of through the worker; 0 unmounts at once. "+
			"A deleted Dataset is unmounted at once.")
	fs.Int64Var(&o.blockSize, "block-size", 64<<20, "The TierPool's block size in bytes: the unit of caching and transfer.")
	fs.StringVar(&o.fileRoots, "file-source-roots", "",
		"Comma-separated folders that file:// Datasets must lie under (the TierPool's fileSourceRoots); empty allows none.")
	fs.BoolVar(&o.mountMemory, "mount-memory-tiers", true,
		"Mount a tmpfs of the quota's size on each MEM tier directory that is not already on tmpfs (needs CAP_SYS_ADMIN).")
	fs.StringVar(&o.tiersFile, "tiers", "/etc/strata/tiers.yaml",
		"YAML or JSON file with the TierPool's spec.tiers: a list of {name, medium, paths, quota, watermarks}.")
	fs.StringVar(&o.listingsDir, "listings-dir", "",
		"folder that keeps the last good listing of every Dataset mounted here, so that a Dataset can be mounted while its source is unreachable; it must survive the pod (empty: none kept)")
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

// identity is who the worker is at the master and where it is reached; zero when it runs
// without a master.
type identity struct {
	id, node, advertise string
	masters             []string
}

// resolveIdentity checks the flags that connect the worker to the master, once, at start-up.
func (o *options) resolveIdentity() (identity, error) {
	if o.masterAddrs == "" {
		return identity{}, nil
	}
	id := identity{id: o.workerID, node: o.nodeName, advertise: o.advertiseAddr, masters: splitList(o.masterAddrs)}
	if id.node == "" {
		return identity{}, errors.New("--node-name (or $NODE_NAME) is required with --master: the operator declares a node's workers lost by it")
	}
	if id.id == "" {
		if o.pool == "" {
			return identity{}, errors.New("--worker-id or --pool is required with --master: the master needs a unique id per worker")
		}
		id.id = o.pool + "/" + id.node
	}
	if id.advertise == "" {
		_, port, err := net.SplitHostPort(o.dataAddr)
		if err != nil {
			return identity{}, fmt.Errorf("--data-addr=%q: %w", o.dataAddr, err)
		}
		ip := os.Getenv("POD_IP")
		if ip == "" {
			return identity{}, errors.New("--advertise-addr (or $POD_IP) is required with --master: peers must know where to reach this worker")
		}
		id.advertise = net.JoinHostPort(ip, port)
	}
	if _, _, err := net.SplitHostPort(id.advertise); err != nil {
		return identity{}, fmt.Errorf("--advertise-addr=%q must be host:port: %w", id.advertise, err)
	}
	return id, nil
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
	if o.keepIdleMounts < 0 {
		return tierstore.Config{}, fmt.Errorf("--keep-idle-mounts=%s: give a duration of 0 or more (0 unmounts a Dataset as soon as no pod of the node mounts it)", o.keepIdleMounts)
	}
	ev := eviction.Config{Kind: eviction.Kind(o.eviction)}
	if ev.Kind == eviction.LRFU {
		ev.Lambda = o.lambda
	}
	if ev.Kind == eviction.MRD {
		return tierstore.Config{}, errors.New("--eviction=MRD: MRD is a CachePolicy's, which ranks the Datasets the lineage graph knows; " +
			"a tier's own order is LRU, LFU or LRFU")
	}
	if err := ev.Validate(); err != nil {
		return tierstore.Config{}, err
	}
	storeTiers := tierstore.TiersFromAPI(tiers)
	if o.pool != "" {
		// Each pool keeps its blocks in a folder of its own under every tier path: two pools
		// that select the same node with the same path would otherwise each delete the other's
		// blocks as files missing from its index.
		for i := range storeTiers {
			for j, d := range storeTiers[i].Dirs {
				storeTiers[i].Dirs[j] = filepath.Join(d, o.pool)
			}
		}
	}
	return tierstore.Config{
		DatasetOf:          policy.DatasetOf,
		Tiers:              storeTiers,
		IndexDir:           o.indexDir,
		Eviction:           ev,
		PromotionThreshold: o.promotionThreshold,
	}, nil
}
