package outputfs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/callerpod"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestAKilledAttemptsFilesGiveWayToItsRetry writes an output as a Lineage's Job does when its
// first pod is killed mid-write: the killed pod's files (sealed by its exit) are its attempt's,
// unseen by other nodes; its retry, on the same node, writes the same paths again instead of
// failing with EPERM; once the operator publishes the retry's attempt and discards the killed
// one's, the other node reads the retry's bytes and none of the killed pod's files.
func TestAKilledAttemptsFilesGiveWayToItsRetry(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	_, err := master.SetDatasetRecovery(ctx, &masterpb.SetDatasetRecoveryRequest{
		Name: dataset, Root: root, Recovery: &masterpb.DatasetRecovery{WaitSeconds: 600, CommitPerAttempt: true}})
	g.Expect(err).NotTo(HaveOccurred())
	var caller atomic.Pointer[callerpod.Caller]
	as := func(pod, container string) { caller.Store(&callerpod.Caller{PodUID: pod, Container: container}) }
	writer := mountOutputIn(t, master, startWorker(t, master, "pool/node-a", 64<<20), blockSize,
		filepath.Join(t.TempDir(), "staging"), testr.New(t), func(c *outputfs.Config) {
			c.Callers = func(uint32) (callerpod.Caller, bool) { return *caller.Load(), true }
		})
	reader := mountOutput(t, master, startWorker(t, master, "pool/node-b", 64<<20))
	at := func(s *outputfs.Server, name string) string { return filepath.Join(s.Dir(), name) }
	// big is sealed through the sealing folder and a rename (more than 64 blocks).
	killed := map[string][]byte{"part-0": randomBytes(1000, 1), "tmp-only-killed": randomBytes(10, 2), "big": randomBytes(70*blockSize, 3)}
	retried := map[string][]byte{"part-0": randomBytes(3000, 4), "big": randomBytes(70*blockSize+5, 5)}

	t.Log("the first pod writes, and is killed: its files are sealed as its attempt's")
	as("pod-1", "c-1")
	for name, data := range killed {
		g.Expect(os.WriteFile(at(writer, name), data, 0o644)).To(Succeed())
	}
	for name := range killed {
		_, err := os.Stat(at(reader, name))
		g.Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue(), "another node does not see %s of an attempt not settled: %v", name, err)
	}
	usage, err := master.GetDatasetUsage(ctx, &masterpb.GetDatasetUsageRequest{Name: dataset})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(usage.GetFiles()).To(BeZero())
	g.Expect(usage.GetAttempts()).To(HaveLen(1))
	g.Expect(usage.GetAttempts()[0].GetFiles()).To(Equal(uint64(3)))

	t.Log("its retry writes the same paths on the same node")
	as("pod-2", "c-2")
	for name, data := range retried {
		g.Expect(os.WriteFile(at(writer, name), data, 0o644)).To(Succeed(), "the retry writes %s again", name)
		g.Expect(os.ReadFile(at(writer, name))).To(Equal(data))
	}
	err = os.WriteFile(at(writer, "part-0"), []byte("again"), 0o644)
	g.Expect(errors.Is(err, syscall.EPERM)).To(BeTrue(), "a file stays written once within one attempt: %v", err)

	t.Log("the operator publishes the retry's attempt and discards the killed pod's")
	published, err := master.SettleAttempt(ctx, &masterpb.SettleAttemptRequest{Dataset: dataset, Attempt: "pod-2", Publish: true})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(published.GetFiles()).To(Equal(uint64(2)))
	discarded, err := master.SettleAttempt(ctx, &masterpb.SettleAttemptRequest{Dataset: dataset, Attempt: "pod-1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(discarded.GetFiles()).To(Equal(uint64(1)), "only the file the retry did not write again is left to discard")
	for name, data := range retried {
		g.Expect(readAgain(at(reader, name))).To(Equal(data), "the other node reads the retry's %s", name)
	}
	_, err = os.Stat(at(reader, "tmp-only-killed"))
	g.Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue(), "the killed pod's other file is gone: %v", err)
	_, err = os.ReadFile(at(writer, "tmp-only-killed"))
	g.Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue(), "and gone on the writer's node once opened: %v", err)
	as("pod-3", "c-3")
	err = os.WriteFile(at(writer, "part-0"), []byte("again"), 0o644)
	g.Expect(errors.Is(err, syscall.EPERM)).To(BeTrue(), "a published file is never written again, by any pod: %v", err)
}
