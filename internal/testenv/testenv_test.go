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
