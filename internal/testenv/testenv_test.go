package testenv

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
)

// recorder is a test that records how it ended.
type recorder struct{ skipped, failed string }

func (r *recorder) Helper()                           {}
func (r *recorder) Skip(args ...any)                  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestLackingSkipsOrFailsAsTheEnvironmentSays(t *testing.T) {
	for name, tc := range map[string]struct {
		value string
		want  recorder
	}{
		"on a developer's machine, a test that cannot run is skipped": {
			value: "", want: recorder{skipped: "needs /dev/fuse"},
		},
		"where every test must run, it fails": {
			value: "1", want: recorder{failed: "needs /dev/fuse (STRATA_TESTS_MUST_RUN is set: a test that cannot run here fails rather than skips)"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(MustRunVar, tc.value)
			r := &recorder{}
			Lacking(r, "needs /dev/fuse")
			NewWithT(t).Expect(*r).To(Equal(tc.want))
		})
	}
}

func TestBenchObjectsIsWhatTheEnvironmentAsksFor(t *testing.T) {
	for name, tc := range map[string]struct {
		value      string
		want       int
		wantFailed bool
	}{
		"unset: the benchmark's own size": {value: "", want: 1_000_000},
		"a number":                        {value: "100000", want: 100_000},
		"not a number fails":              {value: "lots", want: 1_000_000, wantFailed: true},
		"zero fails":                      {value: "0", want: 1_000_000, wantFailed: true},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			t.Setenv(BenchObjectsVar, tc.value)
			r := &recorder{}
			g.Expect(BenchObjects(r, 1_000_000)).To(Equal(tc.want))
			if tc.wantFailed {
				g.Expect(r.failed).To(ContainSubstring("want a positive number of objects"))
			} else {
				g.Expect(r.failed).To(BeEmpty())
			}
		})
	}
}
