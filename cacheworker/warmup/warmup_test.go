package warmup

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

func TestRunReadsEveryFileOnce(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	var want int64
	for i, name := range []string{"a", "sub/b", "sub/deeper/c", "été 2024.csv"} {
		p := filepath.Join(dir, name)
		g.Expect(os.MkdirAll(filepath.Dir(p), 0o750)).To(Succeed())
		data := make([]byte, 1000*(i+1))
		g.Expect(os.WriteFile(p, data, 0o600)).To(Succeed())
		want += int64(len(data))
	}
	var reports []Result
	res, err := Run(context.Background(), dir, 3, func(r Result) { reports = append(reports, r) })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(Result{Files: 4, Bytes: want}))
	g.Expect(reports).To(HaveLen(4), "one progress report per file")
	g.Expect(reports[3]).To(Equal(res), "the last report is the total")
}

func TestRunStopsWhenTheContextEnds(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, dir, 2, nil)
	NewWithT(t).Expect(err).To(MatchError(context.Canceled))
}
