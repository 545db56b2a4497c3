// Command testsummary reads `go test -json` on its standard input and writes what a person
// reading `make test` needs: each package's result line as go test prints it, the output of
// every test that failed, and at the end how many tests ran, passed, failed and were skipped,
// naming the skipped ones and why. It exits non-zero when a package failed, so that a pipe
// from go test keeps its verdict.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of test2json's output.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// tally is what a run of tests came to.
type tally struct {
	passed, failed, skipped int
	// skips are the skipped tests, each with the last line it printed (its reason).
	skips          []string
	failedPackages []string
}

func main() {
	t, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if len(t.failedPackages) > 0 {
		os.Exit(1)
	}
}

// summarize reads events from in and writes the summary to out.
func summarize(in io.Reader, out io.Writer) (tally, error) {
	var t tally
	// outputs holds each running test's lines until it ends: printed if it fails.
	outputs := map[string][]string{}
	packages := 0
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event: a build error or a line of a test binary that crashed.
			_, _ = fmt.Fprintln(out, string(line))
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Test == "" && e.Action == "output":
			// The package's own lines: "ok  pkg 1.2s", "FAIL", coverage, panics outside tests.
			if s := e.Output; !strings.HasPrefix(s, "=== ") && !strings.HasPrefix(s, "PASS") {
				_, _ = fmt.Fprint(out, s)
			}
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			packages++
			if e.Action == "fail" {
				t.failedPackages = append(t.failedPackages, e.Package)
				unended(out, outputs, e.Package)
			}
		case e.Action == "output":
			outputs[key] = append(outputs[key], e.Output)
		case e.Action == "pass":
			t.passed++
			delete(outputs, key)
		case e.Action == "skip":
			t.skipped++
			t.skips = append(t.skips, fmt.Sprintf("%s %s: %s", e.Package, e.Test, lastLine(outputs[key])))
			delete(outputs, key)
		case e.Action == "fail":
			t.failed++
			_, _ = fmt.Fprintf(out, "--- FAIL: %s (%s)\n%s", e.Test, e.Package, strings.Join(outputs[key], ""))
			delete(outputs, key)
		}
	}
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("reading go test's events: %w", err)
	}
	if packages == 0 {
		t.failedPackages = append(t.failedPackages, "(none ran)")
	}
	sort.Strings(t.skips)
	_, _ = fmt.Fprintf(out, "\ntests: %d ran, %d passed, %d failed, %d skipped, in %d packages\n",
		t.passed+t.failed+t.skipped, t.passed, t.failed, t.skipped, packages)
	for _, s := range t.skips {
		_, _ = fmt.Fprintln(out, "skipped:", s)
	}
	if len(t.failedPackages) > 0 {
		_, _ = fmt.Fprintln(out, "FAILED:", strings.Join(t.failedPackages, " "))
	}
	return t, nil
}

// unended prints, and forgets, what the tests of pkg that never ended printed: those running
// when its test binary died (a timeout's panic, with the goroutines' stacks, is among their
// lines), which would otherwise go unsaid.
func unended(out io.Writer, outputs map[string][]string, pkg string) {
	var keys []string
	for key := range outputs {
		if strings.HasPrefix(key, pkg+" ") {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		_, _ = fmt.Fprintf(out, "--- DID NOT END: %s (%s)\n%s", strings.TrimPrefix(key, pkg+" "), pkg, strings.Join(outputs[key], ""))
		delete(outputs, key)
	}
}

// lastLine is the last non-empty line a test printed, where a skip says why.
func lastLine(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		if s := strings.TrimSpace(lines[i]); s != "" && !strings.HasPrefix(s, "--- SKIP") && !strings.HasPrefix(s, "=== ") {
			return s
		}
	}
	return "(no reason given)"
}
