package outputfs_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestAReaderOfALostFileWaitsForItsRecovery loses files with their node (their blocks are
// dropped from the writer's tier, and no checkpoint has them) while the operator says at the
// master that they will be written again: a read on the other node that began before the loss,
// and an open made after the master forgot the file, both wait and then get every byte of the
// new version; a read whose recovery fails, or whose wait runs out, fails with EIO then; and
// a Dataset that nothing recovers fails at once, as before.
func TestAReaderOfALostFileWaitsForItsRecovery(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	writer := startWorker(t, master, "pool/node-a", 64<<20)
	reader := startWorker(t, master, "pool/node-b", 64<<20)
	written := mountOutput(t, master, writer)
	reg := prometheus.NewRegistry()
	metrics, err := outputfs.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	read := mountOutputIn(t, master, reader, blockSize, filepath.Join(t.TempDir(), "staging"), testr.New(t), func(c *outputfs.Config) {
		c.Metrics, c.RecoveryPoll = metrics, 20*time.Millisecond
	})
	waiting := func() float64 { return gauge(t, reg, "strata_worker_output_recovery_waiting_reads", "") }
	waits := func(outcome string) float64 {
		return gauge(t, reg, "strata_worker_output_recovery_waits_total", outcome)
	}
	recovery := func(wait int64, failed string) {
		t.Helper()
		_, err := master.SetDatasetRecovery(ctx, &masterpb.SetDatasetRecoveryRequest{
			Name: dataset, Root: root, Recovery: &masterpb.DatasetRecovery{WaitSeconds: wait, Failed: failed}})
		g.Expect(err).NotTo(HaveOccurred())
	}
	files := map[string][]byte{
		"data.bin":   randomBytes(2*blockSize+777, 1),
		"opened.bin": randomBytes(blockSize/2, 2),
		"failed.bin": randomBytes(100, 3),
		"late.bin":   randomBytes(100, 4),
		"local.bin":  randomBytes(blockSize+5, 5),
	}
	for name, data := range files {
		g.Expect(os.WriteFile(filepath.Join(written.Dir(), name), data, 0o644)).To(Succeed())
		g.Expect(os.ReadFile(filepath.Join(read.Dir(), name))).To(Equal(data), "the other node reads %s before the loss", name)
	}

	t.Log("a Dataset that nothing recovers: a read of a lost file fails at once")
	lose(ctx, t, master, writer, "late.bin", int64(len(files["late.bin"])))
	_, err = readAgain(filepath.Join(read.Dir(), "late.bin"))
	g.Expect(errors.Is(err, syscall.EIO)).To(BeTrue(), "reading a lost file nothing recovers: %v", err)
	g.Expect(waits("recovered")+waits("failed")+waits("timeout")).To(BeZero(), "no read waited")

	recovery(600, "")
	t.Log("a read that began before the loss waits, and reads the recomputed version")
	f, err := os.Open(filepath.Join(read.Dir(), "data.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = f.Close() }()
	head := make([]byte, 1000)
	_, err = f.ReadAt(head, 0)
	g.Expect(err).NotTo(HaveOccurred())
	lose(ctx, t, master, writer, "data.bin", int64(len(files["data.bin"])))
	// Each read is made afresh: the pages the kernel holds of the version read so far are
	// dropped, so that every byte below comes through the mount.
	g.Expect(dropPages(f)).To(Succeed())
	rest := make(chan readResult, 1)
	go func() {
		b := make([]byte, len(files["data.bin"]))
		n, err := f.ReadAt(b, 0)
		rest <- readResult{b[:n], err}
	}()
	g.Eventually(waiting).Should(Equal(1.0), "the read waits")
	g.Consistently(rest, "200ms").ShouldNot(Receive(), "and goes on waiting while the file is lost")
	forget(ctx, t, master, "data.bin")
	t.Log("an open after the master forgot the file waits too")
	lose(ctx, t, master, writer, "opened.bin", int64(len(files["opened.bin"])))
	forget(ctx, t, master, "opened.bin")
	opened := make(chan readResult, 1)
	go func() {
		b, err := readAgain(filepath.Join(read.Dir(), "opened.bin"))
		opened <- readResult{b, err}
	}()
	g.Eventually(waiting).Should(Equal(2.0), "both wait")
	for _, name := range []string{"data.bin", "opened.bin"} {
		g.Expect(os.WriteFile(filepath.Join(written.Dir(), name), files[name], 0o644)).To(Succeed(), "recomputing %s", name)
	}
	var got readResult
	g.Eventually(rest, "30s").Should(Receive(&got))
	g.Expect(got.err).NotTo(HaveOccurred())
	g.Expect(got.data).To(Equal(files["data.bin"]), "the waiting read gets every byte of the new version")
	g.Eventually(opened, "30s").Should(Receive(&got))
	g.Expect(got.err).NotTo(HaveOccurred())
	g.Expect(got.data).To(Equal(files["opened.bin"]), "the waiting open reads the new version")
	g.Expect(waits("recovered")).To(BeNumerically(">=", 2))
	g.Expect(waiting()).To(BeZero())

	t.Log("a recomputation on the reader's own node writes a new file, while the read that waits holds the old one's pages")
	lose(ctx, t, master, writer, "local.bin", int64(len(files["local.bin"])))
	local := make(chan readResult, 1)
	go func() {
		b, err := readAgain(filepath.Join(read.Dir(), "local.bin"))
		local <- readResult{b, err}
	}()
	g.Eventually(waiting).Should(Equal(1.0))
	forget(ctx, t, master, "local.bin")
	rewritten := make(chan error, 1)
	go func() { rewritten <- os.WriteFile(filepath.Join(read.Dir(), "local.bin"), files["local.bin"], 0o644) }()
	g.Eventually(rewritten, "30s").Should(Receive(BeNil()), "the recomputation's write is not held up by the waiting read")
	g.Eventually(local, "30s").Should(Receive(&got))
	g.Expect(got.err).NotTo(HaveOccurred())
	g.Expect(got.data).To(Equal(files["local.bin"]))

	t.Log("a read whose recovery fails ends with EIO")
	lose(ctx, t, master, writer, "failed.bin", int64(len(files["failed.bin"])))
	failed := make(chan readResult, 1)
	go func() {
		b, err := readAgain(filepath.Join(read.Dir(), "failed.bin"))
		failed <- readResult{b, err}
	}()
	g.Eventually(waiting).Should(Equal(1.0))
	recovery(600, "Lineage features gave up: spec.maxRecomputations reached")
	g.Eventually(failed, "30s").Should(Receive(&got))
	g.Expect(errors.Is(got.err, syscall.EIO)).To(BeTrue(), "the read fails: %v", got.err)
	g.Expect(waits("failed")).To(Equal(1.0))

	t.Log("a read whose wait runs out ends with EIO")
	recovery(1, "")
	_, err = readAgain(filepath.Join(read.Dir(), "failed.bin"))
	g.Expect(errors.Is(err, syscall.EIO)).To(BeTrue(), "the read fails once the wait is over: %v", err)
	g.Expect(waits("timeout")).To(Equal(1.0))
}

type readResult struct {
	data []byte
	err  error
}

// lose drops every block of the sealed file name from w's tier, as if w's node were gone.
func lose(ctx context.Context, t *testing.T, master *client.Client, w *worker, name string, size int64) {
	t.Helper()
	token := tokenOf(ctx, t, master, name)
	for index := int64(0); index*blockSize < size; index++ {
		if err := w.store.Delete(ctx, blockindex.OutputBlockID(token, index)); err != nil {
			t.Fatalf("dropping block %d of %s: %v", index, name, err)
		}
	}
}

// forget makes the master forget the file name, as a recomputation does before it writes it.
func forget(ctx context.Context, t *testing.T, master *client.Client, name string) {
	t.Helper()
	if _, err := master.DeleteFile(ctx, root+"/"+name); err != nil {
		t.Fatalf("forgetting %s: %v", name, err)
	}
}

// readAgain reads the file at p through the mount, not from the pages the kernel kept of it.
func readAgain(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	if err := dropPages(f); err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, st.Size())
	n, err := f.ReadAt(b, 0)
	if errors.Is(err, io.EOF) && n == len(b) {
		err = nil
	}
	return b[:n], err
}

func dropPages(f *os.File) error {
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// gauge is the value of the metric name (of the series whose outcome label is outcome, if set).
func gauge(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := m.GetLabel()
			if outcome != "" && (len(labels) == 0 || labels[0].GetValue() != outcome) {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
