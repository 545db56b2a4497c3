package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-cache/strata/internal/dfsperf"
)

func TestHelpDocumentsEveryWorkload(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, w := range dfsperf.Workloads {
		if !strings.Contains(stderr.String(), "  "+w.Name+" ") || !strings.Contains(stderr.String(), w.Help) {
			t.Errorf("--help does not document %s", w.Name)
		}
	}
}

func TestAllWorkloadsPrintATableAndJSON(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(t.TempDir(), "results.json")
	var stdout, stderr bytes.Buffer
	args := []string{"--dir", dir, "--threads", "2", "--files", "3", "--size", "5000", "--io-size", "2048", "--rounds", "2", "--json", jsonFile, "all"}
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var results []dfsperf.Result
	data, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &results); err != nil {
		t.Fatal(err)
	}
	if len(results) != len(dfsperf.Workloads) {
		t.Fatalf("%d results, want one per workload (%d)", len(results), len(dfsperf.Workloads))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 1+len(dfsperf.Workloads) {
		t.Fatalf("the table has %d lines, want a header and one per workload:\n%s", len(lines), stdout.String())
	}
	for i, w := range dfsperf.Workloads {
		if results[i].Workload != w.Name || results[i].Ops == 0 {
			t.Errorf("result %d: %+v, want %s with operations", i, results[i], w.Name)
		}
		if fields := strings.Fields(lines[i+1]); fields[0] != w.Name {
			t.Errorf("table row %d is %q, want %s's", i, lines[i+1], w.Name)
		}
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("the workloads left %d entries in --dir (%v); without --keep they remove theirs", len(entries), err)
	}
}

func TestAWorkloadItDoesNotKnowIsAnError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"--dir", t.TempDir(), "create", "write-everything"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), `"write-everything"`) {
		t.Fatalf("got %v, want an error naming the workload", err)
	}
}
