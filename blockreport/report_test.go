package blockreport

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
)

func TestCleanDirNamesAFolderOfTheTree(t *testing.T) {
	for dir, want := range map[string]string{
		"": "", "/": "", "raw": "raw", "/raw/2024/": "raw/2024", "raw//2024": "raw/2024", "./raw": "raw",
	} {
		got, err := CleanDir(dir)
		if err != nil || got != want {
			t.Errorf("CleanDir(%q) = %q, %v; want %q", dir, got, err, want)
		}
	}
	for _, dir := range []string{"..", "../other", "raw/../../x"} {
		if _, err := CleanDir(dir); err == nil {
			t.Errorf("CleanDir(%q) did not refuse a folder out of the tree", dir)
		}
	}
}

func TestInDirTakesTheFolderAndWhatIsBelowIt(t *testing.T) {
	for _, c := range []struct {
		path, dir string
		want      bool
	}{
		{"a.bin", "", true}, {"raw/a", "raw", true}, {"raw", "raw", true}, {"raw2/a", "raw", false}, {"x/raw/a", "raw", false},
	} {
		if got := InDir(c.path, c.dir); got != c.want {
			t.Errorf("InDir(%q, %q) = %v, want %v", c.path, c.dir, got, c.want)
		}
	}
}

func TestSumAddsUpAFolderByNodeAndTier(t *testing.T) {
	r := &Report{BlockSize: 10, Files: []File{
		{Path: "a", Size: 25, Blocks: 3, CachedBlocks: 2, CachedBytes: 15, Copies: []Copy{{Node: "n2", Tier: "mem", Blocks: 2, Bytes: 15}}},
		{Path: "d/b", Size: 10, Blocks: 1, CachedBlocks: 1, CachedBytes: 10, Copies: []Copy{
			{Node: "n1", Tier: "ssd", Blocks: 1, Bytes: 10}, {Node: "n2", Tier: "mem", Blocks: 1, Bytes: 10},
		}},
	}}
	NewWithT(t).Expect(r.Sum("")).To(Equal(Usage{Files: 2, Bytes: 35, CachedBytes: 25, ByPlace: []Copy{
		{Node: "n1", Tier: "ssd", Blocks: 1, Bytes: 10}, {Node: "n2", Tier: "mem", Blocks: 3, Bytes: 25},
	}}))
	NewWithT(t).Expect(r.Sum("d").Files).To(BeEquivalentTo(1))
}

func TestEncodeWithinLeavesFilesOutUntilTheReportFits(t *testing.T) {
	g := NewWithT(t)
	r := &Report{Dataset: "team/images", BlockSize: 1 << 20, TotalFiles: 500}
	for i := range 500 {
		r.Files = append(r.Files, File{Path: fmt.Sprintf("images/%04d.jpg", i), Size: 1000, Blocks: 1})
	}
	data, err := r.EncodeWithin(10_000)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(data)).To(BeNumerically("<=", 10_000))
	back, err := Decode(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(back.Files)).To(And(BeNumerically(">", 50), BeNumerically("<", 500)))
	g.Expect(back.TotalFiles).To(BeEquivalentTo(500), "the files left out stay counted")
	g.Expect(back.Files[0].Path).To(Equal("images/0000.jpg"), "the first files, in path order, are kept")

	_, err = (&Report{Dataset: "team/images"}).EncodeWithin(10)
	g.Expect(err).To(MatchError(ErrTooLarge))
}
