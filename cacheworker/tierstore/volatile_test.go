package tierstore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/internal/testenv"
)

// inMemoryDir is a fresh directory on /dev/shm (tmpfs), removed after the test.
func inMemoryDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "strata-tierstore-")
	if err != nil {
		testenv.Lacking(t, fmt.Sprintf("no tmpfs at /dev/shm: %v", err))
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// A block that exists nowhere else is synced, index entry and all, unless its tier's directory
// is in memory: a crash of the kernel, which syncing guards against, takes such blocks with it.
func TestUncleanBlocksAreSyncedOnlyWhereTheyOutliveTheKernel(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dir       func(t *testing.T) string
		clean     bool
		wantSyncs int64
	}{
		{name: "unclean, on disk", dir: func(t *testing.T) string { return t.TempDir() }, wantSyncs: 1},
		{name: "unclean, in memory", dir: inMemoryDir, wantSyncs: 0},
		{name: "clean, on disk", dir: func(t *testing.T) string { return t.TempDir() }, clean: true, wantSyncs: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ts := newStore(t, []tierSpec{memTier}, func(c *Config) { c.Tiers[0].Dirs = []string{tc.dir(t)} })
			ts.put("b1", PutOptions{Clean: tc.clean})
			g.Expect(ts.indexSyncs.Load()).To(Equal(tc.wantSyncs))
			ts.restart()
			g.Expect(ts.get("b1")).To(Equal(content("b1", unit)))
		})
	}
}

// childEnv names the tier and index directories of the worker TestAnUncleanBlockInMemory…
// starts and kills.
const childEnv = "STRATA_TIERSTORE_KILLED_WORKER"

// A worker killed right after it stored a block that exists nowhere else, unsynced in a
// memory tier, loses neither the block nor its index entry.
func TestAnUncleanBlockInMemorySurvivesAKilledWorker(t *testing.T) {
	if dirs := os.Getenv(childEnv); dirs != "" {
		killedWorker(t, dirs)
		return
	}
	g := NewWithT(t)
	mem, index := inMemoryDir(t), filepath.Join(t.TempDir(), "index")
	cmd := exec.Command(os.Args[0], "-test.run=^TestAnUncleanBlockInMemorySurvivesAKilledWorker$")
	cmd.Env = append(os.Environ(), childEnv+"="+mem+string(os.PathListSeparator)+index)
	out, err := cmd.StdoutPipe()
	g.Expect(err).NotTo(HaveOccurred())
	cmd.Stderr = os.Stderr
	g.Expect(cmd.Start()).To(Succeed())
	line, err := bufio.NewReader(out).ReadString('\n')
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(line).To(Equal("stored\n"))
	g.Expect(cmd.Process.Kill()).To(Succeed())
	_ = cmd.Wait()

	s, err := Open(context.Background(), killedWorkerConfig(mem, index))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = s.Close() }()
	got, info, err := s.Get(context.Background(), "b1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(content("b1", unit)))
	g.Expect(info.Clean).To(BeFalse(), "still known as a block that exists nowhere else")
}

func killedWorkerConfig(mem, index string) Config {
	return Config{IndexDir: index, Eviction: eviction.Config{Kind: eviction.LRU}, Tiers: []Tier{
		{Name: "mem", Medium: datav1alpha1.MediumMemory, Quota: 10 * unit, High: 0.9, Low: 0.5, Dirs: []string{mem}},
	}}
}

// killedWorker stores a block unclean, says so, and waits to be killed.
func killedWorker(t *testing.T, dirs string) {
	mem, index, _ := bytes.Cut([]byte(dirs), []byte{os.PathListSeparator})
	s, err := Open(context.Background(), killedWorkerConfig(string(mem), string(index)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(context.Background(), "b1", bytes.NewReader(content("b1", unit)), unit, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if s.indexSyncs.Load() != 0 {
		t.Fatal("the block was synced: this test would not show that an unsynced one survives")
	}
	if _, err := os.Stdout.WriteString("stored\n"); err != nil {
		t.Fatal(err)
	}
	select {} // killed by the test that started it
}
