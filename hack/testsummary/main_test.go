package main

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

func TestTheSummaryCountsAndKeepsTheVerdict(t *testing.T) {
	g := NewWithT(t)
	events := strings.Join([]string{
		`{"Action":"run","Package":"a","Test":"TestOK"}`,
		`{"Action":"output","Package":"a","Test":"TestOK","Output":"=== RUN   TestOK\n"}`,
		`{"Action":"pass","Package":"a","Test":"TestOK"}`,
		`{"Action":"output","Package":"a","Test":"TestFUSE","Output":"    x_test.go:9: needs /dev/fuse\n"}`,
		`{"Action":"output","Package":"a","Test":"TestFUSE","Output":"--- SKIP: TestFUSE (0.00s)\n"}`,
		`{"Action":"skip","Package":"a","Test":"TestFUSE"}`,
		`{"Action":"output","Package":"a","Output":"ok  \ta\t0.1s\n"}`,
		`{"Action":"pass","Package":"a"}`,
		`{"Action":"output","Package":"b","Test":"TestBroken","Output":"    b_test.go:3: expected 1, got 2\n"}`,
		`{"Action":"fail","Package":"b","Test":"TestBroken"}`,
		`{"Action":"output","Package":"b","Output":"FAIL\tb\t0.2s\n"}`,
		`{"Action":"fail","Package":"b"}`,
		`# b [build output that is not an event]`,
	}, "\n")
	var out strings.Builder
	tally, err := summarize(strings.NewReader(events), &out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tally.failedPackages).To(Equal([]string{"b"}), "a failed package fails the run")
	s := out.String()
	g.Expect(s).To(ContainSubstring("tests: 3 ran, 1 passed, 1 failed, 1 skipped, in 2 packages"))
	g.Expect(s).To(ContainSubstring("skipped: a TestFUSE: x_test.go:9: needs /dev/fuse"))
	g.Expect(s).To(ContainSubstring("--- FAIL: TestBroken (b)\n    b_test.go:3: expected 1, got 2"))
	g.Expect(s).To(ContainSubstring("ok  \ta\t0.1s"))
	g.Expect(s).To(ContainSubstring("# b [build output that is not an event]"))
	g.Expect(s).NotTo(ContainSubstring("=== RUN"), "passing tests' output is not repeated")

	tally, err = summarize(strings.NewReader(""), &out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tally.failedPackages).NotTo(BeEmpty(), "nothing run is a failure, not a pass")
}

// A test binary that dies (a timeout) leaves tests that never end: what they printed, the
// panic among it, is shown with the package's failure.
func TestTheTestsADeadBinaryLeftRunningAreShown(t *testing.T) {
	g := NewWithT(t)
	events := strings.Join([]string{
		`{"Action":"run","Package":"c","Test":"TestHangs"}`,
		`{"Action":"output","Package":"c","Test":"TestHangs","Output":"=== RUN   TestHangs\n"}`,
		`{"Action":"output","Package":"c","Test":"TestHangs","Output":"panic: test timed out after 10m0s\n"}`,
		`{"Action":"output","Package":"c","Test":"TestHangs","Output":"goroutine 7 [chan receive]:\n"}`,
		`{"Action":"output","Package":"c","Output":"FAIL\tc\t600.1s\n"}`,
		`{"Action":"fail","Package":"c"}`,
	}, "\n")
	var out strings.Builder
	tally, err := summarize(strings.NewReader(events), &out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tally.failedPackages).To(Equal([]string{"c"}))
	g.Expect(out.String()).To(ContainSubstring("--- DID NOT END: TestHangs (c)\n=== RUN   TestHangs\npanic: test timed out after 10m0s\ngoroutine 7 [chan receive]:\n"))
}
