// Package dfsperf runs DFS-Perf's workloads (the Alluxio thesis, chapter 3) against a file
// system through its mount, as a pipeline step's process sees it: the metadata operations
// (create, exists, rename, delete, list), sequential and random reads and writes, a mixture of
// the two, and an iterative pipeline in which every round reads the round before's output.
// Each workload runs with a number of threads, each on files of its own, and reports
// operations and bytes per second and the latency of one operation (median and 99th
// percentile).
//
// Strata's output mounts write each file once: a file is sealed when its writer closes it, and
// a sealed file cannot be renamed (EXDEV) or written again. The workloads keep to what such a
// file system allows: rename renames empty folders, and writes always make new files.
package dfsperf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Config is what the workloads do, and where.
type Config struct {
	// Dir is the folder the workloads make their files and folders in (a writable mount, such
	// as an output Dataset's); they work below Dir/strata-bench, made afresh.
	Dir string
	// ReadDir, when set, is a folder whose files the read workloads read (an input Dataset's
	// mount); otherwise they read files that seq-write wrote first.
	ReadDir string
	// Threads work at once, each on files of its own.
	Threads int
	// Files per thread.
	Files int
	// FileSize of the files written.
	FileSize int64
	// IOSize of each read and write call.
	IOSize int
	// ReadShare of the operations of the mixed workload that read (the rest write).
	ReadShare float64
	// Rounds of the iterative workload.
	Rounds int
	// Seed of the random offsets and choices.
	Seed uint64
}

func (c Config) validate() error {
	switch {
	case c.Dir == "":
		return errors.New("a folder to work in is needed (--dir)")
	case c.Threads < 1:
		return fmt.Errorf("--threads=%d: at least 1", c.Threads)
	case c.Files < 1:
		return fmt.Errorf("--files=%d: at least 1", c.Files)
	case c.FileSize < 0:
		return fmt.Errorf("--size=%d: not negative", c.FileSize)
	case c.IOSize < 1:
		return fmt.Errorf("--io-size=%d: at least 1", c.IOSize)
	case c.ReadShare < 0 || c.ReadShare > 1:
		return fmt.Errorf("--read-share=%g: between 0 and 1", c.ReadShare)
	case c.Rounds < 1:
		return fmt.Errorf("--rounds=%d: at least 1", c.Rounds)
	}
	return nil
}

// Workload is one of DFS-Perf's workloads.
type Workload struct {
	Name string
	// Help says what it does, for --help.
	Help string
	run  func(ctx context.Context, r *run, t *thread) error
}

// Workloads are every workload, in the order All runs them.
var Workloads = []Workload{
	{"create", "each thread creates --files empty files, one open(O_CREAT|O_EXCL) and close each", runCreate},
	{"exists", "stat of each file create made (create runs first, untimed, if it was not asked for)", runExists},
	{"rename", "each thread renames --files empty folders of its own (a sealed file cannot be renamed on Strata's output mounts)", runRename},
	{"list", "each thread lists its folder of --files entries, --files times", runList},
	{"delete", "each thread removes the files create made", runDelete},
	{"seq-write", "each thread writes --files new files of --size bytes, --io-size at a time, each closed (sealed) before the next", runSeqWrite},
	{"rand-write", "as seq-write, each file's --io-size pieces written at offsets in a random order", runRandWrite},
	{"seq-read", "each thread reads its files whole, --io-size at a time (--read-dir's files, else seq-write's)", runSeqRead},
	{"rand-read", "each thread reads --size/--io-size pieces of --io-size at random offsets of each of its files", runRandRead},
	{"mixed", "each thread makes --files operations: a whole-file read with probability --read-share, else a new file's write", runMixed},
	{"iterative", "--rounds rounds: round 0 writes each thread's --files files, every later round reads the round before's and writes as many", runIterative},
}

// Lookup returns the workload called name.
func Lookup(name string) (Workload, bool) {
	i := slices.IndexFunc(Workloads, func(w Workload) bool { return w.Name == name })
	if i < 0 {
		return Workload{}, false
	}
	return Workloads[i], true
}

// Result is what one workload measured.
type Result struct {
	Workload  string  `json:"workload"`
	Threads   int     `json:"threads"`
	Ops       int64   `json:"ops"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	OpsPerSec float64 `json:"opsPerSecond"`
	MBPerSec  float64 `json:"mbPerSecond"`
	P50Micros float64 `json:"p50Micros"`
	P99Micros float64 `json:"p99Micros"`
}

// Runner runs workloads under one Config; the files each makes stay for the ones after it
// (exists and delete use create's, the reads seq-write's) until Close removes them.
type Runner struct {
	cfg  Config
	root string
	// made records the file sets made so far: "create", "seq-write".
	made map[string]bool
}

// NewRunner makes the runner's folder, Dir/strata-bench, which must not exist yet.
func NewRunner(cfg Config) (*Runner, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	root := filepath.Join(cfg.Dir, "strata-bench")
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, fmt.Errorf("making the benchmark's folder (remove what an earlier run left, or give another --dir): %w", err)
	}
	return &Runner{cfg: cfg, root: root, made: map[string]bool{}}, nil
}

// Close removes what the workloads made.
func (r *Runner) Close() error {
	if err := os.RemoveAll(r.root); err != nil {
		return fmt.Errorf("removing %s: %w", r.root, err)
	}
	return nil
}

// Run runs w, first (untimed) whatever it needs that has not run yet.
func (r *Runner) Run(ctx context.Context, w Workload) (Result, error) {
	needs := map[string]string{"exists": "create", "list": "create", "delete": "create", "seq-read": "seq-write", "rand-read": "seq-write", "mixed": "seq-write"}
	if need, ok := needs[w.Name]; ok && !r.made[need] && (r.cfg.ReadDir == "" || need == "create") {
		dep, _ := Lookup(need)
		if _, err := r.run(ctx, dep); err != nil {
			return Result{}, fmt.Errorf("%s, run first for %s: %w", need, w.Name, err)
		}
	}
	res, err := r.run(ctx, w)
	if err != nil {
		return res, fmt.Errorf("%s: %w", w.Name, err)
	}
	return res, nil
}

func (r *Runner) run(ctx context.Context, w Workload) (Result, error) {
	ru := &run{Runner: r}
	if w.Name == "seq-read" || w.Name == "rand-read" || w.Name == "mixed" {
		if err := ru.assignInputs(); err != nil {
			return Result{}, err
		}
	}
	threads := make([]*thread, r.cfg.Threads)
	for i := range threads {
		threads[i] = &thread{id: i, rng: rand.New(rand.NewPCG(r.cfg.Seed, uint64(i)))}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(threads))
	start := time.Now()
	for i, t := range threads {
		wg.Go(func() { errs[i] = w.run(ctx, ru, t) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}
	switch w.Name {
	case "create", "seq-write":
		r.made[w.Name] = true
	case "delete":
		r.made["create"] = false
	}
	return summarize(w.Name, threads, elapsed), nil
}

func summarize(name string, threads []*thread, elapsed time.Duration) Result {
	res := Result{Workload: name, Threads: len(threads), Seconds: elapsed.Seconds()}
	var latencies []time.Duration
	for _, t := range threads {
		res.Ops += int64(len(t.latencies))
		res.Bytes += t.bytes
		latencies = append(latencies, t.latencies...)
	}
	res.OpsPerSec = float64(res.Ops) / res.Seconds
	res.MBPerSec = float64(res.Bytes) / 1e6 / res.Seconds
	slices.Sort(latencies)
	res.P50Micros = percentile(latencies, 0.50)
	res.P99Micros = percentile(latencies, 0.99)
	return res
}

// percentile is the q-quantile of sorted latencies, in microseconds (nearest rank).
func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i]) / float64(time.Microsecond)
}

// run is one workload's run: the runner, and the files the threads read.
type run struct {
	*Runner
	inputs [][]string // per thread
}

// thread is one thread's state and what it measured.
type thread struct {
	id        int
	rng       *rand.Rand
	latencies []time.Duration
	bytes     int64
}

// timed runs op, recording its latency and the bytes it moved.
func (t *thread) timed(op func() (int64, error)) error {
	start := time.Now()
	n, err := op()
	t.latencies = append(t.latencies, time.Since(start))
	t.bytes += n
	return err
}

func (r *Runner) dir(set string, thread int) string {
	return filepath.Join(r.root, set, fmt.Sprintf("t%d", thread))
}

func (r *Runner) file(set string, thread, i int) string {
	return filepath.Join(r.dir(set, thread), fmt.Sprintf("f%d", i))
}

// assignInputs shares the files to read among the threads: ReadDir's, else seq-write's.
func (ru *run) assignInputs() error {
	ru.inputs = make([][]string, ru.cfg.Threads)
	if ru.cfg.ReadDir == "" {
		for t := range ru.inputs {
			for i := range ru.cfg.Files {
				ru.inputs[t] = append(ru.inputs[t], ru.file("seq-write", t, i))
			}
		}
		return nil
	}
	var files []string
	err := filepath.WalkDir(ru.cfg.ReadDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing the files to read in %s: %w", ru.cfg.ReadDir, err)
	}
	if len(files) == 0 {
		return fmt.Errorf("--read-dir %s holds no file to read", ru.cfg.ReadDir)
	}
	for i, f := range files {
		ru.inputs[i%len(ru.inputs)] = append(ru.inputs[i%len(ru.inputs)], f)
	}
	return nil
}

func mkdirFor(r *Runner, set string, thread int) error {
	if err := os.MkdirAll(r.dir(set, thread), 0o755); err != nil {
		return fmt.Errorf("making %s: %w", r.dir(set, thread), err)
	}
	return nil
}

func runCreate(ctx context.Context, ru *run, t *thread) error {
	if err := mkdirFor(ru.Runner, "create", t.id); err != nil {
		return err
	}
	for i := range ru.cfg.Files {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err := t.timed(func() (int64, error) {
			f, err := os.OpenFile(ru.file("create", t.id, i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return 0, err
			}
			return 0, f.Close()
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func runExists(ctx context.Context, ru *run, t *thread) error {
	for i := range ru.cfg.Files {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := t.timed(func() (int64, error) { _, err := os.Stat(ru.file("create", t.id, i)); return 0, err }); err != nil {
			return err
		}
	}
	return nil
}

func runRename(ctx context.Context, ru *run, t *thread) error {
	if err := mkdirFor(ru.Runner, "rename", t.id); err != nil {
		return err
	}
	for i := range ru.cfg.Files {
		from := ru.file("rename", t.id, i)
		if err := os.Mkdir(from, 0o755); err != nil {
			return fmt.Errorf("making a folder to rename: %w", err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := t.timed(func() (int64, error) { return 0, os.Rename(from, from+".renamed") }); err != nil {
			return err
		}
	}
	return nil
}

func runList(ctx context.Context, ru *run, t *thread) error {
	for range ru.cfg.Files {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err := t.timed(func() (int64, error) {
			entries, err := os.ReadDir(ru.dir("create", t.id))
			if err == nil && len(entries) != ru.cfg.Files {
				err = fmt.Errorf("listed %d entries in %s, want %d", len(entries), ru.dir("create", t.id), ru.cfg.Files)
			}
			return 0, err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func runDelete(ctx context.Context, ru *run, t *thread) error {
	for i := range ru.cfg.Files {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := t.timed(func() (int64, error) { return 0, os.Remove(ru.file("create", t.id, i)) }); err != nil {
			return err
		}
	}
	return nil
}

func runSeqWrite(ctx context.Context, ru *run, t *thread) error {
	return writeFiles(ctx, ru, t, "seq-write", false)
}

func runRandWrite(ctx context.Context, ru *run, t *thread) error {
	return writeFiles(ctx, ru, t, "rand-write", true)
}

// writeFiles writes the thread's Files files of set, in order or at shuffled offsets; each
// write call is an operation, and the close that seals the file is part of the last one.
func writeFiles(ctx context.Context, ru *run, t *thread, set string, shuffled bool) error {
	if err := mkdirFor(ru.Runner, set, t.id); err != nil {
		return err
	}
	buf := fill(t.rng, ru.cfg.IOSize)
	for i := range ru.cfg.Files {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := writeFile(t, ru.file(set, t.id, i), ru.cfg.FileSize, buf, shuffled); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(t *thread, path string, size int64, buf []byte, shuffled bool) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	offsets := make([]int64, 0, size/int64(len(buf))+1)
	for off := int64(0); off < size; off += int64(len(buf)) {
		offsets = append(offsets, off)
	}
	if shuffled {
		t.rng.Shuffle(len(offsets), func(i, j int) { offsets[i], offsets[j] = offsets[j], offsets[i] })
	}
	for k, off := range offsets {
		last := k == len(offsets)-1
		err := t.timed(func() (int64, error) {
			n, err := f.WriteAt(buf[:min(int64(len(buf)), size-off)], off)
			if err == nil && last {
				err = f.Close()
			}
			return int64(n), err
		})
		if err != nil {
			_ = f.Close()
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	if len(offsets) == 0 { // an empty file: its close is the operation
		return t.timed(func() (int64, error) { return 0, f.Close() })
	}
	return nil
}

func fill(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func runSeqRead(ctx context.Context, ru *run, t *thread) error {
	buf := make([]byte, ru.cfg.IOSize)
	for _, path := range ru.inputs[t.id] {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := readWhole(t, path, buf); err != nil {
			return err
		}
	}
	return nil
}

// readWhole reads the file at path from start to end; each read call is an operation.
func readWhole(t *thread, path string, buf []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	for {
		var eof bool
		err := t.timed(func() (int64, error) {
			n, err := f.Read(buf)
			if err == io.EOF {
				eof, err = true, nil
			}
			return int64(n), err
		})
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		if eof {
			return nil
		}
	}
}

func runRandRead(ctx context.Context, ru *run, t *thread) error {
	buf := make([]byte, ru.cfg.IOSize)
	for _, path := range ru.inputs[t.id] {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := readRandomly(t, path, buf); err != nil {
			return err
		}
	}
	return nil
}

// readRandomly reads size/len(buf) pieces of the file at path at random offsets.
func readRandomly(t *thread, path string, buf []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	size := info.Size()
	if size == 0 {
		return nil
	}
	for range max(1, size/int64(len(buf))) {
		off := t.rng.Int64N(size)
		err := t.timed(func() (int64, error) {
			n, err := f.ReadAt(buf, off)
			if err == io.EOF {
				err = nil
			}
			return int64(n), err
		})
		if err != nil {
			return fmt.Errorf("reading %s at %d: %w", path, off, err)
		}
	}
	return nil
}

func runMixed(ctx context.Context, ru *run, t *thread) error {
	if err := mkdirFor(ru.Runner, "mixed", t.id); err != nil {
		return err
	}
	buf := fill(t.rng, ru.cfg.IOSize)
	inputs := ru.inputs[t.id]
	for i := range ru.cfg.Files {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var err error
		if len(inputs) > 0 && t.rng.Float64() < ru.cfg.ReadShare {
			err = readWhole(t, inputs[t.rng.IntN(len(inputs))], buf)
		} else {
			err = writeFile(t, ru.file("mixed", t.id, i), ru.cfg.FileSize, buf, false)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func runIterative(ctx context.Context, ru *run, t *thread) error {
	buf := fill(t.rng, ru.cfg.IOSize)
	for round := range ru.cfg.Rounds {
		set := fmt.Sprintf("iterative/round%d", round)
		if err := mkdirFor(ru.Runner, set, t.id); err != nil {
			return err
		}
		for i := range ru.cfg.Files {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if round > 0 {
				if err := readWhole(t, ru.file(fmt.Sprintf("iterative/round%d", round-1), t.id, i), buf); err != nil {
					return err
				}
			}
			if err := writeFile(t, ru.file(set, t.id, i), ru.cfg.FileSize, buf, false); err != nil {
				return err
			}
		}
	}
	return nil
}
