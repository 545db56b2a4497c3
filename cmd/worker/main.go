// Command worker runs a Strata cache worker on one node: its tiered block store (recovered from
// the block index at start, memory tiers on tmpfs), the gRPC data plane that serves its blocks
// to peers, the Datasets of the node served over FUSE for the CSI plugin, its registration
// and heartbeats with the master, and the metrics and health endpoints.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/mounter"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/warmup"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/daemon"
	"github.com/strata-cache/strata/internal/pki"
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

// replicationPass is how often the worker looks for blocks it holds that lack the replicas
// their CachePolicy asks for: a replica is made within about this long of the seal, and again
// within about this long (plus replication.DefaultRecheck) of a node's loss.
const replicationPass = 2 * time.Second

// handoverRefillInterval is how often the worker checks that the file descriptor store still
// holds its mounts, putting back what a restarted store lost. Until it does, a restart of this
// worker would end those mounts (nothing else holds their connections), so it is short: one
// small request over a Unix socket a second. An upgrade replaces the CSI plugin and the worker
// of a node at about the same time.
const handoverRefillInterval = time.Second

// run builds a worker and runs it until ctx ends or a part of it fails.
func run(ctx context.Context, opts options, log logr.Logger) error {
	w, err := build(ctx, opts, log)
	if err != nil {
		return err
	}
	return w.run(ctx)
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

// preload is `worker preload [--concurrency N] [--path GLOB]... [--metadata-only | --percent P
// --block-size B] DIR`: the
// Dataset preload and the DataLoad runs the operator runs as Jobs that mount the Dataset's claim
// at DIR. It reads the selected files once (every file without --path), so the worker of its
// node caches them, prints the totals as JSON, and exits 1 with the failing file named
// otherwise (on stderr, which the Job's FallbackToLogsOnError makes the pod's termination
// message, which the operator reports).
func preload(args []string) int {
	fs := flag.NewFlagSet("preload", flag.ContinueOnError)
	opts := warmup.Options{}
	fs.IntVar(&opts.Concurrency, "concurrency", 4, "files read at once")
	fs.Func("path", "a glob of the files to read, relative to DIR (\"train/*.parquet\", \"labels/**\"); repeat for more; none reads every file",
		func(p string) error {
			c, err := policy.Compile(p)
			if err != nil {
				return err
			}
			opts.Paths = append(opts.Paths, c)
			return nil
		})
	fs.BoolVar(&opts.MetadataOnly, "metadata-only", false, "look the files up without reading them: the node lists the Dataset and keeps its listing")
	fs.IntVar(&opts.Percent, "percent", 100, "read this share of each file's blocks (of --block-size bytes), spread over the file")
	fs.Int64Var(&opts.BlockSize, "block-size", 0, "the TierPool's block size, which --percent counts in")
	usage := "usage: worker preload [--concurrency N] [--path GLOB]... [--metadata-only | --percent P --block-size B] DIR"
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, usage)
		return 2
	}
	if opts.Percent < 1 || opts.Percent > 100 || (opts.Percent < 100 && opts.BlockSize <= 0) {
		fmt.Fprintf(os.Stderr, "--percent %d: give 1 to 100, and below 100 the --block-size it counts in\n%s\n", opts.Percent, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	res, err := warmup.Run(ctx, fs.Arg(0), opts)
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
