package tiermount

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/internal/testenv"
)

func TestEnsureMemoryTiers(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "mounting tmpfs needs root; the CI and the worker's pod run as root")
	}
	g := NewWithT(t)
	base := t.TempDir()
	mem := filepath.Join(base, "mem")
	disk := filepath.Join(base, "nvme")
	g.Expect(os.MkdirAll(disk, 0o750)).To(Succeed())
	tiers := []tierstore.Tier{
		{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{mem}, Quota: 8 << 20},
		{Name: "nvme", Medium: datav1alpha1.MediumNVMe, Dirs: []string{disk}, Quota: 1 << 30},
	}
	onDisk, err := InMemory(base)
	g.Expect(err).NotTo(HaveOccurred())
	if onDisk {
		testenv.Lacking(t, "the test's temporary directory is itself on tmpfs, so there is nothing to mount: set TMPDIR to a folder on a disk")
	}

	g.Expect(EnsureMemoryTiers(tiers, logr.Discard())).To(Succeed())
	t.Cleanup(func() { _ = unix.Unmount(mem, unix.MNT_DETACH) })
	g.Expect(InMemory(mem)).To(BeTrue(), "the MEM tier's directory is on tmpfs")
	g.Expect(InMemory(disk)).To(BeFalse(), "other tiers are left on their disks")
	var st unix.Statfs_t
	g.Expect(unix.Statfs(mem, &st)).To(Succeed())
	g.Expect(int64(st.Blocks)*st.Bsize).To(Equal(int64(8<<20)), "the tmpfs is the size of the quota")
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage"); err == nil {
		g.Expect(mountOptions(t, mem)).To(ContainSubstring(hugePages), "a kernel with huge pages puts large blocks in them")
	}

	// A block written there survives a second call, as after a worker restart: no new mount
	// hides it.
	g.Expect(os.WriteFile(filepath.Join(mem, "block"), []byte("kept"), 0o600)).To(Succeed())
	g.Expect(EnsureMemoryTiers(tiers, logr.Discard())).To(Succeed())
	g.Expect(os.ReadFile(filepath.Join(mem, "block"))).To(Equal([]byte("kept")))
}

// mountOptions are the options /proc/self/mounts shows for the mount at dir.
func mountOptions(t *testing.T, dir string) string {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if fields := strings.Fields(line); len(fields) >= 4 && fields[1] == dir {
			return fields[3]
		}
	}
	t.Fatalf("%s is not a mount point", dir)
	return ""
}
