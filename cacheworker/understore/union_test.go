package understore

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

func TestCheckMountLayoutRefusesLayoutsThatHideObjects(t *testing.T) {
	cases := map[string]struct {
		paths []string
		want  string // empty: accepted
	}{
		"one folder":                           {paths: []string{"raw"}},
		"folders side by side":                 {paths: []string{"raw", "ref", "raw-2024", "a/b", "a/c"}},
		"a name that only begins like another": {paths: []string{"a", "a-b", "ab"}},
		"no mounts":                            {paths: nil, want: "no mounts"},
		"the root":                             {paths: []string{"", "raw"}, want: "at the root"},
		"two at one folder":                    {paths: []string{"raw", "ref", "raw"}, want: "two mounts at /raw"},
		"one inside another":                   {paths: []string{"a", "a/b"}, want: "mount /a/b is inside mount /a"},
		"inside another, out of order":         {paths: []string{"a/b/c", "x", "a"}, want: "mount /a/b/c is inside mount /a"},
		"inside, with a sibling between":       {paths: []string{"a", "a-b", "a/b"}, want: "mount /a/b is inside mount /a"},
		"an empty element":                     {paths: []string{"a//b"}, want: "invalid path"},
		"a trailing slash":                     {paths: []string{"a/"}, want: "invalid path"},
		"a dot":                                {paths: []string{"a/./b"}, want: "invalid path"},
		"a dot-dot":                            {paths: []string{"a/../b"}, want: "outside the allowed roots"},
		"an absolute path":                     {paths: []string{"/a"}, want: "invalid path"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			err := CheckMountLayout(tc.paths)
			if tc.want == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

// unionFixture is a Union of two local stores: "raw" holds a.txt and dir/b.txt, "ref/v1"
// holds c.txt.
func unionFixture(t *testing.T) *Union {
	t.Helper()
	root := t.TempDir()
	write := func(p, content string) {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o750))
		must(t, os.WriteFile(filepath.Join(root, p), []byte(content), 0o640))
	}
	write("one/a.txt", "0123456789")
	write("one/dir/b.txt", "bee")
	write("two/c.txt", "sea")
	open := func(dir string) Store {
		s, err := NewLocal(LocalConfig{Dir: filepath.Join(root, dir), AllowedRoots: []string{root}})
		must(t, err)
		return s
	}
	u, err := NewUnion([]Mounted{{Path: "ref/v1", Store: open("two")}, {Path: "raw", Store: open("one")}})
	must(t, err)
	t.Cleanup(func() { must(t, u.Close()) })
	return u
}

func listed(t *testing.T, u *Union, prefix string) []string {
	t.Helper()
	var out []string
	for info, err := range u.List(context.Background(), prefix) {
		must(t, err)
		out = append(out, info.Path)
	}
	return out
}

func TestUnionListsEveryMountUnderItsFolder(t *testing.T) {
	u := unionFixture(t)
	cases := map[string]struct {
		prefix string
		want   []string
	}{
		"everything":                   {prefix: "", want: []string{"raw/a.txt", "raw/dir/b.txt", "ref/v1/c.txt"}},
		"a prefix of two mounts":       {prefix: "r", want: []string{"raw/a.txt", "raw/dir/b.txt", "ref/v1/c.txt"}},
		"a mount's folder":             {prefix: "raw/", want: []string{"raw/a.txt", "raw/dir/b.txt"}},
		"inside a mount":               {prefix: "raw/dir/", want: []string{"raw/dir/b.txt"}},
		"a parent of a mount":          {prefix: "ref/", want: []string{"ref/v1/c.txt"}},
		"a name a mount only begins":   {prefix: "raw-", want: nil},
		"a folder no mount is beneath": {prefix: "other/", want: nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Expect(listed(t, u, tc.prefix)).To(Equal(tc.want))
		})
	}
}

func TestUnionReadsEachPathFromItsMount(t *testing.T) {
	g := NewWithT(t)
	u := unionFixture(t)
	ctx := context.Background()

	info, err := u.Stat(ctx, "ref/v1/c.txt")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Path).To(Equal("ref/v1/c.txt"))
	g.Expect(info.Size).To(BeEquivalentTo(3))

	buf := make([]byte, 4)
	n, err := u.ReadVersionAt(ctx, "raw/a.txt", mustStat(t, u, "raw/a.txt").ETag, buf, 8)
	g.Expect(err).To(MatchError(io.EOF), "a read past the end ends with io.EOF itself, not wrapped")
	g.Expect(string(buf[:n])).To(Equal("89"))

	r, err := u.Open(ctx, "raw/dir/b.txt")
	g.Expect(err).NotTo(HaveOccurred())
	b, err := io.ReadAll(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Close()).To(Succeed())
	g.Expect(string(b)).To(Equal("bee"))

	g.Expect(u.String()).To(MatchRegexp(`^/raw=file://.*/one, /ref/v1=file://.*/two$`))
}

func mustStat(t *testing.T, u *Union, p string) ObjectInfo {
	t.Helper()
	info, err := u.Stat(context.Background(), p)
	must(t, err)
	return info
}

func TestUnionNamesTheMountThatFailed(t *testing.T) {
	u := unionFixture(t)
	ctx := context.Background()
	cases := map[string]struct {
		err   func() error
		kind  error
		mount string // empty: no mount holds the path
	}{
		"a path outside every mount": {
			err:  func() error { _, err := u.Stat(ctx, "other/x"); return err },
			kind: ErrNotFound,
		},
		"a mount's folder itself": {
			err:  func() error { _, err := u.ReadAt(ctx, "raw", make([]byte, 1), 0); return err },
			kind: ErrNotFound,
		},
		"an object a mount lacks": {
			err:  func() error { _, err := u.Stat(ctx, "raw/missing"); return err },
			kind: ErrNotFound, mount: "raw",
		},
		"a version that is gone": {
			err:   func() error { _, err := u.ReadVersionAt(ctx, "ref/v1/c.txt", "old", make([]byte, 1), 0); return err },
			kind:  ErrChanged,
			mount: "ref/v1",
		},
		"a write to a store that takes none": {
			err: func() error {
				_, err := u.Write(ctx, "raw/new.txt", errReader{}, -1, Precondition{})
				return err
			},
			mount: "raw",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.err()
			g.Expect(err).To(HaveOccurred())
			if tc.kind != nil {
				g.Expect(err).To(MatchError(tc.kind))
			}
			var me *MountError
			if tc.mount == "" {
				g.Expect(errors.As(err, &me)).To(BeFalse())
				return
			}
			g.Expect(errors.As(err, &me)).To(BeTrue())
			g.Expect(me.Path).To(Equal(tc.mount))
			g.Expect(err.Error()).To(HavePrefix("mount /" + tc.mount + ": "))
		})
	}
}
