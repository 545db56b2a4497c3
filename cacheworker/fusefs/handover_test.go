package fusefs

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/internal/fusetest"
)

// TestAHandedOverMountGoesOnServingOpenFiles stands for a worker restart: the first server
// stops (Suspend) with files open and a reader waiting, and a second one takes the mount over
// from the handed-over files (Resume). The reader completes with the right bytes, the open
// files go on reading, new opens, lookups and listings work, and passthrough opens made before
// the handover and after it agree with the kernel.
func TestAHandedOverMountGoesOnServingOpenFiles(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	cfg := f.config(func(c *Config) { c.Local = localBlocks{f.store} })
	dir := filepath.Join(t.TempDir(), "mnt")
	g.Expect(os.Mkdir(dir, 0o755)).To(Succeed())
	first, err := Mount(context.Background(), dir, cfg)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })

	big := f.data.files["big.bin"]
	open, err := os.Open(filepath.Join(dir, "big.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = open.Close() }()
	head := make([]byte, testBlockSize/2)
	_, err = io.ReadFull(open, head)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(head).To(Equal(big[:len(head)]))

	// A one-block file opened in each mode before the handover: cached now, then (its block
	// stored) passed through, if the kernel offers passthrough.
	const one = "one-block.bin"
	cached, err := os.ReadFile(filepath.Join(dir, one))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cached).To(Equal(f.data.files[one]))
	g.Eventually(func() bool { return f.stored(one, 0) }).WithTimeout(10 * time.Second).Should(BeTrue())
	heldOne, err := os.Open(filepath.Join(dir, one))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = heldOne.Close() }()

	h, err := first.Handover()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = h.Close() }()
	first.Suspend()

	// Nothing serves the mount now: a read of bytes the kernel has not cached waits.
	rest := fusetest.ReadRest(t, open, "the handover")
	g.Consistently(rest).WithTimeout(300*time.Millisecond).ShouldNot(Receive(), "nothing serves the mount between the two servers")

	second, err := Resume(context.Background(), h, cfg)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := second.Unmount(ctx); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	g.Expect(second.Dir()).To(Equal(dir))
	g.Expect(counter(t, f.reg, "strata_worker_fuse_takeovers_total")).To(Equal(1.0))
	g.Expect(second.Files()).To(Equal(first.Files()))

	var got []byte
	g.Eventually(rest).WithTimeout(10 * time.Second).Should(Receive(&got))
	g.Expect(sum(append(head, got...))).To(Equal(sum(big)), "the reader that waited gets every byte")

	// The file opened before is read again from its start through the new server.
	again := make([]byte, len(big))
	_, err = open.ReadAt(again, 0)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sum(again)).To(Equal(sum(big)))

	// New opens, lookups and listings, of files never looked up before the handover too.
	files, folders := walk(t, dir)
	g.Expect(files).To(HaveLen(len(f.data.files)))
	for p, b := range f.data.files {
		g.Expect(sum(files[p])).To(Equal(sum(b)), p)
	}
	g.Expect(folders).To(ContainElement("empty folder"))

	// Opens of the one-block file, while one made before the handover is outstanding, and
	// after it is closed: the kernel would fail an open in the wrong mode with EIO.
	for range 2 {
		b, err := os.ReadFile(filepath.Join(dir, one))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(b).To(Equal(f.data.files[one]))
	}
	g.Expect(heldOne.Close()).To(Succeed())
	b, err := os.ReadFile(filepath.Join(dir, one))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b).To(Equal(f.data.files[one]))
}

// TestAHandoverWithoutStateIsRefused checks that Resume says what is missing.
func TestAHandoverWithoutStateIsRefused(t *testing.T) {
	g := NewWithT(t)
	_, err := Resume(context.Background(), Handover{}, Config{Blocks: failingBlocks{}, BlockSize: 1})
	g.Expect(err).To(MatchError(ContainSubstring("needs the connection, the state and the table of open files")))
	_, err = HandoverFromFiles(nil)
	g.Expect(err).To(MatchError(ContainSubstring("3 files")))
}
