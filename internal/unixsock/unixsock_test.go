package unixsock

import (
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

func TestListen(t *testing.T) {
	cases := map[string]struct {
		// setup prepares path and returns the path to listen on.
		setup   func(t *testing.T, path string) string
		wantErr string
		check   func(g Gomega, path string)
	}{
		"a stale socket left by a process that is gone is replaced": {
			setup: func(t *testing.T, path string) string {
				l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				// As a process that crashed would: the socket file stays, nothing accepts.
				l.SetUnlinkOnClose(false)
				_ = l.Close()
				return path
			},
		},
		"missing parent folders are created, private to owner and group": {
			setup: func(_ *testing.T, path string) string {
				return filepath.Join(filepath.Dir(path), "run", "strata", "x.sock")
			},
			check: func(g Gomega, path string) {
				fi, err := os.Stat(filepath.Dir(path))
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(fi.Mode().Perm()&^0o750).To(BeZero(), "mode %v", fi.Mode().Perm())
			},
		},
		"a socket a live server accepts on is not taken over": {
			setup: func(t *testing.T, path string) string {
				l, err := Listen(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = l.Close() })
				return path
			},
			wantErr: "in use",
			check: func(g Gomega, path string) {
				c, err := net.Dial("unix", path)
				g.Expect(err).NotTo(HaveOccurred(), "the live server still has its socket")
				_ = c.Close()
			},
		},
		"a regular file in the way is left alone": {
			setup: func(t *testing.T, path string) string {
				if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
					t.Fatal(err)
				}
				return path
			},
			wantErr: "not removing it",
			check: func(g Gomega, path string) {
				g.Expect(os.ReadFile(path)).To(Equal([]byte("precious")))
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			path := tc.setup(t, filepath.Join(t.TempDir(), "x.sock"))
			lis, err := Listen(path)
			if tc.check != nil {
				defer tc.check(g, path)
			}
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = lis.Close() }()
			fi, err := os.Lstat(path)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(fi.Mode().Type()).To(Equal(fs.ModeSocket))
			g.Expect(fi.Mode().Perm()).To(Equal(fs.FileMode(0o660)))
			c, err := net.Dial("unix", path)
			g.Expect(err).NotTo(HaveOccurred(), "it accepts")
			_ = c.Close()
		})
	}
}
