// Command benchpeers measures Strata's data path beside the tools a user would pick instead, on
// this host, with no cluster: MinIO holds the objects; Strata's real master and worker serve
// them through the worker's FUSE mount (tiers on /dev/shm), then rclone mount (full VFS cache on
// /dev/shm) and s3fs (cache on /dev/shm) serve the same objects, one after the other, and the
// same reader (this program) reads them; plain tmpfs and MinIO read directly are the baselines.
// Each round mounts every system afresh (empty caches) and the rounds alternate the systems.
//
// `make bench-peers` builds and runs it; it prints a table, a summary line per workload and
// peer, and writes the same as JSON (-out). docs/benchmarks.md records a run.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/strata-cache/strata/cacheworker/tiermount"
)

// The objects: one large file and a folder of small ones, in one bucket.
const (
	bucket      = "bench"
	seqPrefix   = "seq"
	largeKey    = seqPrefix + "/large.bin"
	smallPrefix = "small"
	accessKey   = "bench-peers"
	secretKey   = "bench-peers-secret-key"
)

// setup is what every system is measured with.
type setup struct {
	work, shm, tmpfs            string
	masterBin, workerBin        string
	rclone, s3fs, s3fsPasswords string
	minio                       *minioServer
	client                      *minio.Client
	largeSize                   int64
	smallFiles, smallSize       int
	writeFiles                  int
	randReads4k, randReads128k  int
	blockSize, tierQuota        int64
	rounds                      int
	minioBin                    string
	// workerTmpfs: the worker mounts its own tmpfs on its MEM tier, as in a cluster, instead of
	// keeping it in a folder of /dev/shm.
	workerTmpfs bool
}

func main() {
	var s setup
	var out string
	flag.StringVar(&s.masterBin, "master", "bin/bench-peers/master", "Strata's master binary.")
	flag.StringVar(&s.workerBin, "worker", "bin/bench-peers/worker", "Strata's worker binary.")
	flag.StringVar(&s.minioBin, "minio", "", "The MinIO binary.")
	flag.StringVar(&s.rclone, "rclone", "rclone", "The rclone binary.")
	flag.StringVar(&s.s3fs, "s3fs", "s3fs", "The s3fs binary.")
	flag.Int64Var(&s.largeSize, "large-size", 256<<20, "Bytes of the large object.")
	flag.IntVar(&s.smallFiles, "small-files", 10000, "Small objects read in the small-file workloads.")
	flag.IntVar(&s.smallSize, "small-size", 16<<10, "Bytes of each small object.")
	flag.IntVar(&s.writeFiles, "write-files", 1000, "Small output files written in write-small.")
	flag.IntVar(&s.randReads4k, "rand-reads-4k", 20000, "Random 4 KiB reads of the large file in hot-rand-4k.")
	flag.IntVar(&s.randReads128k, "rand-reads-128k", 4000, "Random 128 KiB reads of the large file in hot-rand-128k.")
	flag.Int64Var(&s.blockSize, "block-size", 64<<20, "Strata's block size (a TierPool's default).")
	flag.IntVar(&s.rounds, "rounds", 3, "Rounds; each mounts every system afresh.")
	flag.BoolVar(&s.workerTmpfs, "worker-tmpfs", false, "Strata's MEM tier on a tmpfs the worker mounts itself, as on a node of a cluster "+
		"(huge pages where a block fills them), instead of a folder of /dev/shm; the work folder (TMPDIR) must be on a disk.")
	flag.StringVar(&out, "out", "bin/bench-peers.json", "Where the results are written as JSON.")
	flag.Parse()

	if err := run(&s, out); err != nil {
		fmt.Fprintln(os.Stderr, "bench-peers:", err)
		os.Exit(1)
	}
}

func run(s *setup, out string) (err error) {
	if s.minioBin == "" {
		return errors.New("-minio is required: the MinIO binary (make minio builds it)")
	}
	for _, bin := range []*string{&s.masterBin, &s.workerBin, &s.rclone, &s.s3fs, &s.minioBin} {
		path, err := exec.LookPath(*bin)
		if err != nil {
			return fmt.Errorf("%s: %w (make bench-peers builds Strata's binaries and installs the peers)", *bin, err)
		}
		if *bin, err = filepath.Abs(path); err != nil {
			return err
		}
	}
	if s.work, err = os.MkdirTemp("", "strata-bench-peers-"); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(s.work)) }()
	if s.workerTmpfs {
		mem, err := tiermount.InMemory(s.work)
		if err != nil {
			return fmt.Errorf("-worker-tmpfs: %w", err)
		}
		if mem {
			return fmt.Errorf("-worker-tmpfs: the work folder %s is in memory; it must be on a disk, for the worker to mount a tmpfs in it (set TMPDIR)", s.work)
		}
	}
	if s.shm, err = os.MkdirTemp("/dev/shm", "strata-bench-peers-"); err != nil {
		return fmt.Errorf("the caches live on /dev/shm: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(s.shm)) }()
	// Strata's tier holds every round's copy of the objects (each round mounts new Datasets)
	// and every round's outputs, which it may not drop: they exist nowhere else.
	perRound := 2*s.largeSize + int64(s.smallFiles*s.smallSize) + int64(s.writeFiles*s.smallSize) + 4*s.blockSize
	s.tierQuota = int64(s.rounds) * perRound

	ctx := context.Background()
	if s.minio, err = startMinIO(s); err != nil {
		return err
	}
	defer s.minio.proc.stop()
	s.client = s.minio.client
	fmt.Printf("putting the objects into MinIO: one of %d MiB, %d of %d KiB\n", s.largeSize>>20, s.smallFiles, s.smallSize>>10)
	if err := putObjects(ctx, s); err != nil {
		return err
	}
	s.s3fsPasswords = filepath.Join(s.work, "s3fs-passwd")
	if err := os.WriteFile(s.s3fsPasswords, []byte(accessKey+":"+secretKey+"\n"), 0o600); err != nil {
		return err
	}

	st, err := startStrata(s)
	if err != nil {
		return err
	}
	defer st.stop()

	fmt.Printf("Strata's MEM tier: %s\n", s.memoryTier())
	r := newResults()
	for round := 1; round <= s.rounds; round++ {
		fmt.Printf("round %d of %d\n", round, s.rounds)
		if err := measureRound(ctx, s, st, round, r); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
	}
	if _, err := io.WriteString(os.Stdout, r.table()); err != nil {
		return err
	}
	return r.write(out, s)
}

// A workload names what is measured; baseline is the system a Strata figure is compared with.
type workload struct {
	name, baseline string
}

var workloads = []workload{
	{"cold-seq", "minio"}, {"hot-seq", "tmpfs"}, {"hot-seq-dropped", "tmpfs"},
	{"hot-rand-4k", "tmpfs"}, {"hot-rand-128k", "tmpfs"},
	{"small-cold", "minio"}, {"small-hot", "tmpfs"},
	{"write-large", "tmpfs"}, {"write-small", "tmpfs"},
}

// measureRound measures every system once, each mounted afresh.
func measureRound(ctx context.Context, s *setup, st *strata, round int, r *results) error {
	readers := []struct {
		name  string
		mount func(*setup, int) (mounted, error)
	}{
		{"strata", st.reads}, {"rclone", rclone}, {"s3fs", s3fs}, {"tmpfs", tmpfsCopy},
	}
	for _, sys := range readers {
		m, err := sys.mount(s, round)
		if err != nil {
			return err
		}
		err = measureReads(s, sys.name, m, r)
		if uerr := m.unmount(); err == nil {
			err = uerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", sys.name, err)
		}
	}

	// MinIO read directly: the floor of any cold read.
	m, err := metered(func() (measure, error) { return minioSequential(ctx, s.client) })
	if err != nil {
		return err
	}
	r.add("cold-seq", "minio", m)
	if m, err = metered(func() (measure, error) { return minioTree(ctx, s.client, s.smallFiles) }); err != nil {
		return err
	}
	r.add("small-cold", "minio", m)

	return measureWrites(s, st, round, r)
}

// measureReads runs the read workloads on one system's mount, in an order that leaves each
// the cache state it names: the first read of a fresh mount is cold, the next hot.
func measureReads(s *setup, system string, m mounted, r *results) error {
	steps := []struct {
		workload string
		fn       func() (measure, error)
	}{
		{"cold-seq", func() (measure, error) { return readSequential(m.large) }},
		{"hot-seq", func() (measure, error) { return readSequential(m.large) }},
		{"hot-seq-dropped", func() (measure, error) {
			if err := dropPages(m.large); err != nil {
				return measure{}, err
			}
			return readSequential(m.large)
		}},
		{"hot-rand-4k", func() (measure, error) { return readRandom(m.large, 4<<10, s.randReads4k) }},
		{"hot-rand-128k", func() (measure, error) { return readRandom(m.large, 128<<10, s.randReads128k) }},
		{"small-cold", func() (measure, error) { return readTree(m.small, s.smallFiles) }},
		{"small-hot", func() (measure, error) { return readTree(m.small, s.smallFiles) }},
	}
	for _, step := range steps {
		if system == "tmpfs" && strings.Contains(step.workload, "cold") {
			continue // tmpfs has nothing cold: MinIO read directly is the cold baseline
		}
		m, err := metered(step.fn)
		if err != nil {
			return fmt.Errorf("%s: %w", step.workload, err)
		}
		r.add(step.workload, system, m)
	}
	return nil
}

// measureWrites writes a large output file and many small ones into a new output Dataset of
// Strata's, and into tmpfs.
func measureWrites(s *setup, st *strata, round int, r *results) error {
	tmp := filepath.Join(s.shm, fmt.Sprintf("writes-%d", round))
	for _, what := range []string{"large", "small"} {
		dir, unmount, err := st.output(round, what)
		if err != nil {
			return err
		}
		err = measureWrite(s, what, "strata", dir, r)
		if uerr := unmount(); err == nil {
			err = uerr
		}
		if err != nil {
			return err
		}
		plain := filepath.Join(tmp, what)
		if err := os.MkdirAll(plain, 0o755); err != nil {
			return err
		}
		if err := measureWrite(s, what, "tmpfs", plain, r); err != nil {
			return err
		}
	}
	return os.RemoveAll(tmp)
}

func measureWrite(s *setup, what, system, dir string, r *results) error {
	m, err := metered(func() (measure, error) {
		if what == "large" {
			return writeLarge(dir, s.largeSize)
		}
		return writeSmall(dir, s.writeFiles, s.smallSize)
	})
	if err != nil {
		return fmt.Errorf("%s: write-%s: %w", system, what, err)
	}
	r.add("write-"+what, system, m)
	return nil
}

// minioServer is MinIO serving a folder of the work directory.
type minioServer struct {
	proc     *proc
	Endpoint string
	client   *minio.Client
}

func startMinIO(s *setup) (*minioServer, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	console, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := startProc("minio", []string{"MINIO_ROOT_USER=" + accessKey, "MINIO_ROOT_PASSWORD=" + secretKey, "MINIO_BROWSER=off", "MINIO_UPDATE=off"},
		s.minioBin, "server", filepath.Join(s.work, "minio"), "--address", addr, "--console-address", console, "--quiet")
	if err != nil {
		return nil, err
	}
	if err := p.waitFor("readiness", answers200("http://"+addr+"/minio/health/ready")); err != nil {
		p.stop()
		return nil, err
	}
	client, err := minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(accessKey, secretKey, ""), Region: "us-east-1"})
	if err != nil {
		p.stop()
		return nil, err
	}
	return &minioServer{proc: p, Endpoint: addr, client: client}, nil
}

// putObjects fills the bucket and copies the same objects into tmpfs.
func putObjects(ctx context.Context, s *setup) error {
	if err := s.client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
		return fmt.Errorf("making bucket %s: %w", bucket, err)
	}
	s.tmpfs = filepath.Join(s.shm, "tmpfs")
	put := func(key string, data []byte) error {
		if _, err := s.client.PutObject(ctx, bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
			return fmt.Errorf("putting %s: %w", key, err)
		}
		path := filepath.Join(s.tmpfs, key)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, data, 0o644)
	}
	if err := put(largeKey, payload(int(s.largeSize), 1)); err != nil {
		return err
	}
	keys := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range keys {
				if err := put(smallKey(i), payload(s.smallSize, uint64(i)+2)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var failed error
	for i := 0; i < s.smallFiles && failed == nil; i++ {
		select {
		case keys <- i:
		case failed = <-errs:
		}
	}
	close(keys)
	wg.Wait()
	close(errs)
	return errors.Join(failed, <-errs)
}

// smallKey spreads the small objects over folders of a thousand, as a dataset of samples is.
func smallKey(i int) string {
	return fmt.Sprintf("%s/shard-%02d/sample-%05d.bin", smallPrefix, i/1000, i)
}

// results are the measures of every round, by workload and system.
type results struct {
	values map[string]map[string][]measure
}

func newResults() *results { return &results{values: map[string]map[string][]measure{}} }

func (r *results) add(workload, system string, m measure) {
	if r.values[workload] == nil {
		r.values[workload] = map[string][]measure{}
	}
	r.values[workload][system] = append(r.values[workload][system], m)
	fmt.Printf("  %-16s %-7s %10.1f %-7s cores %s\n", workload, system, m.value, m.unit, m.cpu)
}

// median of a system's rounds of a workload; ok false when it was not measured.
func (r *results) median(workload, system string) (measure, bool) {
	ms := r.values[workload][system]
	if len(ms) == 0 {
		return measure{}, false
	}
	vs := make([]float64, len(ms))
	for i, m := range ms {
		vs[i] = m.value
	}
	return measure{value: medianOf(vs), unit: ms[0].unit}, true
}

// cpuMedian is the median of a system's rounds of a workload of the cores busy: the host's,
// and each process's (a round in which a process took none counts as none).
func (r *results) cpuMedian(workload, system string) (cpuUse, bool) {
	ms := r.values[workload][system]
	if len(ms) == 0 {
		return cpuUse{}, false
	}
	host := make([]float64, len(ms))
	procs := map[string][]float64{}
	for i, m := range ms {
		host[i] = m.cpu.Host
		for name := range m.cpu.Procs {
			procs[name] = nil
		}
	}
	use := cpuUse{Host: medianOf(host), Procs: map[string]float64{}}
	for name := range procs {
		for _, m := range ms {
			procs[name] = append(procs[name], m.cpu.Procs[name])
		}
		use.Procs[name] = medianOf(procs[name])
	}
	return use, true
}

// medianOf vs, which is not empty: the mean of the middle two of an even number.
func medianOf(vs []float64) float64 {
	vs = slices.Sorted(slices.Values(vs))
	mid := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		mid = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return mid
}

var systems = []string{"strata", "rclone", "s3fs", "tmpfs", "minio"}

// summary is a line per workload and system other than the baseline: the system's median, the
// baseline's, and their ratio.
type summaryLine struct {
	Workload string  `json:"workload"`
	System   string  `json:"system"`
	Value    float64 `json:"value"`
	Baseline string  `json:"baseline"`
	Base     float64 `json:"baselineValue"`
	Unit     string  `json:"unit"`
	Ratio    float64 `json:"ratio"`
}

func (r *results) summary() []summaryLine {
	var lines []summaryLine
	for _, w := range workloads {
		base, ok := r.median(w.name, w.baseline)
		if !ok {
			continue
		}
		for _, sys := range systems {
			if sys == w.baseline {
				continue
			}
			m, ok := r.median(w.name, sys)
			if !ok {
				continue
			}
			lines = append(lines, summaryLine{Workload: w.name, System: sys, Value: m.value, Baseline: w.baseline,
				Base: base.value, Unit: m.unit, Ratio: m.value / base.value})
		}
	}
	return lines
}

// table is the medians of every workload and system, then the summary lines.
func (r *results) table() string {
	var w strings.Builder
	fmt.Fprintf(&w, "\n%-16s", "median")
	for _, sys := range systems {
		fmt.Fprintf(&w, " %12s", sys)
	}
	w.WriteString("  unit\n")
	for _, wl := range workloads {
		fmt.Fprintf(&w, "%-16s", wl.name)
		unit := ""
		for _, sys := range systems {
			if m, ok := r.median(wl.name, sys); ok {
				fmt.Fprintf(&w, " %12.1f", m.value)
				unit = m.unit
			} else {
				fmt.Fprintf(&w, " %12s", "-")
			}
		}
		fmt.Fprintf(&w, "  %s\n", unit)
	}
	w.WriteString("\n")
	for _, l := range r.summary() {
		fmt.Fprintf(&w, "workload=%s %s=%.1f %s=%.1f ratio=%.2f\n", l.Workload, l.System, l.Value, l.Baseline, l.Base, l.Ratio)
	}
	fmt.Fprintf(&w, "\ncores busy of the host's %d meanwhile (medians): the host's, then each process's\n", runtime.NumCPU())
	for _, wl := range workloads {
		for _, sys := range systems {
			if use, ok := r.cpuMedian(wl.name, sys); ok {
				fmt.Fprintf(&w, "cpu workload=%s system=%s %s\n", wl.name, sys, use)
			}
		}
	}
	return w.String()
}

func (r *results) write(path string, s *setup) error {
	type round struct {
		Workload string    `json:"workload"`
		System   string    `json:"system"`
		Unit     string    `json:"unit"`
		Values   []float64 `json:"values"`
		CPU      []cpuUse  `json:"cpu"`
	}
	doc := struct {
		Time      time.Time     `json:"time"`
		Rounds    int           `json:"rounds"`
		MemTier   string        `json:"strataMemoryTier"`
		LargeSize int64         `json:"largeBytes"`
		Small     int           `json:"smallFiles"`
		SmallSize int           `json:"smallBytes"`
		Measures  []round       `json:"measures"`
		Summary   []summaryLine `json:"summary"`
	}{Time: time.Now().UTC(), Rounds: s.rounds, LargeSize: s.largeSize, Small: s.smallFiles, SmallSize: s.smallSize, Summary: r.summary(), MemTier: s.memoryTier()}
	for _, w := range workloads {
		for _, sys := range systems {
			ms := r.values[w.name][sys]
			if len(ms) == 0 {
				continue
			}
			rd := round{Workload: w.name, System: sys, Unit: ms[0].unit}
			for _, m := range ms {
				rd.Values = append(rd.Values, m.value)
				rd.CPU = append(rd.CPU, m.cpu)
			}
			doc.Measures = append(doc.Measures, rd)
		}
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwritten to %s\n", path)
	return nil
}

// memoryTier says where Strata's MEM tier is.
func (s *setup) memoryTier() string {
	if s.workerTmpfs {
		return "a tmpfs the worker mounted (huge pages within a file's size)"
	}
	return "a folder of /dev/shm"
}
