// Package testenv decides what a test does on a machine that lacks something it needs (root,
// FUSE, a MinIO binary, a network namespace, a kernel feature): it skips on a developer's
// machine and fails where every test must run. CI sets MustRunVar (see .ci/run), so a suite can
// never pass there by leaving out what it was meant to try.
package testenv

import (
	"os"
	"strconv"
)

// MustRunVar is the environment variable that, set to anything, turns every such skip into a
// failure.
const MustRunVar = "STRATA_TESTS_MUST_RUN"

// TB is what Lacking needs of a test: testing.TB and Ginkgo's GinkgoT() both have it.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatalf(format string, args ...any)
}

// MustRun says whether tests may not be skipped here.
func MustRun() bool { return os.Getenv(MustRunVar) != "" }

// Lacking ends tb for want of what reason says: a skip, or a failure where tests must run.
func Lacking(tb TB, reason string) {
	tb.Helper()
	if MustRun() {
		tb.Fatalf("%s (%s is set: a test that cannot run here fails rather than skips)", reason, MustRunVar)
		return
	}
	tb.Skip(reason)
}

// BenchObjectsVar sets how many objects the benchmarks of large Datasets use (make bench passes
// its BENCH_OBJECTS).
const BenchObjectsVar = "STRATA_BENCH_OBJECTS"

// BenchObjects is the number of objects BenchObjectsVar asks for, or def when it is not set; a
// value that is not a positive number fails tb.
func BenchObjects(tb TB, def int) int {
	tb.Helper()
	v := os.Getenv(BenchObjectsVar)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive number of objects", BenchObjectsVar, v)
		return def
	}
	return n
}
