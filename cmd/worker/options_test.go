package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	"github.com/strata-cache/strata/internal/testenv"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

func TestResolve(t *testing.T) {
	const twoTiers = `
- name: mem
  medium: MEM
  paths: [/mnt/strata/mem]
  quota: 4Gi
- name: nvme
  medium: NVME
  paths: [/mnt/nvme0, /mnt/nvme1]
  quota: 100Gi
  watermarks: {high: 0.95, low: 0.8}
`
	cases := map[string]struct {
		tiers   string
		change  func(o *options)
		want    tierstore.Config
		wantErr string
	}{
		"a TierPool's tiers become the store's tiers": {
			tiers: twoTiers,
			want: tierstore.Config{
				Tiers: []tierstore.Tier{
					{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{"/mnt/strata/mem"}, Quota: 4 << 30},
					{Name: "nvme", Medium: datav1alpha1.MediumNVMe, Dirs: []string{"/mnt/nvme0", "/mnt/nvme1"}, Quota: 100 << 30, High: 0.95, Low: 0.8},
				},
				IndexDir: "/idx", Eviction: eviction.Config{Kind: eviction.LRU}, PromotionThreshold: 3,
			},
		},
		"LRFU takes its lambda": {
			tiers:  twoTiers,
			change: func(o *options) { o.eviction, o.lambda = "LRFU", 0.25 },
			want: tierstore.Config{
				Tiers: []tierstore.Tier{
					{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{"/mnt/strata/mem"}, Quota: 4 << 30},
					{Name: "nvme", Medium: datav1alpha1.MediumNVMe, Dirs: []string{"/mnt/nvme0", "/mnt/nvme1"}, Quota: 100 << 30, High: 0.95, Low: 0.8},
				},
				IndexDir: "/idx", Eviction: eviction.Config{Kind: eviction.LRFU, Lambda: 0.25}, PromotionThreshold: 3,
			},
		},
		"a pool keeps its blocks in a folder of its own under each tier path": {
			tiers:  twoTiers,
			change: func(o *options) { o.pool = "fast" },
			want: tierstore.Config{
				Tiers: []tierstore.Tier{
					{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{"/mnt/strata/mem/fast"}, Quota: 4 << 30},
					{Name: "nvme", Medium: datav1alpha1.MediumNVMe, Dirs: []string{"/mnt/nvme0/fast", "/mnt/nvme1/fast"}, Quota: 100 << 30, High: 0.95, Low: 0.8},
				},
				IndexDir: "/idx", Eviction: eviction.Config{Kind: eviction.LRU}, PromotionThreshold: 3,
			},
		},
		"an unknown eviction policy is refused": {tiers: twoTiers, change: func(o *options) { o.eviction = "FIFO" }, wantErr: `unknown eviction policy "FIFO"`},
		"MRD is a CachePolicy's, not a tier's":  {tiers: twoTiers, change: func(o *options) { o.eviction = "MRD" }, wantErr: "MRD is a CachePolicy's"},
		"an empty tiers file is refused":        {tiers: "[]", wantErr: "lists no tiers"},
		"an unknown field is refused":           {tiers: "- name: mem\n  size: 4Gi\n", wantErr: `unknown field "size"`},
		"a missing tiers file is refused":       {change: func(o *options) { o.tiersFile = "/nonexistent/tiers.yaml" }, wantErr: "reading the tiers file"},
		"a negative time to keep idle mounts is refused": {tiers: twoTiers, change: func(o *options) { o.keepIdleMounts = -time.Second },
			wantErr: "--keep-idle-mounts=-1s: give a duration of 0 or more"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			o := options{indexDir: "/idx", eviction: "LRU", lambda: 0.5, promotionThreshold: 3}
			o.tiersFile = filepath.Join(t.TempDir(), "tiers.yaml")
			g.Expect(os.WriteFile(o.tiersFile, []byte(tc.tiers), 0o600)).To(Succeed())
			if tc.change != nil {
				tc.change(&o)
			}
			cfg, err := o.resolve()
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cfg.DatasetOf).NotTo(BeNil(), "blocks are told apart by Dataset, for the Datasets' CachePolicies")
			cfg.DatasetOf = nil // funcs do not compare
			g.Expect(cfg).To(Equal(tc.want))
		})
	}
}

func TestResolveIdentity(t *testing.T) {
	cases := map[string]struct {
		opts    options
		podIP   string
		want    identity
		wantErr string
	}{
		"without a master the worker has no identity to resolve": {opts: options{}},
		"the id defaults to pool/node and the address to the pod's IP and the data port": {
			opts:  options{masterAddrs: "m-0:7001, m-1:7001", pool: "fast", nodeName: "node-a", dataAddr: ":7100"},
			podIP: "10.244.1.7",
			want:  identity{id: "fast/node-a", node: "node-a", advertise: "10.244.1.7:7100", masters: []string{"m-0:7001", "m-1:7001"}},
		},
		"explicit flags win": {
			opts: options{masterAddrs: "m:1", workerID: "w", nodeName: "n", advertiseAddr: "h:9", dataAddr: ":7100"},
			want: identity{id: "w", node: "n", advertise: "h:9", masters: []string{"m:1"}},
		},
		"a node name is required":     {opts: options{masterAddrs: "m:1", pool: "p"}, wantErr: "--node-name"},
		"an id or a pool is required": {opts: options{masterAddrs: "m:1", nodeName: "n"}, wantErr: "--worker-id or --pool"},
		"an address to advertise is required": {
			opts: options{masterAddrs: "m:1", pool: "p", nodeName: "n", dataAddr: ":7100"}, wantErr: "--advertise-addr (or $POD_IP)",
		},
		"an advertised address needs a port": {
			opts: options{masterAddrs: "m:1", pool: "p", nodeName: "n", advertiseAddr: "host"}, wantErr: "must be host:port",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			t.Setenv("POD_IP", tc.podIP)
			got, err := tc.opts.resolveIdentity()
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// freeAddr returns a loopback address nobody listens on.
// certificateFiles writes the CA, a certificate for id and its key to files, as flags name them.
func certificateFiles(t *testing.T, ca *pkitest.Authority, id pki.Identity) pki.Flags {
	t.Helper()
	dir := t.TempDir()
	cert, key := ca.Issue(t, id)
	f := pki.Flags{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	for path, b := range map[string][]byte{f.CAFile: ca.CA.CertPEM, f.CertFile: cert, f.KeyFile: key} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// TestRunRefusesACertificateOfAnotherWorker: a worker whose certificate names another pool or
// node would speak for that worker at the master; it does not start.
func TestRunRefusesACertificateOfAnotherWorker(t *testing.T) {
	ca := pkitest.New(t)
	dir := t.TempDir()
	tiers := "- name: mem\n  medium: MEM\n  paths: [" + filepath.Join(dir, "mem") + "]\n  quota: 64Mi\n"
	o := options{indexDir: filepath.Join(dir, "index"), eviction: "LRU", promotionThreshold: 3, shutdownTimeout: 5 * time.Second,
		tiersFile: filepath.Join(dir, "tiers.yaml"), metricsAddr: freeAddr(t), dataAddr: freeAddr(t),
		masterAddrs: "127.0.0.1:1", pool: "default", nodeName: "node-a"}
	o.advertiseAddr = o.dataAddr
	if err := os.WriteFile(o.tiersFile, []byte(tiers), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]pki.Identity{
		"another node's worker": pki.Worker("default", "node-b"),
		"another pool's worker": pki.Worker("other", "node-a"),
		"the operator":          pki.Operator(),
	} {
		t.Run(name, func(t *testing.T) {
			o.tls = certificateFiles(t, ca, id)
			err := run(context.Background(), o, logr.Discard())
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring("not for worker default/node-a")))
		})
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestRunRegistersAndServesBlocks runs the whole worker against a real Raft master: it is ready
// only once registered, serves a block written through its data plane, exports metrics, and
// stops cleanly.
func TestRunRegistersAndServesBlocks(t *testing.T) {
	g := NewWithT(t)
	ca := pkitest.New(t)
	masters := mastertest.New(t, 1, mastertest.Options{GRPC: true, TLS: ca})
	dir := t.TempDir()
	tiers := "- name: mem\n  medium: MEM\n  paths: [" + filepath.Join(dir, "mem") + "]\n  quota: 64Mi\n"
	o := options{indexDir: filepath.Join(dir, "index"), eviction: "LRU", promotionThreshold: 3, shutdownTimeout: 5 * time.Second,
		tiersFile: filepath.Join(dir, "tiers.yaml"), metricsAddr: freeAddr(t), dataAddr: freeAddr(t),
		masterAddrs: strings.Join(masters.APIAddrs(), ","), pool: "default", nodeName: "node-a", heartbeat: 100 * time.Millisecond}
	o.advertiseAddr = o.dataAddr
	o.tls = certificateFiles(t, ca, pki.Worker("default", "node-a"))
	// Without FUSE the worker runs without its mounter, and the test leaves that half out,
	// saying so; where every test must run, it fails instead.
	fuse := true
	if err := fusetest.Available(); err != nil {
		if testenv.MustRun() {
			t.Fatalf("the worker's mounter cannot be tried: %v (%s is set)", err, testenv.MustRunVar)
		}
		t.Logf("leaving out the worker's mounter: %v", err)
		fuse = false
	}
	source := filepath.Join(dir, "source")
	g.Expect(os.MkdirAll(filepath.Join(source, "images"), 0o750)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(source, "images", "cat.jpg"), []byte("a cat, in bytes"), 0o600)).To(Succeed())
	if fuse {
		o.mountSocket, o.mountsDir, o.fileRoots, o.blockSize = filepath.Join(dir, "run", "mount.sock"), filepath.Join(dir, "mounts"), source, 1<<20
	}
	g.Expect(os.WriteFile(o.tiersFile, []byte(tiers), 0o600)).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	// Another worker of the pool, as peers are: the data plane speaks mutual TLS only.
	peers := dataplane.NewPeers(ca.Credentials(t, pki.Worker("default", "node-b")).DialOption(pki.RoleWorker))
	defer func() { _ = peers.Close() }()

	// Built, the worker has opened everything and started nothing: its data plane listens,
	// and answers no one.
	w, err := build(ctx, o, logr.Discard())
	g.Expect(err).NotTo(HaveOccurred())
	asked, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	_, _, err = peers.ReadBlock(asked, o.dataAddr, "b0")
	stop()
	g.Expect(status.Code(err)).To(Equal(codes.DeadlineExceeded), "a built worker serves nothing until it runs: %v", err)
	done := make(chan error, 1)
	go func() { done <- w.run(ctx) }()

	g.Eventually(func() (int, error) {
		code, _, err := get("http://" + o.metricsAddr + "/readyz")
		return code, err
	}).WithTimeout(10*time.Second).Should(Equal(http.StatusOK), "the worker is ready once registered")
	workers, err := masters.Client().ListWorkers(ctx, &masterpb.ListWorkersRequest{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(workers.GetWorkers()).To(ConsistOf(And(
		HaveField("Id", "default/node-a"), HaveField("Address", o.dataAddr), HaveField("Node", "node-a"),
		HaveField("State", masterpb.WorkerState_WORKER_STATE_ALIVE),
		HaveField("Tiers", ConsistOf(HaveField("CapacityBytes", int64(64<<20))))),
	), "the master knows the worker, its address and its tiers")

	data := []byte("a block written through the data plane")
	_, err = peers.WriteBlock(ctx, o.dataAddr, &workerpb.WriteBlockHeader{BlockId: "b0"}, data)
	g.Expect(err).NotTo(HaveOccurred())
	got, _, err := peers.ReadBlock(ctx, o.dataAddr, "b0")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(data))

	if fuse {
		// The CSI plugin's request: serve a Dataset; the worker mounts it over FUSE.
		conn, err := grpc.NewClient("unix://"+o.mountSocket,
			ca.Credentials(t, pki.CSINode("node-a")).DialOptionLocal(pki.Worker("default", "node-a")))
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = conn.Close() }()
		resp, err := workerpb.NewMounterClient(conn).MountDataset(ctx, &workerpb.MountDatasetRequest{
			Namespace: "team-a", Name: "pictures", Uid: "0a1b2c3d-0000-4000-8000-000000000001",
			Source: &workerpb.DatasetSource{Uri: "file://" + source}, ReadOnly: true,
		})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(os.ReadFile(filepath.Join(resp.GetPath(), "images", "cat.jpg"))).To(Equal([]byte("a cat, in bytes")),
			"the Dataset is readable through the worker's mount")
		// The block is of the version of the file the mount listed.
		src, err := understore.NewLocal(understore.LocalConfig{Dir: source, AllowedRoots: []string{source}})
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = src.Close() }()
		listed, err := src.Stat(ctx, "images/cat.jpg")
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func() ([]*masterpb.Block, error) {
			resp, err := masters.Client().GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{
				Path: locations.MasterPath("/datasets/team-a/pictures/0a1b2c3d-0000-4000-8000-000000000001/images/cat.jpg", listed.ETag),
			})
			return resp.GetBlocks(), err
		}).WithTimeout(10*time.Second).Should(ConsistOf(HaveField("Locations", ConsistOf(HaveField("Worker", "default/node-a")))),
			"the block read through the mount is reported to the master")
	}

	_, metrics, err := get("http://" + o.metricsAddr + "/metrics")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(metrics).To(ContainSubstring(`strata_worker_tier_quota_bytes{medium="MEM",tier="mem"} 6.7108864e+07`))
	g.Expect(metrics).To(ContainSubstring(`strata_worker_dataplane_requests_total{code="OK",method="WriteBlock"} 1`))
	g.Expect(metrics).To(ContainSubstring(`strata_worker_registrations_total 1`))
	cancel()
	g.Expect(<-done).To(Succeed())
	if fuse {
		mounts, err := os.ReadDir(o.mountsDir)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(mounts).To(BeEmpty(), "a stopping worker unmounts its Datasets")
	}
}

// TestRunStopsWhatItStartedWhenItFailsLate: a worker that fails after its data plane serves
// (here, its metrics port is taken) stops serving it before run returns, so that nothing it
// started outlives the store it closes.
func TestRunStopsWhatItStartedWhenItFailsLate(t *testing.T) {
	g := NewWithT(t)
	ca := pkitest.New(t)
	dir := t.TempDir()
	tiers := "- name: mem\n  medium: MEM\n  paths: [" + filepath.Join(dir, "mem") + "]\n  quota: 64Mi\n"
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = taken.Close() }()
	o := options{indexDir: filepath.Join(dir, "index"), eviction: "LRU", promotionThreshold: 3, shutdownTimeout: 5 * time.Second,
		tiersFile: filepath.Join(dir, "tiers.yaml"), metricsAddr: taken.Addr().String(), dataAddr: freeAddr(t),
		masterAddrs: "127.0.0.1:1", pool: "default", nodeName: "node-a", heartbeat: time.Second}
	o.advertiseAddr = o.dataAddr
	o.tls = certificateFiles(t, ca, pki.Worker("default", "node-a"))
	g.Expect(os.WriteFile(o.tiersFile, []byte(tiers), 0o600)).To(Succeed())

	err = run(context.Background(), o, logr.Discard())
	g.Expect(err).To(MatchError(ContainSubstring("listening on " + o.metricsAddr)))
	conn, err := net.Dial("tcp", o.dataAddr)
	if err == nil {
		_ = conn.Close()
	}
	g.Expect(err).To(MatchError(syscall.ECONNREFUSED), "the data plane stopped with run")
}
