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
		value           string
		skipped, failed bool
	}{
		"on a developer's machine, a test that cannot run is skipped": {value: "", skipped: true},
		"where every test must run, it fails":                         {value: "1", failed: true},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			t.Setenv(MustRunVar, tc.value)
			r := &recorder{}
			Lacking(r, "needs /dev/fuse")
			g.Expect(r.skipped != "").To(Equal(tc.skipped))
			g.Expect(r.failed != "").To(Equal(tc.failed))
			g.Expect(r.skipped + r.failed).To(ContainSubstring("needs /dev/fuse"))
		})
	}
}
