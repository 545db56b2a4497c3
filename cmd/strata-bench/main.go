// Command strata-bench runs DFS-Perf's workloads (package dfsperf) against a file system
// through its mount, such as a pod's claims of Strata Datasets: an output Dataset to write in,
// an input Dataset to read. It prints a table, and with --json the same as JSON.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/strata-cache/strata/internal/dfsperf"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "strata-bench:", err)
		os.Exit(1)
	}
}

// printer writes output, keeping the first error so that each line need not be checked.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func usage(flags *flag.FlagSet) func() {
	return func() {
		out := &printer{w: flags.Output()}
		out.printf(`strata-bench: DFS-Perf's workloads against a file system through its mount.

Usage:
  strata-bench --dir /out [flags] WORKLOAD... | all

Each workload runs with --threads threads, each on files of its own, below --dir/strata-bench
(made afresh, removed at the end unless --keep). Reads read --read-dir's files when given (an
input Dataset's mount), else files that seq-write wrote first. A workload that needs files
another makes (exists, list and delete need create's; the reads seq-write's) runs that one
first, untimed, if it was not asked for before it.

Workloads:
`)
		tw := tabwriter.NewWriter(flags.Output(), 0, 0, 2, ' ', 0)
		list := &printer{w: tw}
		for _, w := range dfsperf.Workloads {
			list.printf("  %s\t%s\n", w.Name, w.Help)
		}
		list.printf("  %s\t%s\n", "all", "every workload above, in that order")
		_ = tw.Flush()
		out.printf(`
Output: one row per workload: operations and bytes per second, and the latency of one operation
(a create, stat, rename, listing or removal; one read or write call, the write that ends a file
including its close, which on Strata's output mounts seals it), median and 99th percentile.

Flags:
`)
		flags.PrintDefaults()
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("strata-bench", flag.ContinueOnError)
	flags.SetOutput(stderr)
	var cfg dfsperf.Config
	flags.StringVar(&cfg.Dir, "dir", "", "the writable folder to work in (an output Dataset's mount, say); required")
	flags.StringVar(&cfg.ReadDir, "read-dir", "", "a folder whose files seq-read, rand-read and mixed read (an input Dataset's mount); default: files seq-write wrote")
	flags.IntVar(&cfg.Threads, "threads", 4, "threads working at once")
	flags.IntVar(&cfg.Files, "files", 100, "files (and operations of mixed, listings of list, folders of rename) per thread")
	flags.Int64Var(&cfg.FileSize, "size", 1<<20, "bytes of each file written")
	flags.IntVar(&cfg.IOSize, "io-size", 1<<20, "bytes of each read and write call")
	flags.Float64Var(&cfg.ReadShare, "read-share", 0.5, "share of mixed's operations that read")
	flags.IntVar(&cfg.Rounds, "rounds", 3, "rounds of iterative")
	flags.Uint64Var(&cfg.Seed, "seed", 1, "seed of the random offsets, order and choices")
	jsonPath := flags.String("json", "", "also write the results as JSON to this file (- for standard output, after the table)")
	keep := flags.Bool("keep", false, "leave the files the workloads made in --dir/strata-bench")
	flags.Usage = usage(flags)
	if err := flags.Parse(args); err != nil {
		return err
	}
	workloads, err := selected(flags.Args())
	if err != nil {
		flags.Usage()
		return err
	}
	runner, err := dfsperf.NewRunner(cfg)
	if err != nil {
		return err
	}
	results, runErr := runAll(ctx, runner, workloads, stderr)
	if !*keep {
		runErr = errors.Join(runErr, runner.Close())
	}
	if err := report(stdout, results, *jsonPath); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}

// selected are the workloads args name ("all": every one).
func selected(args []string) ([]dfsperf.Workload, error) {
	if len(args) == 0 {
		return nil, errors.New("name at least one workload, or all")
	}
	if len(args) == 1 && args[0] == "all" {
		return dfsperf.Workloads, nil
	}
	var out []dfsperf.Workload
	for _, name := range args {
		w, ok := dfsperf.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("no workload %q (see the list above)", name)
		}
		out = append(out, w)
	}
	return out, nil
}

// runAll runs the workloads in turn until one fails, saying on stderr which runs.
func runAll(ctx context.Context, runner *dfsperf.Runner, workloads []dfsperf.Workload, progress io.Writer) ([]dfsperf.Result, error) {
	var results []dfsperf.Result
	for _, w := range workloads {
		_, _ = fmt.Fprintf(progress, "running %s\n", w.Name) // progress only: a failure to say it stops nothing
		res, err := runner.Run(ctx, w)
		if err != nil {
			return results, err
		}
		results = append(results, res)
	}
	return results, nil
}

func report(stdout io.Writer, results []dfsperf.Result, jsonPath string) error {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	table := &printer{w: tw}
	table.printf("workload\tthreads\tops\tops/s\tMB/s\tp50 µs\tp99 µs\tseconds\t\n")
	for _, r := range results {
		table.printf("%s\t%d\t%d\t%.0f\t%.1f\t%.0f\t%.0f\t%.2f\t\n", r.Workload, r.Threads, r.Ops, r.OpsPerSec, r.MBPerSec, r.P50Micros, r.P99Micros, r.Seconds)
	}
	if err := errors.Join(table.err, tw.Flush()); err != nil {
		return fmt.Errorf("printing the results: %w", err)
	}
	if jsonPath == "" {
		return nil
	}
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if jsonPath == "-" {
		_, err = stdout.Write(data)
		return err
	}
	if err := os.WriteFile(jsonPath, data, 0o644); err != nil {
		return fmt.Errorf("writing the results to %s: %w", jsonPath, err)
	}
	return nil
}
