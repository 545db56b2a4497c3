package warmup

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/policy"
)

// tree writes files of 1000 × (i+1) bytes under a temporary folder and returns it.
func tree(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for i, name := range names {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, 1000*(i+1)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRunReadsEveryFileOnce(t *testing.T) {
	g := NewWithT(t)
	dir := tree(t, "a", "sub/b", "sub/deeper/c", "été 2024.csv")
	var reports []Result
	res, err := Run(context.Background(), dir, Options{Concurrency: 3, Progress: func(r Result) { reports = append(reports, r) }})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(Result{Files: 4, Bytes: 10000}))
	g.Expect(reports).To(HaveLen(4), "one progress report per file")
	g.Expect(reports[3]).To(Equal(res), "the last report is the total")
}

func TestRunReadsTheSelectedFiles(t *testing.T) {
	dir := tree(t, "a", "sub/b", "sub/deeper/c", "été 2024.csv")
	for _, tc := range []struct {
		name     string
		patterns []string
		metadata bool
		percent  int
		want     Result
	}{
		{name: "a folder, all the way down", patterns: []string{"sub/**"}, want: Result{Files: 2, Bytes: 5000}},
		{name: "one level", patterns: []string{"sub/*"}, want: Result{Files: 1, Bytes: 2000}},
		{name: "two patterns", patterns: []string{"a", "*.csv"}, want: Result{Files: 2, Bytes: 5000}},
		{name: "nothing matches", patterns: []string{"missing/**"}, want: Result{}},
		{name: "metadata only: looked up, sizes counted", patterns: []string{"sub/**"}, metadata: true, want: Result{Files: 2, Bytes: 5000}},
		// sub/b is 2000 bytes, two blocks of 1000; sub/deeper/c 3000, three; half is one and two.
		{name: "half of each file, in blocks", patterns: []string{"sub/**"}, percent: 50, want: Result{Files: 2, Bytes: 3000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			var patterns []policy.Pattern
			for _, p := range tc.patterns {
				c, err := policy.Compile(p)
				g.Expect(err).NotTo(HaveOccurred())
				patterns = append(patterns, c)
			}
			res, err := Run(context.Background(), dir, Options{Paths: patterns, MetadataOnly: tc.metadata, Percent: tc.percent, BlockSize: 1000})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(res).To(Equal(tc.want))
		})
	}
}

func TestRunStopsWhenTheContextEnds(t *testing.T) {
	dir := tree(t, "a")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, dir, Options{Concurrency: 2})
	NewWithT(t).Expect(err).To(MatchError(context.Canceled))
}
