package bindmount

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"

	"github.com/strata-cache/strata/internal/testenv"
)

func TestBindMountReadOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "mounting needs root; the CI and the node plugin run as root")
	}
	g := NewWithT(t)
	src, target := t.TempDir(), t.TempDir()
	g.Expect(os.WriteFile(filepath.Join(src, "data"), []byte("dataset"), 0o600)).To(Succeed())
	m := New()

	g.Expect(m.Mount(src, target, "", []string{"bind", "ro", "nosuid", "nodev"})).To(Succeed())
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	g.Expect(os.ReadFile(filepath.Join(target, "data"))).To(Equal([]byte("dataset")))
	err := os.WriteFile(filepath.Join(target, "new"), []byte("x"), 0o600)
	g.Expect(errors.Is(err, unix.EROFS)).To(BeTrue(), "a read-only bind refuses writes, got %v", err)
	notMnt, err := m.IsLikelyNotMountPoint(target)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(notMnt).To(BeFalse())

	g.Expect(mount.CleanupMountPoint(target, m, true)).To(Succeed(), "mount-utils' cleanup works through this mounter")
	_, err = os.Stat(target)
	g.Expect(os.IsNotExist(err)).To(BeTrue(), "the target is unmounted and removed")
	g.Expect(os.ReadFile(filepath.Join(src, "data"))).To(Equal([]byte("dataset")), "the source is untouched")
}

func TestMountRefusesWhatIsNotABindMount(t *testing.T) {
	cases := map[string]struct {
		fstype  string
		options []string
		want    string
	}{
		"a mount without bind":         {options: []string{"ro"}, want: "only bind mounts"},
		"a file-system type":           {fstype: "ext4", options: []string{"bind"}, want: "no file-system type"},
		"an option that is not a flag": {options: []string{"bind", "uid=0"}, want: `unsupported option "uid=0"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := New().Mount(t.TempDir(), t.TempDir(), tc.fstype, tc.options)
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}
