package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/membership"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// BenchmarkFleet is #22's scale simulation: a fleet of workers, each the worker's own
// membership and locations code with its own certificate and its own mutual-TLS connections,
// registers with three replicas (holding -files files), reports its blocks, then heartbeats at
// its interval for a window. The fleet runs in a child process (this test binary again, see
// TestMain), so that the CPU and heap this process uses are the three replicas' alone.
//
//	go test ./master/bench -run '^$' -bench Fleet -benchtime 1x -fleet-workers 1000 -files 1000000 -timeout 1h -v
//
// It reports the master's CPU per heartbeat (above what the replicas use idle, before the fleet
// came and after it left), heap per worker
// (its registration, liveness, blocks and connections, over all three replicas), and the Raft
// entries per second while nothing changes (goal: none).
func BenchmarkFleet(b *testing.B) {
	ctx := background(b)
	authority := pkitest.New(b)
	c := mastertest.New(b, 3, mastertest.Options{GRPC: true, Transport: mastertest.TCP, Tune: productionConfig, TLS: authority})
	heapEmpty := heapInUse()
	preload(ctx, b, c.ClientAs(pki.Worker("fleet", "preloader")), "files", *files) // workers create files

	if err := c.WaitConverged(ctx); err != nil {
		b.Fatal(err)
	}
	// Each replica snapshots the preloaded files now, not raft in the middle of the window
	// (which at a million files costs the replicas more than the fleet does).
	for _, n := range c.Nodes {
		if err := n.Store.Snapshot(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// What the files cost each replica, in memory and on disk (the Raft log cut by the snapshot
	// above, the state machine and the snapshots kept).
	heapLoaded := heapInUse()
	var disk int64
	for _, n := range c.Nodes {
		disk += dirSize(b, n.Dir)
	}
	if *files > 0 {
		perReplica := float64(3 * *files)
		b.Logf("%d files: %.0f B of Go heap and %.0f B of disk per file and replica",
			*files, float64(int64(heapLoaded)-int64(heapEmpty))/perReplica, float64(disk)/perReplica)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		b.Fatal(err)
	}

	// The replicas alone, idle: their own Raft heartbeats and timers.
	idle := measure(func() { time.Sleep(*fleetWindow / 3) })

	heapBefore := heapInUse()
	entriesBefore := leader.Store.AppliedIndex()
	f := startFleet(b, fleetSpec{
		Seeds: c.APIAddrs(), CACert: authority.CA.CertPEM, CAKey: authority.CA.KeyPEM,
		Workers: *fleetWorkers, Blocks: *fleetBlocks, Interval: *fleetInterval,
	})
	registered := time.Now()
	f.awaitReady(b)
	// A fleet that starts at once queues at the master: calls that time out are made again at
	// the worker's next tick, as a real worker's are. Counted, not failed.
	_, retried := f.count(b)
	b.Logf("%d workers registered and reported %d blocks each in %v (%d Raft entries; %d calls timed out and were made again)",
		*fleetWorkers, *fleetBlocks, time.Since(registered).Round(time.Millisecond), leader.Store.AppliedIndex()-entriesBefore, retried)
	heapAfter := heapInUse()
	if *fleetHeapProfile != "" {
		writeHeapProfile(b, *fleetHeapProfile)
	}

	b.ResetTimer()
	beatsBefore, errsBefore := f.count(b)
	entriesBefore = leader.Store.AppliedIndex()
	steady := measure(func() {
		if *fleetCPUProfile != "" {
			stopProfile := startCPUProfile(b, *fleetCPUProfile)
			defer stopProfile()
		}
		time.Sleep(*fleetWindow)
	})
	beatsAfter, errsAfter := f.count(b)
	entries := leader.Store.AppliedIndex() - entriesBefore
	b.StopTimer()
	// The replicas idle again, the fleet gone: what they do on their own (a compaction of the
	// preloaded files, say) brackets the window from both sides.
	f.stop()
	idleAfter := measure(func() { time.Sleep(*fleetWindow / 3) })
	if errsAfter > errsBefore {
		b.Fatalf("%d heartbeats failed in the window", errsAfter-errsBefore)
	}
	beats := beatsAfter - beatsBefore
	if beats == 0 {
		b.Fatal("no heartbeat in the window")
	}
	seconds := steady.wall.Seconds()
	b.ReportMetric(float64(beats)/seconds, "heartbeats/s")
	b.ReportMetric(float64(entries)/seconds, "entries/s")
	b.ReportMetric(100*steady.cpu.Seconds()/seconds, "master-cpu-%")
	idleShare := (idle.cpu + idleAfter.cpu).Seconds() / (idle.wall + idleAfter.wall).Seconds()
	b.ReportMetric(100*idle.cpu.Seconds()/idle.wall.Seconds(), "idle-before-cpu-%")
	b.ReportMetric(100*idleAfter.cpu.Seconds()/idleAfter.wall.Seconds(), "idle-after-cpu-%")
	extra := steady.cpu.Seconds() - idleShare*seconds
	b.ReportMetric(1e6*extra/float64(beats), "cpu-µs/heartbeat")
	b.ReportMetric(float64(int64(heapAfter)-int64(heapBefore))/float64(*fleetWorkers), "heap-bytes/worker")
}

// dirSize is the bytes the files under dir take on disk (sparse files count what they hold).
func dirSize(b *testing.B, dir string) int64 {
	var size int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			size += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		b.Fatalf("measuring %s: %v", dir, err)
	}
	return size
}

var (
	fleetWorkers  = flag.Int("fleet-workers", 1000, "workers BenchmarkFleet simulates")
	fleetBlocks   = flag.Int("fleet-blocks", 100, "blocks each simulated worker reports when it registers")
	fleetInterval = flag.Duration("fleet-interval", 3*time.Second, "each simulated worker's heartbeat interval (the worker's default)")
	fleetWindow   = flag.Duration("fleet-window", 30*time.Second, "how long BenchmarkFleet measures the fleet's steady heartbeats")
	// -test.cpuprofile and -test.memprofile cover the whole run, the preload included.
	fleetCPUProfile  = flag.String("fleet-cpuprofile", "", "write the replicas' CPU profile of the steady window here")
	fleetHeapProfile = flag.String("fleet-heapprofile", "", "write the replicas' heap profile here once the fleet has registered")
)

func startCPUProfile(b *testing.B, path string) (stop func()) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }
}

func writeHeapProfile(b *testing.B, path string) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// usage is the wall-clock and CPU time of this process over a stretch.
type usage struct{ wall, cpu time.Duration }

func measure(stretch func()) usage {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	wall, before := time.Now(), cpu()
	stretch()
	return usage{wall: time.Since(wall), cpu: cpu() - before}
}

// fleetEnv names the file of the fleetSpec a child process runs instead of the tests.
const fleetEnv = "STRATA_BENCH_FLEET"

func TestMain(m *testing.M) {
	if spec := os.Getenv(fleetEnv); spec != "" {
		if err := runFleet(spec, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "fleet:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fleetSpec is what the child process simulates.
type fleetSpec struct {
	Seeds         []string
	CACert, CAKey []byte // the test's CA, to issue each worker its own certificate
	Workers       int
	Blocks        int
	Interval      time.Duration
}

// fleet is the child process, spoken to by lines: it prints "ready" once every worker
// registered and reported its blocks, and answers "count" with "<heartbeats> <failed calls>".
type fleet struct {
	stdin    io.WriteCloser
	out      *bufio.Scanner
	cmd      *exec.Cmd
	stopOnce sync.Once
}

func startFleet(b *testing.B, spec fleetSpec) *fleet {
	b.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		b.Fatal(err)
	}
	specFile := filepath.Join(b.TempDir(), "fleet.json")
	if err := os.WriteFile(specFile, data, 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fleetEnv+"="+specFile)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	f := &fleet{stdin: stdin, out: bufio.NewScanner(stdout), cmd: cmd}
	b.Cleanup(f.stop)
	return f
}

// stop ends the fleet: closing its stdin stops the child, which then exits.
func (f *fleet) stop() {
	f.stopOnce.Do(func() { _ = f.stdin.Close(); _ = f.cmd.Wait() })
}

func (f *fleet) line(b *testing.B) string {
	b.Helper()
	if !f.out.Scan() {
		b.Fatalf("the fleet's process ended: %v", f.out.Err())
	}
	return f.out.Text()
}

func (f *fleet) awaitReady(b *testing.B) {
	b.Helper()
	if got := f.line(b); got != "ready" {
		b.Fatalf("the fleet said %q, want ready", got)
	}
}

func (f *fleet) count(b *testing.B) (beats, failures int64) {
	b.Helper()
	if _, err := io.WriteString(f.stdin, "count\n"); err != nil {
		b.Fatal(err)
	}
	if _, err := fmt.Sscan(f.line(b), &beats, &failures); err != nil {
		b.Fatal(err)
	}
	return beats, failures
}

// runFleet is the child process: spec's workers, each registered, reporting its blocks and
// heartbeating until in ends.
func runFleet(specFile string, in io.Reader, out io.Writer) error {
	data, err := os.ReadFile(specFile)
	if err != nil {
		return err
	}
	var spec fleetSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return err
	}
	ca, err := pki.ParseCA(spec.CACert, spec.CAKey)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	counts := &fleetCounts{}
	var ready sync.WaitGroup
	var members sync.WaitGroup
	defer members.Wait()
	defer cancel() // before members.Wait: the members stop first
	for w := range spec.Workers {
		m, cl, err := newFleetMember(ca, spec, w, counts, &ready)
		if err != nil {
			return err
		}
		members.Add(1)
		// Spread over one interval, as workers started at different times are.
		delay := time.Duration(w) * spec.Interval / time.Duration(spec.Workers)
		go func() {
			defer members.Done()
			defer func() { _ = cl.Close() }()
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			_ = m.Run(ctx)
		}()
	}
	ready.Wait()
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return fmt.Errorf("telling the benchmark the fleet is ready: %w", err)
	}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		if lines.Text() == "count" {
			if _, err := fmt.Fprintln(out, counts.beats.Load(), counts.failures.Load()); err != nil {
				return fmt.Errorf("answering the benchmark: %w", err)
			}
		}
	}
	return nil
}

type fleetCounts struct{ beats, failures atomic.Int64 }

// fail counts a failed call and prints the first few, to say what went wrong. Calls the
// fleet's own end cancelled do not count.
func (c *fleetCounts) fail(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	if n := c.failures.Add(1); n <= 5 {
		fmt.Fprintf(os.Stderr, "fleet: %s: %v\n", what, err)
	}
}

// newFleetMember is worker w of the fleet: its certificate, its master client, and the
// worker's membership and locations code over a store of spec.Blocks blocks that holds still.
func newFleetMember(ca *pki.CA, spec fleetSpec, w int, counts *fleetCounts, ready *sync.WaitGroup) (*membership.Member, *client.Client, error) {
	id := pki.Worker("fleet", fmt.Sprintf("node-%d", w))
	certPEM, keyPEM, err := ca.IssueKeyPair(pki.Leaf{Identity: id}, time.Now())
	if err != nil {
		return nil, nil, err
	}
	creds := pki.NewCredentials(ca.Pool())
	if err := creds.Set(certPEM, keyPEM); err != nil {
		return nil, nil, err
	}
	cl, err := client.New(spec.Seeds, client.Options{DialOptions: []grpc.DialOption{creds.DialOption(pki.RoleMaster)}})
	if err != nil {
		return nil, nil, err
	}
	dir := locations.NewDirectory(cl, nil, id.WorkerID(), logr.Discard())
	store, err := newFleetStore(w, spec.Blocks)
	if err != nil {
		return nil, nil, err
	}
	ready.Add(1)
	var reported sync.Once
	m, err := membership.New(membership.Config{
		ID: id.WorkerID(), Address: net.JoinHostPort(fmt.Sprintf("10.0.%d.%d", w/250, w%250+1), "7002"),
		Node: id.Name, Interval: spec.Interval,
		Report: func(ctx context.Context, blocks []tierstore.BlockInfo) (int, error) {
			defer reported.Do(ready.Done)
			n, err := dir.ReportAll(ctx, blocks)
			if err != nil {
				counts.fail(ctx, "reporting blocks", err)
			}
			return n, err
		},
		Log: logr.Discard(),
	}, countingMaster{cl, counts}, store, prometheus.NewRegistry())
	return m, cl, err
}

// countingMaster counts a member's heartbeats and the calls that failed.
type countingMaster struct {
	*client.Client
	counts *fleetCounts
}

func (m countingMaster) RegisterWorker(ctx context.Context, req *masterpb.RegisterWorkerRequest) (*masterpb.Worker, error) {
	w, err := m.Client.RegisterWorker(ctx, req)
	if err != nil {
		m.counts.fail(ctx, "registering", err)
	}
	return w, err
}

func (m countingMaster) Heartbeat(ctx context.Context, req *masterpb.HeartbeatRequest) (*masterpb.HeartbeatResponse, error) {
	resp, err := m.Client.Heartbeat(ctx, req)
	if err != nil {
		m.counts.fail(ctx, "heartbeat", err)
	} else {
		m.counts.beats.Add(1)
	}
	return resp, err
}

// fleetStore is a worker's tier store that holds still: one MEM tier a tenth used, and blocks
// cached from a Dataset of the worker's own, four to a file.
type fleetStore struct{ blocks []tierstore.BlockInfo }

func newFleetStore(w, n int) (*fleetStore, error) {
	const blockSize = 64 << 20
	s := &fleetStore{}
	for i := range n {
		origin, err := proto.Marshal(&workerpb.BlockOrigin{
			Path: fmt.Sprintf("/fleet/w%d/f%d", w, i/4), Dataset: "fleet-" + strconv.Itoa(w), Root: "/fleet/w" + strconv.Itoa(w),
			Index: int64(i % 4), Offset: int64(i%4) * blockSize,
		})
		if err != nil {
			return nil, err
		}
		s.blocks = append(s.blocks, tierstore.BlockInfo{
			ID: fmt.Sprintf("fleet-%d-%d", w, i), Tier: "mem", Size: blockSize, Checksum: uint32(i), Clean: true, Origin: origin,
		})
	}
	return s, nil
}

func (s *fleetStore) Stats() []tierstore.TierStats {
	return []tierstore.TierStats{{Name: "mem", Quota: 64 << 30, Used: int64(len(s.blocks)) << 26, Blocks: len(s.blocks)}}
}

func (s *fleetStore) Blocks() []tierstore.BlockInfo { return s.blocks }
