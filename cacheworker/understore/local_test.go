package understore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// localFixture is an allowed root holding a dataset directory, and a secret next to it that
// no path through the store may reach.
type localFixture struct {
	allowed, dataset, secret string
}

func newLocalFixture(t *testing.T) localFixture {
	t.Helper()
	top := t.TempDir()
	f := localFixture{
		allowed: filepath.Join(top, "allowed"),
		dataset: filepath.Join(top, "allowed", "dataset"),
		secret:  filepath.Join(top, "secret"),
	}
	for _, d := range []string{filepath.Join(f.dataset, "dir", "sub"), f.secret} {
		must(t, os.MkdirAll(d, 0o750))
	}
	must(t, os.WriteFile(filepath.Join(f.secret, "key"), []byte("do not read"), 0o600))
	must(t, os.WriteFile(filepath.Join(f.dataset, "a.txt"), []byte("0123456789"), 0o640))
	must(t, os.WriteFile(filepath.Join(f.dataset, "dir", "b.txt"), []byte("bee"), 0o640))
	must(t, os.WriteFile(filepath.Join(f.dataset, "dir", "sub", "c.txt"), []byte("sea"), 0o640))
	must(t, os.WriteFile(filepath.Join(f.dataset, "dirty.txt"), []byte("not in dir/"), 0o640))
	// Links: one that stays inside the dataset, and three that lead out of it.
	must(t, os.Symlink("a.txt", filepath.Join(f.dataset, "inside-link")))
	must(t, os.Symlink(f.secret, filepath.Join(f.dataset, "dir-out")))
	must(t, os.Symlink(filepath.Join(f.secret, "key"), filepath.Join(f.dataset, "file-out")))
	must(t, os.Symlink("../../secret/key", filepath.Join(f.dataset, "relative-out")))
	return f
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNewLocalConfinesTheStoreToTheAllowedRoots(t *testing.T) {
	cases := map[string]struct {
		cfg  func(f localFixture) LocalConfig
		kind error
	}{
		"a directory under an allowed root is opened": {
			cfg: func(f localFixture) LocalConfig {
				return LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}}
			},
		},
		"an allowed root itself is opened": {
			cfg: func(f localFixture) LocalConfig {
				return LocalConfig{Dir: f.allowed, AllowedRoots: []string{f.allowed}}
			},
		},
		"a directory outside every allowed root is refused": {
			cfg:  func(f localFixture) LocalConfig { return LocalConfig{Dir: f.secret, AllowedRoots: []string{f.allowed}} },
			kind: ErrOutsideRoots,
		},
		"a symlink under an allowed root that leads outside it is refused": {
			cfg: func(f localFixture) LocalConfig {
				return LocalConfig{Dir: filepath.Join(f.dataset, "dir-out"), AllowedRoots: []string{f.allowed}}
			},
			kind: ErrOutsideRoots,
		},
		"a parent reference out of the allowed root is refused": {
			cfg: func(f localFixture) LocalConfig {
				return LocalConfig{Dir: f.allowed + "/../secret", AllowedRoots: []string{f.allowed}}
			},
			kind: ErrOutsideRoots,
		},
		"no allowed roots refuses every directory": {
			cfg:  func(f localFixture) LocalConfig { return LocalConfig{Dir: f.dataset} },
			kind: ErrOutsideRoots,
		},
		"a missing directory is not found": {
			cfg: func(f localFixture) LocalConfig {
				return LocalConfig{Dir: filepath.Join(f.allowed, "nope"), AllowedRoots: []string{f.allowed}}
			},
			kind: ErrNotFound,
		},
		"a relative directory is invalid": {
			cfg: func(f localFixture) LocalConfig {
				return LocalConfig{Dir: "dataset", AllowedRoots: []string{f.allowed}}
			},
			kind: ErrInvalidPath,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			f := newLocalFixture(t)
			l, err := NewLocal(tc.cfg(f))
			if tc.kind == nil {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(l.Close()).To(Succeed())
				return
			}
			g.Expect(err).To(MatchError(tc.kind))
			var e *Error
			g.Expect(errors.As(err, &e)).To(BeTrue())
			g.Expect(e.Op).To(Equal("connect"))
		})
	}
}

func TestLocalRefusesEveryWayOut(t *testing.T) {
	cases := map[string]struct {
		path string
		kind error
		// writeKind is what a write to the path fails with; nil if it may succeed. A write never
		// follows the last symlink of a path: it replaces the link, so nothing outside changes.
		writeKind error
	}{
		"a plain file is read":                          {path: "a.txt"},
		"a symlink that stays inside is followed":       {path: "inside-link"},
		"a parent reference is refused":                 {path: "../../secret/key", kind: ErrOutsideRoots, writeKind: ErrOutsideRoots},
		"a parent reference inside the path is refused": {path: "dir/../../secret/key", kind: ErrOutsideRoots, writeKind: ErrOutsideRoots},
		"a symlinked directory leading out is refused":  {path: "dir-out/key", kind: ErrOutsideRoots, writeKind: ErrOutsideRoots},
		"a symlinked file leading out is refused":       {path: "file-out", kind: ErrOutsideRoots},
		"a relative symlink climbing out is refused":    {path: "relative-out", kind: ErrOutsideRoots},
		"an absolute path is invalid":                   {path: "/etc/hostname", kind: ErrInvalidPath, writeKind: ErrInvalidPath},
		"an empty element is invalid":                   {path: "dir//b.txt", kind: ErrInvalidPath, writeKind: ErrInvalidPath},
		"a missing file is not found":                   {path: "dir/none.txt", kind: ErrNotFound},
		"a directory is not an object and is not found": {path: "dir", kind: ErrNotFound},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			f := newLocalFixture(t)
			l, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { g.Expect(l.Close()).To(Succeed()) }()

			buf := make([]byte, 4)
			_, statErr := l.Stat(ctx, tc.path)
			_, readErr := l.ReadAt(ctx, tc.path, buf, 0)
			_, openErr := l.Open(ctx, tc.path)
			if tc.kind == nil {
				g.Expect(statErr).NotTo(HaveOccurred())
				g.Expect(readErr).NotTo(HaveOccurred())
				g.Expect(openErr).NotTo(HaveOccurred())
				g.Expect(string(buf)).To(Equal("0123"))
				return
			}
			for _, err := range []error{statErr, readErr, openErr} {
				g.Expect(err).To(MatchError(tc.kind))
				g.Expect(err.Error()).To(ContainSubstring(tc.path), "the error names the object")
				g.Expect(err.Error()).NotTo(ContainSubstring("do not read"))
			}
			if _, werr := l.Write(ctx, tc.path, strings.NewReader("x"), 1, Precondition{}); tc.writeKind != nil {
				g.Expect(werr).To(MatchError(tc.writeKind))
			}
			secret, err := os.ReadFile(filepath.Join(f.secret, "key"))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(string(secret)).To(Equal("do not read"), "no write reached the secret")
		})
	}
}

func TestLocalReadAt(t *testing.T) {
	cases := map[string]struct {
		off     int64
		size    int
		want    string
		wantEOF bool
	}{
		"a range inside the file":               {off: 2, size: 3, want: "234"},
		"a range running past the end is short": {off: 7, size: 10, want: "789", wantEOF: true},
		"a range starting at the end is empty":  {off: 10, size: 4, want: "", wantEOF: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			f := newLocalFixture(t)
			l, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { g.Expect(l.Close()).To(Succeed()) }()
			buf := make([]byte, tc.size)
			n, err := l.ReadAt(context.Background(), "a.txt", buf, tc.off)
			g.Expect(string(buf[:n])).To(Equal(tc.want))
			if tc.wantEOF {
				g.Expect(err).To(MatchError(io.EOF))
			} else {
				g.Expect(err).NotTo(HaveOccurred())
			}
		})
	}
}

func TestLocalList(t *testing.T) {
	cases := map[string]struct {
		prefix string
		want   []string
	}{
		"everything, symlinks that stay inside included": {prefix: "", want: []string{"a.txt", "dir/b.txt", "dir/sub/c.txt", "dirty.txt", "inside-link"}},
		"a directory prefix":                             {prefix: "dir/", want: []string{"dir/b.txt", "dir/sub/c.txt"}},
		"a prefix that is not a whole name":              {prefix: "dir", want: []string{"dir/b.txt", "dir/sub/c.txt", "dirty.txt"}},
		"a prefix inside a directory":                    {prefix: "dir/s", want: []string{"dir/sub/c.txt"}},
		"a prefix matching nothing":                      {prefix: "zzz/", want: nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			f := newLocalFixture(t)
			l, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { g.Expect(l.Close()).To(Succeed()) }()
			var got []string
			for info, err := range l.List(context.Background(), tc.prefix) {
				g.Expect(err).NotTo(HaveOccurred())
				got = append(got, info.Path)
			}
			g.Expect(got).To(Equal(tc.want))
		})
	}

	t.Run("a prefix climbing out is refused", func(t *testing.T) {
		g := NewWithT(t)
		f := newLocalFixture(t)
		l, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { g.Expect(l.Close()).To(Succeed()) }()
		for _, err := range l.List(context.Background(), "../") {
			g.Expect(err).To(MatchError(ErrOutsideRoots))
		}
	})
}

func TestLocalWriteIsAtomic(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newLocalFixture(t)
	l, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(l.Close()).To(Succeed()) }()

	g.Expect(l.Write(ctx, "checkpoints/run-1/part-0", strings.NewReader("first"), 5, Precondition{})).Error().NotTo(HaveOccurred())
	g.Expect(l.Write(ctx, "checkpoints/run-1/part-0", strings.NewReader("second"), 6, Precondition{})).Error().NotTo(HaveOccurred())
	rc, err := l.Open(ctx, "checkpoints/run-1/part-0")
	g.Expect(err).NotTo(HaveOccurred())
	b, err := io.ReadAll(rc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rc.Close()).To(Succeed())
	g.Expect(string(b)).To(Equal("second"))

	// A write whose source fails leaves the old object and no temporary file.
	_, err = l.Write(ctx, "checkpoints/run-1/part-0", io.MultiReader(strings.NewReader("thi"), errReader{}), 5, Precondition{})
	g.Expect(err).To(MatchError(ContainSubstring("source broke")))
	entries, err := os.ReadDir(filepath.Join(f.dataset, "checkpoints", "run-1"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(entries).To(HaveLen(1))
	b, err = os.ReadFile(filepath.Join(f.dataset, "checkpoints", "run-1", "part-0"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(b).To(Equal([]byte("second")))

	// A cancelled context stops the write.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	g.Expect(l.Write(cctx, "checkpoints/x", bytes.NewReader([]byte("y")), 1, Precondition{})).Error().To(MatchError(context.Canceled))

	testConditionalWrites(t, l, "checkpoints/conditional", 1<<10, 1<<10)
}

// testConditionalWrites checks a store's conditional writes at p with objects of n bytes
// (size as Write is told: n, or -1 for unknown): of two writers that looked at the same
// version, or at no object, the first to land wins and the other fails with ErrChanged,
// leaving the winner's bytes.
func testConditionalWrites(t *testing.T, s Store, p string, n int, size int64) {
	ctx := context.Background()
	g := NewWithT(t)
	content := func(fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }
	write := func(fill byte, pre Precondition) (string, error) {
		return s.Write(ctx, p, bytes.NewReader(content(fill)), size, pre)
	}
	holds := func(fill byte) {
		t.Helper()
		rc, err := s.Open(ctx, p)
		g.Expect(err).NotTo(HaveOccurred())
		b, err := io.ReadAll(rc)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(rc.Close()).To(Succeed())
		g.Expect(bytes.Equal(b, content(fill))).To(BeTrue(), "%s holds the bytes of writer %c", p, fill)
	}

	none, err := Current(ctx, s, p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(Equal(Precondition{Absent: true}))
	etag, err := write('a', none)
	g.Expect(err).NotTo(HaveOccurred())
	info, err := s.Stat(ctx, p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(etag).To(Equal(info.ETag), "Write returns the version Stat gives")
	_, err = write('b', none)
	g.Expect(err).To(MatchError(ErrChanged), "a second writer that saw no object finds one")
	holds('a')

	seen, err := Current(ctx, s, p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(seen).To(Equal(Precondition{ETag: etag}))
	_, err = write('c', seen)
	g.Expect(err).NotTo(HaveOccurred(), "the version it expects")
	_, err = write('d', seen)
	g.Expect(err).To(MatchError(ErrChanged), "a writer that saw the version replaced since")
	g.Expect(err.Error()).To(ContainSubstring(p))
	holds('c')
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("source broke") }
