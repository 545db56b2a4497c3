package tierstore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/internal/testenv"
)

// TestAdoptLinksAFileInsteadOfCopyingIt stores a file that lies on the tier's file system as a
// block: the block is the file itself (one inode, nothing copied), the file stays where it was
// for its owner to remove, and the block reads back and checks as any other.
func TestAdoptLinksAFileInsteadOfCopyingIt(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	s := newStore(t, []tierSpec{memTier, nvmeTier}, nil)
	src := filepath.Join(s.root, "staged")
	data := content("blk-1", 250)
	g.Expect(os.WriteFile(src, data, 0o600)).To(Succeed())

	info, err := s.Adopt(ctx, "blk-1", src, 250, PutOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Tier).To(Equal("mem"))
	g.Expect(info.Checksum).To(Equal(blockindex.Checksum(data)))
	g.Expect(sameInode(t, src, blockindex.BlockPath(info.Dir, "blk-1"))).To(BeTrue(), "linked, not copied")
	g.Expect(s.stats("mem").Used).To(BeEquivalentTo(250))

	g.Expect(os.Remove(src)).To(Succeed())
	g.Expect(s.get("blk-1")).To(Equal(data), "the block outlives the name it was adopted from")
	s.restart()
	g.Expect(s.get("blk-1")).To(Equal(data), "and a restart")

	_, err = s.Adopt(ctx, "blk-1", src, 250, PutOptions{})
	g.Expect(err).To(MatchError(ErrExists))
}

// TestAdoptCopiesAFileOfAnotherFileSystem: a hard link cannot cross file systems, so a file
// elsewhere is copied, and left as it was.
func TestAdoptCopiesAFileOfAnotherFileSystem(t *testing.T) {
	g := NewWithT(t)
	s := newStore(t, []tierSpec{memTier}, nil)
	src := filepath.Join(otherFileSystem(t, s.root), "staged")
	data := content("blk-2", 180)
	g.Expect(os.WriteFile(src, data, 0o600)).To(Succeed())

	info, err := s.Adopt(context.Background(), "blk-2", src, 180, PutOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sameInode(t, src, blockindex.BlockPath(info.Dir, "blk-2"))).To(BeFalse(), "copied")
	g.Expect(s.get("blk-2")).To(Equal(data))
	g.Expect(os.ReadFile(src)).To(Equal(data), "the file stays as it was")
}

// TestAdoptRefusesAFileOfAnotherSize stores nothing when the file is not the size declared.
func TestAdoptRefusesAFileOfAnotherSize(t *testing.T) {
	g := NewWithT(t)
	s := newStore(t, []tierSpec{memTier}, nil)
	src := filepath.Join(s.root, "staged")
	g.Expect(os.WriteFile(src, content("blk-3", 90), 0o600)).To(Succeed())

	_, err := s.Adopt(context.Background(), "blk-3", src, 100, PutOptions{})
	g.Expect(err).To(MatchError(ContainSubstring("it has 90 bytes, 100 were declared")))
	_, err = s.Info("blk-3")
	g.Expect(err).To(MatchError(ErrNotFound))
	g.Expect(s.stats("mem").Used).To(BeZero())
	entries, err := os.ReadDir(filepath.Join(s.root, "mem", "a"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(entries).To(BeEmpty(), "no link left behind")
}

func sameInode(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(fa, fb)
}

func statDev(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev
}

// TestAdoptChoosesTheDirectoryItCanLinkInto: of a tier's directories, a file is linked into one
// on its own file system, even when another is emptier.
func TestAdoptChoosesTheDirectoryItCanLinkInto(t *testing.T) {
	g := NewWithT(t)
	shm := otherFileSystem(t, t.TempDir())
	s := newStore(t, []tierSpec{{name: "mem", medium: memTier.medium, quota: 10, high: 0.9, low: 0.5, dirs: 2}}, func(c *Config) {
		c.Tiers[0].Dirs[1] = filepath.Join(shm, "b")
	})
	src := filepath.Join(shm, "staged")
	data := content("blk-4", 120)
	g.Expect(os.WriteFile(src, data, 0o600)).To(Succeed())

	info, err := s.Adopt(context.Background(), "blk-4", src, 120, PutOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Dir).To(Equal(filepath.Join(shm, "b")))
	g.Expect(sameInode(t, src, blockindex.BlockPath(info.Dir, "blk-4"))).To(BeTrue(), "linked")
	g.Expect(s.get("blk-4")).To(Equal(data))
}

// otherFileSystem is a folder on /dev/shm, a file system other than the one of dir (the test's
// temporary folders are on the disk).
func otherFileSystem(t *testing.T, dir string) string {
	t.Helper()
	shm, err := os.MkdirTemp("/dev/shm", "adopt-")
	if err != nil {
		testenv.Lacking(t, fmt.Sprint("no /dev/shm for a folder of another file system: ", err))
	}
	t.Cleanup(func() { _ = os.RemoveAll(shm) })
	if statDev(t, shm) == statDev(t, dir) {
		testenv.Lacking(t, "/dev/shm and the test's temporary folder are one file system here")
	}
	return shm
}

// TestAdoptTakesTheChecksumItIsGiven: a file whose writer took its checksum is linked in with
// that checksum, unread (so a wrong one is what every later read checks against); copied from
// another file system, or written by Put, the bytes must match the checksum given.
func TestAdoptTakesTheChecksumItIsGiven(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	s := newStore(t, []tierSpec{memTier}, nil)
	data := content("blk-4", 300)
	right, wrong := blockindex.Checksum(data), blockindex.Checksum(data)+1

	src := filepath.Join(s.root, "staged")
	g.Expect(os.WriteFile(src, data, 0o600)).To(Succeed())
	info, err := s.Adopt(ctx, "blk-4", src, 300, PutOptions{Checksum: &right})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Checksum).To(Equal(right))
	g.Expect(s.get("blk-4")).To(Equal(data))

	vouched := filepath.Join(s.root, "vouched")
	g.Expect(os.WriteFile(vouched, data, 0o600)).To(Succeed())
	info, err = s.Adopt(ctx, "blk-5", vouched, 300, PutOptions{Checksum: &wrong})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Checksum).To(Equal(wrong), "taken as given, the file unread")
	r, _, err := s.OpenVerified(ctx, "blk-5")
	g.Expect(err).NotTo(HaveOccurred())
	_, err = io.Copy(io.Discard, r)
	g.Expect(err).To(MatchError(ErrCorrupt), "and every read checks against it")
	g.Expect(r.Close()).To(Succeed())

	elsewhere := filepath.Join(otherFileSystem(t, s.root), "staged")
	g.Expect(os.WriteFile(elsewhere, data, 0o600)).To(Succeed())
	_, err = s.Adopt(ctx, "blk-6", elsewhere, 300, PutOptions{Checksum: &wrong})
	g.Expect(err).To(MatchError(ErrCorrupt), "a copy is checked against it")
	_, err = s.Put(ctx, "blk-7", bytes.NewReader(data), 300, PutOptions{Checksum: &wrong})
	g.Expect(err).To(MatchError(ErrCorrupt), "so is a Put")
	for _, id := range []string{"blk-6", "blk-7"} {
		_, err = s.Info(id)
		g.Expect(err).To(MatchError(ErrNotFound), id)
	}
}
