package outputfs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/internal/fdstore"
	"github.com/strata-cache/strata/internal/fdstore/fdstoretest"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// The test binary, run with childEnv set, is a worker that mounts an output Dataset, puts its
// handover in a file descriptor store, and then serves it until killed.
const childEnv = "STRATA_OUTPUTFS_TEST_CHILD"

const workerQuota = 64 << 20

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

// childSpec is what the child is told: where to mount, the store's socket, the master, and
// the folder of its tiers and staging files.
type childSpec struct{ dir, sock, masters, base string }

func (c childSpec) String() string {
	return strings.Join([]string{c.dir, c.sock, c.masters, c.base}, "|")
}

func runChild(spec string) error {
	parts := strings.Split(spec, "|")
	if len(parts) != 4 {
		return errors.New("want dir|socket|masters|base")
	}
	c := childSpec{parts[0], parts[1], parts[2], parts[3]}
	master, err := client.New(strings.Split(c.masters, ","), client.Options{AttemptTimeout: time.Second})
	if err != nil {
		return err
	}
	dir := locations.NewDirectory(master, dataplane.NewPeers(), "pool/node-a", logr.Discard())
	store, err := openStore(c.base, workerQuota, dir)
	if err != nil {
		return err
	}
	s, err := outputfs.Mount(context.Background(), c.dir, outputfs.Config{
		Dataset: dataset, Root: root, Master: master, Store: store, Locations: dir,
		BlockSize: blockSize, StagingDir: filepath.Join(c.base, "staging"), Name: "strata:test",
	})
	if err != nil {
		return err
	}
	h, err := s.Handover()
	if err != nil {
		return err
	}
	return fusetest.ChildReady(c.sock, h.Files())
}

// TestAKilledWorkersOutputMountGoesOn kills (SIGKILL) the process serving an output mount
// while one file is half written, another half read and a folder made, and takes the mount
// over in this process from the file descriptor store, with a tier store reopened over the
// same folders, as a restarted worker does. The writer goes on through the same descriptor and
// its close seals the whole file; the reader gets every byte; names made before the kill stay.
func TestAKilledWorkersOutputMountGoesOn(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	cluster := mastertest.New(t, 1, mastertest.Options{GRPC: true})
	master := cluster.Client()
	_, err := master.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: "pool/node-a", Address: "127.0.0.1:1", Node: "node-a"})
	g.Expect(err).NotTo(HaveOccurred())
	_, sock := fdstoretest.Start(t)
	base := t.TempDir()
	mnt := filepath.Join(t.TempDir(), "mnt")
	g.Expect(os.Mkdir(mnt, 0o755)).To(Succeed())
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })

	child := fusetest.StartChild(t, childEnv+"="+childSpec{mnt, sock, strings.Join(cluster.APIAddrs(), ","), base}.String())

	sealed := randomBytes(2*blockSize+777, 7)
	g.Expect(os.MkdirAll(filepath.Join(mnt, "part-0"), 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(mnt, "part-0/done.bin"), sealed, 0o644)).To(Succeed())
	g.Expect(os.Mkdir(filepath.Join(mnt, "empty"), 0o700)).To(Succeed())
	reader, err := os.Open(filepath.Join(mnt, "part-0/done.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = reader.Close() }()
	head := make([]byte, 1000)
	_, err = io.ReadFull(reader, head)
	g.Expect(err).NotTo(HaveOccurred())
	first, second := randomBytes(blockSize+10, 8), randomBytes(blockSize, 9)
	writer, err := os.Create(filepath.Join(mnt, "part-0/open.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = writer.Close() }()
	_, err = writer.Write(first)
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(child.Process.Kill()).To(Succeed())
	_ = child.Wait()
	rest := fusetest.ReadRest(t, reader, "the kill")

	w := startWorkerIn(t, master, "pool/node-a", workerQuota, base)
	fds, err := fdstore.NewClient(sock, "test")
	g.Expect(err).NotTo(HaveOccurred())
	_, files, err := fds.Get(ctx, "mount")
	g.Expect(err).NotTo(HaveOccurred())
	h, err := outputfs.HandoverFromFiles(files)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = h.Close() }()
	next, err := outputfs.Resume(ctx, h, outputfs.Config{
		Dataset: dataset, Root: root, Master: master, Store: w.store, Locations: w.dir,
		BlockSize: blockSize, StagingDir: filepath.Join(base, "staging"), Name: "strata:test", Log: testr.New(t),
	})
	g.Expect(err).NotTo(HaveOccurred())

	var got []byte
	g.Eventually(rest).WithTimeout(10 * time.Second).Should(Receive(&got))
	g.Expect(append(head, got...)).To(Equal(sealed), "the reader gets every byte of the file sealed before the kill")
	_, err = writer.Write(second)
	g.Expect(err).NotTo(HaveOccurred(), "the writer goes on through the same descriptor")
	g.Expect(writer.Close()).To(Succeed(), "its close seals the file in the process that took over")
	whole := append(first, second...)
	files2, err := masterFiles(ctx, master)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(files2).To(Equal(map[string]int64{"part-0/done.bin": int64(len(sealed)), "part-0/open.bin": int64(len(whole))}))
	g.Expect(os.ReadFile(filepath.Join(mnt, "part-0/open.bin"))).To(Equal(whole))
	st, err := os.Stat(filepath.Join(mnt, "empty"))
	g.Expect(err).NotTo(HaveOccurred(), "a folder made before the kill is still there")
	g.Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o700)))
	g.Expect(os.WriteFile(filepath.Join(mnt, "empty/new.txt"), []byte("new"), 0o644)).To(Succeed(), "new files are made as before")

	g.Expect(reader.Close()).To(Succeed())
	g.Expect(fds.Drop(ctx, "mount")).To(Succeed())
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g.Expect(next.Unmount(uctx)).To(Succeed())
}
