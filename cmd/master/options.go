package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/master/liveness"
	"github.com/strata-cache/strata/master/store"
)

// options are the command-line flags, validated once by resolve.
type options struct {
	id            string
	dataDir       string
	raftAddr      string
	raftAdvertise string
	grpcAddr      string
	grpcAdvertise string
	metricsAddr   string
	// tls is where the replica's certificate comes from: every connection, gRPC and Raft, is
	// mutual TLS.
	tls pki.Flags

	bootstrap bool
	join      string

	statefulSet   bool
	service       string
	namespace     string
	replicas      int
	clusterDomain string

	heartbeatTimeout  time.Duration
	readLease         time.Duration
	electionTimeout   time.Duration
	snapshotInterval  time.Duration
	snapshotThreshold uint64
	trailingLogs      uint64
	lostWorkerTimeout time.Duration
	shutdownTimeout   time.Duration
	verbosity         int
}

func (o *options) bind(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&o.id, "id", envOr("POD_NAME", host), "Raft id of this replica; stable across restarts (the pod name).")
	fs.StringVar(&o.dataDir, "data-dir", "/var/lib/strata-master", "Directory of the Raft log, the state machine and snapshots.")
	fs.StringVar(&o.raftAddr, "raft-addr", ":7000", "Address the Raft transport listens on.")
	fs.StringVar(&o.raftAdvertise, "raft-advertise", "", "Raft address peers dial (host:port); derived in --statefulset mode.")
	fs.StringVar(&o.grpcAddr, "grpc-addr", ":7001", "Address the gRPC API listens on.")
	fs.StringVar(&o.grpcAdvertise, "grpc-advertise", "", "gRPC address clients are redirected to; derived in --statefulset mode.")
	fs.StringVar(&o.metricsAddr, "metrics-addr", ":8080", "Address of /metrics, /healthz and /readyz.")
	o.tls.Bind(fs)
	fs.BoolVar(&o.bootstrap, "bootstrap", false, "Outside a StatefulSet: this replica may create a new cluster when none of --join belongs to one.")
	fs.StringVar(&o.join, "join", "", "Outside a StatefulSet: comma-separated gRPC addresses of the other replicas.")
	fs.BoolVar(&o.statefulSet, "statefulset", false, "Derive peers and addresses from the pod name (<set>-<ordinal>) and --service; ordinal 0 may bootstrap.")
	fs.StringVar(&o.service, "service", "strata-master", "Headless Service of the StatefulSet.")
	fs.StringVar(&o.namespace, "namespace", envOr("POD_NAMESPACE", "default"), "Namespace of the StatefulSet.")
	fs.IntVar(&o.replicas, "replicas", 3, "Replicas of the StatefulSet.")
	fs.StringVar(&o.clusterDomain, "cluster-domain", "cluster.local", "Kubernetes cluster domain.")
	fs.DurationVar(&o.heartbeatTimeout, "raft-heartbeat-timeout", store.DefaultHeartbeatTimeout, "Raft heartbeat timeout.")
	fs.DurationVar(&o.readLease, "raft-read-lease", 0, "How long after a quorum answered the leader's heartbeats it serves linearizable reads without asking again: at most half the heartbeat timeout; 0 means a third of it, a negative value asks a quorum for every read.")
	fs.DurationVar(&o.electionTimeout, "raft-election-timeout", store.DefaultElectionTimeout, "Raft election timeout.")
	fs.DurationVar(&o.snapshotInterval, "snapshot-interval", store.DefaultSnapshotInterval, "How often Raft checks whether to snapshot.")
	fs.Uint64Var(&o.snapshotThreshold, "snapshot-threshold", store.DefaultSnapshotThreshold, "Log entries between snapshots.")
	fs.Uint64Var(&o.trailingLogs, "trailing-logs", store.DefaultTrailingLogs, "Log entries kept after a snapshot.")
	fs.DurationVar(&o.lostWorkerTimeout, "lost-worker-timeout", liveness.DefaultTimeout, "A worker silent this long is declared lost.")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "Time allowed for a graceful stop.")
	fs.IntVar(&o.verbosity, "v", 0, "Log verbosity (0 info, 1 debug, 2 trace).")
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// topology is what the options resolve to.
type topology struct {
	raftAdvertise string
	grpcAdvertise string
	peers         []string
	mayBootstrap  bool
}

// resolve validates the options and derives the addresses and peers.
func (o *options) resolve() (topology, error) {
	var errs []error
	if o.id == "" {
		errs = append(errs, errors.New("--id is required"))
	}
	if o.dataDir == "" {
		errs = append(errs, errors.New("--data-dir is required"))
	}
	_, raftPort, err := net.SplitHostPort(o.raftAddr)
	if err != nil {
		errs = append(errs, fmt.Errorf("--raft-addr: %w", err))
	}
	_, grpcPort, err := net.SplitHostPort(o.grpcAddr)
	if err != nil {
		errs = append(errs, fmt.Errorf("--grpc-addr: %w", err))
	}
	if len(errs) > 0 {
		return topology{}, errors.Join(errs...)
	}

	t := topology{raftAdvertise: o.raftAdvertise, grpcAdvertise: o.grpcAdvertise}
	if !o.statefulSet {
		t.mayBootstrap = o.bootstrap
		for _, p := range strings.Split(o.join, ",") {
			if p = strings.TrimSpace(p); p != "" {
				t.peers = append(t.peers, p)
			}
		}
		if t.raftAdvertise == "" {
			t.raftAdvertise = o.raftAddr
		}
		if t.grpcAdvertise == "" {
			t.grpcAdvertise = o.grpcAddr
		}
		if !t.mayBootstrap && len(t.peers) == 0 {
			return t, errors.New("give --bootstrap, --join or --statefulset")
		}
		return t, nil
	}

	// <set>-<ordinal>: the StatefulSet's name is everything before the last dash.
	i := strings.LastIndexByte(o.id, '-')
	ordinal, err := strconv.Atoi(o.id[i+1:])
	if i <= 0 || err != nil || ordinal < 0 {
		return t, fmt.Errorf("--statefulset: pod name %q does not end in -<ordinal>", o.id)
	}
	if o.replicas < 1 || ordinal >= o.replicas {
		return t, fmt.Errorf("--statefulset: ordinal %d outside --replicas %d", ordinal, o.replicas)
	}
	set := o.id[:i]
	host := func(ord int) string {
		return fmt.Sprintf("%s-%d.%s.%s.svc.%s", set, ord, o.service, o.namespace, o.clusterDomain)
	}
	if t.raftAdvertise == "" {
		t.raftAdvertise = net.JoinHostPort(host(ordinal), raftPort)
	}
	if t.grpcAdvertise == "" {
		t.grpcAdvertise = net.JoinHostPort(host(ordinal), grpcPort)
	}
	for ord := 0; ord < o.replicas; ord++ {
		if ord != ordinal {
			t.peers = append(t.peers, net.JoinHostPort(host(ord), grpcPort))
		}
	}
	t.mayBootstrap = ordinal == 0
	return t, nil
}
