// Package testenv decides what a test does on a machine that lacks something it needs (root,
// FUSE, a MinIO binary, a network namespace, a kernel feature): it skips on a developer's
// machine and fails where every test must run. CI sets MustRunVar (see .ci/run), so a suite can
// never pass there by leaving out what it was meant to try.
package testenv

import "os"

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
