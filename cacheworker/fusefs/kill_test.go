package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/internal/fdstore"
	"github.com/strata-cache/strata/internal/fdstore/fdstoretest"
	"github.com/strata-cache/strata/internal/fusetest"
)

// The test binary, run with childEnv set, is a worker that mounts a Dataset, puts its
// handover in a file descriptor store, and then serves it until killed.
const childEnv = "STRATA_FUSEFS_TEST_CHILD"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		if err := runChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		select {} // serve until killed
	}
	os.Exit(m.Run())
}

var killDataset = fakeLister{{Path: "stuck.bin", Size: 1000}, {Path: "ok.txt", Size: 2}}

// stuckBlocks never answers for stuck.bin, as a worker that is killed in the middle of a read.
type stuckBlocks struct{}

func (stuckBlocks) ReadBlock(ctx context.Context, file, _ string, _, _ int64) ([]byte, error) {
	if file == "stuck.bin" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return []byte("ok"), nil
}

// wholeBlocks answers every file with its bytes: the worker that takes over.
type wholeBlocks struct{}

func (wholeBlocks) ReadBlock(_ context.Context, file, _ string, _, _ int64) ([]byte, error) {
	if file == "stuck.bin" {
		return []byte(strings.Repeat("s", 1000)), nil
	}
	return []byte("ok"), nil
}

func runChild(spec string) error {
	dir, sock, ok := strings.Cut(spec, ",")
	if !ok {
		return errors.New("want dir,socket")
	}
	s, err := Mount(context.Background(), dir, Config{Objects: killDataset, Blocks: stuckBlocks{}, BlockSize: 1 << 20, DisablePassthrough: true})
	if err != nil {
		return err
	}
	h, err := s.Handover()
	if err != nil {
		return err
	}
	return fusetest.ChildReady(sock, h.Files())
}

// TestAKilledServersRequestsAreAnsweredByTheNext kills (SIGKILL) the process serving a mount
// while it holds a read it will never answer. The process that takes the mount over from the
// file descriptor store gets that read again from the kernel (FUSE_NOTIFY_RESEND) and answers
// it: the reader, blocked across the kill, gets its bytes.
func TestAKilledServersRequestsAreAnsweredByTheNext(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	_, sock := fdstoretest.Start(t)

	dir := filepath.Join(t.TempDir(), "mnt")
	g.Expect(os.Mkdir(dir, 0o755)).To(Succeed())
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	child := fusetest.StartChild(t, childEnv+"="+dir+","+sock)

	got := make(chan []byte, 1)
	go func() {
		b, err := os.ReadFile(filepath.Join(dir, "stuck.bin"))
		if err != nil {
			t.Errorf("reading across the kill: %v", err)
		}
		got <- b
	}()
	g.Consistently(got).WithTimeout(500*time.Millisecond).ShouldNot(Receive(), "the first server holds the read")
	g.Expect(child.Process.Kill()).To(Succeed())
	_ = child.Wait()

	c, err := fdstore.NewClient(sock, "test")
	g.Expect(err).NotTo(HaveOccurred())
	_, files, err := c.Get(context.Background(), "mount")
	g.Expect(err).NotTo(HaveOccurred())
	h, err := HandoverFromFiles(files)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = h.Close() }()
	next, err := Resume(context.Background(), h, Config{Blocks: wholeBlocks{}, BlockSize: 1 << 20, DisablePassthrough: true})
	g.Expect(err).NotTo(HaveOccurred())
	var b []byte
	g.Eventually(got).WithTimeout(10*time.Second).Should(Receive(&b), "the read the killed server held is sent again")
	g.Expect(string(b)).To(Equal(strings.Repeat("s", 1000)))
	ok, err := os.ReadFile(filepath.Join(dir, "ok.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(ok)).To(Equal("ok"))

	g.Expect(c.Drop(context.Background(), "mount")).To(Succeed())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g.Expect(next.Unmount(ctx)).To(Succeed())
}
