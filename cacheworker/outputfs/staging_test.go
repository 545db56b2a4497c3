package outputfs

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/blockindex"
)

// TestAStagedFileReadsBackWhatWasWrittenAcrossItsBlockFiles writes, truncates and reads a
// staged file of 10-byte blocks beside a plain byte slice doing the same, and opens it again
// from its files as a process taking over does.
func TestAStagedFileReadsBackWhatWasWrittenAcrossItsBlockFiles(t *testing.T) {
	type step = stagingStep
	cases := map[string][]step{
		"one block":                        {{write: []byte("hello"), at: 0}},
		"across three blocks":              {{write: []byte("abcdefghijklmnopqrstuvwxyz"), at: 3}},
		"a hole of a whole block is zeros": {{write: []byte("x"), at: 0}, {write: []byte("yz"), at: 25}},
		"overwrites":                       {{write: bytes.Repeat([]byte("a"), 30), at: 0}, {write: []byte("BBBB"), at: 8}},
		"truncated into a block":           {{write: bytes.Repeat([]byte("a"), 30), at: 0}, {truncate: 14}},
		"truncated to nothing":             {{write: bytes.Repeat([]byte("a"), 30), at: 0}, {truncate: 0}},
		"extended by truncate past a hole": {{write: []byte("abc"), at: 0}, {truncate: 27}},
		"shrunk onto a hole, then written": {{write: []byte("a"), at: 0}, {write: []byte("b"), at: 35}, {truncate: 15}, {write: []byte("c"), at: 16}},
	}
	for name, steps := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			dir := t.TempDir()
			s, err := createStaged(dir, "0a1b", 10)
			g.Expect(err).NotTo(HaveOccurred())
			want := applyStagingSteps(g, s, steps)
			g.Expect(readAll(t, s)).To(Equal(want))
			s.close()

			folder, err := readStagingFolder(dir, 10, nil)
			g.Expect(err).NotTo(HaveOccurred())
			again, _, err := openStaged(folder, "0a1b")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(again.Size()).To(BeEquivalentTo(len(want)), "the size is found again from the files")
			g.Expect(readAll(t, again)).To(Equal(want))
			g.Expect(again.remove()).To(Succeed())
			g.Expect(os.ReadDir(dir)).To(BeEmpty())
		})
	}
}

// TestAFileStagedWholeByAnOlderVersionIsCutIntoBlocks: a worker of an earlier version kept a
// file being written in one staging file named by its token; the process taking over its mount
// cuts it into block files, and a conversion that was killed half way is done again. A block
// that version's seal stored had its staged bytes freed (zeros in the whole file): its file
// is the stored block's, linked in, not the zeros.
func TestAFileStagedWholeByAnOlderVersionIsCutIntoBlocks(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	data := []byte("the quick brown fox jumps")
	punched := bytes.Clone(data)
	clear(punched[10:20]) // block 1, stored and freed
	g.Expect(os.WriteFile(filepath.Join(dir, "77aa"), punched, 0o600)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(dir, "77aa-1"), []byte("half"), 0o600)).To(Succeed()) // a killed conversion
	storedBlock := filepath.Join(t.TempDir(), "tier-block")
	g.Expect(os.WriteFile(storedBlock, data[10:20], 0o600)).To(Succeed())
	stored := func(id string, length int64) string {
		if id == blockindex.OutputBlockID("77aa", 1) && length == 10 {
			return storedBlock
		}
		return ""
	}

	folder, err := readStagingFolder(dir, 10, stored)
	g.Expect(err).NotTo(HaveOccurred())
	s, _, err := openStaged(folder, "77aa")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(readAll(t, s)).To(Equal(data))
	block1, err := os.Open(s.blockPath(1))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = block1.Close() }()
	g.Expect(sameFile(block1, storedBlock)).To(BeTrue(), "block 1's file is the stored block")
	s.close()
	names, err := os.ReadDir(dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stagingNames(names)["77aa"]).To(ConsistOf("77aa-0", "77aa-1", "77aa-2"))
}

// TestAMissingFirstBlockFileIsAnError: block 0's file always exists, so a staging folder
// without it lost the file.
func TestAMissingFirstBlockFileIsAnError(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	g.Expect(os.WriteFile(filepath.Join(dir, "99cc-1"), []byte("x"), 0o600)).To(Succeed())
	_, _, err := openStaged(stagingFolder{dir: dir, blockSize: 10, names: map[string][]string{"99cc": {"99cc-1"}}}, "99cc")
	g.Expect(err).To(MatchError(ContainSubstring("the staging file 99cc-0 is missing")))
}

func resized(b []byte, size int64) []byte {
	if size <= int64(len(b)) {
		return b[:size]
	}
	return append(b, make([]byte, size-int64(len(b)))...)
}

func readAll(t *testing.T, s *stagedFile) []byte {
	t.Helper()
	buf := make([]byte, s.Size()+7)
	n, err := s.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if n != int(s.Size()) {
		t.Fatalf("read %d bytes of %d", n, s.Size())
	}
	// And in small pieces at odd offsets, across the block files.
	var pieces []byte
	for off := int64(0); off < s.Size(); off += 3 {
		p := make([]byte, 3)
		k, err := s.ReadAt(p, off)
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		pieces = append(pieces, p[:k]...)
	}
	if !bytes.Equal(pieces, buf[:n]) {
		t.Fatalf("read in pieces %q, whole %q", pieces, buf[:n])
	}
	return buf[:n]
}

// TestARestoredBlockNoLongerSharesItsFile: after a failed seal whose stored block could not be
// removed, the staged bytes get a file of their own, so that writes that follow leave the kept
// block as it was.
func TestARestoredBlockNoLongerSharesItsFile(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	s, err := createStaged(dir, "5e5e", 10)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = s.WriteAt([]byte("0123456789abc"), 0)
	g.Expect(err).NotTo(HaveOccurred())
	path, err := s.blockFile(0, 10)
	g.Expect(err).NotTo(HaveOccurred())
	kept := filepath.Join(dir, "kept")
	g.Expect(os.Link(path, kept)).To(Succeed()) // as the tier store links it

	g.Expect(s.restore(0)).To(Succeed())
	_, err = s.WriteAt([]byte("XY"), 2)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.ReadFile(kept)).To(Equal([]byte("0123456789")), "the kept block is unchanged")
	g.Expect(readAll(t, s)).To(Equal([]byte("01XY456789abc")))
	entries, err := os.ReadDir(dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stagingNames(entries)["5e5e"]).To(ConsistOf("5e5e-0", "5e5e-1"), "no copy left behind")
}

// TestAStagedFileOfManyBlocksKeepsFewFilesOpen: a large file of small blocks holds a few
// descriptors, not one per block, and still reads back whole.
func TestAStagedFileOfManyBlocksKeepsFewFilesOpen(t *testing.T) {
	g := NewWithT(t)
	s, err := createStaged(t.TempDir(), "6f6f", 10)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(s.remove()).To(Succeed()) }()
	want := make([]byte, 1000)
	for i := range want {
		want[i] = byte(i)
	}
	for off := 0; off < len(want); off += 7 {
		_, err := s.WriteAt(want[off:min(off+7, len(want))], int64(off))
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(len(s.open)).To(BeNumerically("<=", maxOpenBlockFiles))
	g.Expect(s.blocks).To(HaveLen(100))
	g.Expect(readAll(t, s)).To(Equal(want))
	g.Expect(len(s.open)).To(BeNumerically("<=", maxOpenBlockFiles))
}

// TestAStagedFileSumsTheBlocksWrittenOnce: a block whose bytes were all written once, in any
// order, through WriteAt, into a file the staged file made, has its checksum for the seal; any
// other block (overwritten, left with a hole, cut by a truncation, found again after a
// takeover) has none, and the store reads it instead. A checksum given is always the bytes'.
func TestAStagedFileSumsTheBlocksWrittenOnce(t *testing.T) {
	type step = stagingStep
	w := func(s string, at int64) step { return step{write: []byte(s), at: at} }
	for name, tc := range map[string]struct {
		steps  []step
		summed []int64
	}{
		"appends in order across blocks":  {steps: []step{w("abc", 0), w("defghijklmnop", 3), w("qrstuvwxyz", 16)}, summed: []int64{0, 1, 2}},
		"an overwrite":                    {steps: []step{w("aaaaaaaaaaaaaaa", 0), w("B", 3)}, summed: []int64{1}},
		"a hole within a block":           {steps: []step{w("x", 0), w("y", 5)}},
		"a whole block's hole":            {steps: []step{w("aaaaaaaaaa", 0), w("yz", 25)}, summed: []int64{0}},
		"truncated into summed bytes":     {steps: []step{w(strings.Repeat("a", 30), 0), {truncate: 14}}, summed: []int64{0}},
		"truncated to nothing, rewritten": {steps: []step{w(strings.Repeat("a", 30), 0), {truncate: 0}, w("xyz", 0)}},
		"extended by truncate":            {steps: []step{w("abc", 0), {truncate: 27}}},
		"a restored block keeps its sum":  {steps: []step{w("abcdefghijkl", 0), {restore: true, index: 0}, w("mn", 12)}, summed: []int64{0, 1}},
		// Threads writing parts of a file at once reach WriteAt in any order.
		"parts out of order within a block":    {steps: []step{w("ghij", 6), w("def", 3), w("abc", 0)}, summed: []int64{0}},
		"blocks out of order":                  {steps: []step{w("klmnopqrst", 10), w("abcdefghij", 0), w("uv", 20)}, summed: []int64{0, 1, 2}},
		"a waiting part overwritten":           {steps: []step{w("def", 3), w("e", 4), w("abc", 0)}},
		"a waiting part overlapped from below": {steps: []step{w("fgh", 5), w("abcdef", 0)}},
		"truncated into a waiting part":        {steps: []step{w("abc", 0), w("hij", 7), {truncate: 8}}},
		"a hole left before a waiting part":    {steps: []step{w("abc", 0), w("hij", 7), w("uv", 20)}, summed: []int64{2}},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			dir := t.TempDir()
			s, err := createStaged(dir, "0a1b", 10)
			g.Expect(err).NotTo(HaveOccurred())
			want := applyStagingSteps(g, s, tc.steps)
			check := func(s *stagedFile, summed []int64) {
				for index := int64(0); index*10 < int64(len(want)); index++ {
					block := want[index*10 : min(int64(len(want)), (index+1)*10)]
					sum, ok := s.checksum(index, int64(len(block)))
					g.Expect(ok).To(Equal(slices.Contains(summed, index)), "block %d", index)
					if ok {
						g.Expect(sum).To(Equal(blockindex.Checksum(block)), "block %d", index)
					}
				}
			}
			check(s, tc.summed)
			s.close()
			folder, err := readStagingFolder(dir, 10, nil)
			g.Expect(err).NotTo(HaveOccurred())
			again, _, err := openStaged(folder, "0a1b")
			g.Expect(err).NotTo(HaveOccurred())
			check(again, nil)
		})
	}
}

// stagingStep is a write of write at at, or when write is nil, a truncation to truncate, or
// with restore, a restore of block index.
type stagingStep struct {
	write    []byte
	at       int64
	truncate int64
	restore  bool
	index    int64
}

// applyStagingSteps does steps to s and returns what a plain byte slice holds after the same.
func applyStagingSteps(g *WithT, s *stagedFile, steps []stagingStep) []byte {
	var want []byte
	for _, st := range steps {
		switch {
		case st.restore:
			g.Expect(s.restore(st.index)).To(Succeed())
		case st.write == nil:
			g.Expect(s.Truncate(st.truncate)).To(Succeed())
			want = resized(want, st.truncate)
		default:
			n, err := s.WriteAt(st.write, st.at)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(n).To(Equal(len(st.write)))
			want = resized(want, max(int64(len(want)), st.at+int64(len(st.write))))
			copy(want[st.at:], st.write)
		}
	}
	return want
}
