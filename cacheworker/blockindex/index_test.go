package blockindex

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
)

// fixture is an index and a two-tier layout in temporary directories: a volatile mem tier with
// one directory and a non-volatile nvme tier with two.
type fixture struct {
	t      *testing.T
	dir    string
	idx    *Index
	layout []TierLayout
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	root := t.TempDir()
	f := &fixture{t: t, dir: root, layout: []TierLayout{
		{Name: "mem", Volatile: true, Dirs: []string{filepath.Join(root, "mem")}},
		{Name: "nvme", Dirs: []string{filepath.Join(root, "nvme0"), filepath.Join(root, "nvme1")}},
	}}
	for _, tl := range f.layout {
		for _, d := range tl.Dirs {
			if err := os.MkdirAll(d, 0o750); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.open()
	return f
}

func (f *fixture) open() {
	f.t.Helper()
	idx, err := Open(filepath.Join(f.dir, "index"), logr.Discard())
	if err != nil {
		f.t.Fatal(err)
	}
	f.idx = idx
	f.t.Cleanup(func() { _ = idx.Close() })
}

// restart closes and reopens the index, as a worker restart does.
func (f *fixture) restart() {
	f.t.Helper()
	if err := f.idx.Close(); err != nil {
		f.t.Fatal(err)
	}
	f.open()
}

// write stores a block the way the tier store does: the file first, then its entry.
func (f *fixture) write(tier string, dirIndex int, id, content string) Entry {
	f.t.Helper()
	var dir string
	for _, tl := range f.layout {
		if tl.Name == tier {
			dir = tl.Dirs[dirIndex]
		}
	}
	if err := os.WriteFile(BlockPath(dir, id), []byte(content), 0o640); err != nil {
		f.t.Fatal(err)
	}
	e := Entry{ID: id, Tier: tier, Dir: dir, Size: int64(len(content)), Checksum: Checksum([]byte(content)),
		Created: time.Unix(1700000000, 0).UTC(), LastAccess: time.Unix(1700000000, 0).UTC()}
	if err := f.idx.Put(e); err != nil {
		f.t.Fatal(err)
	}
	return e
}

func (f *fixture) path(tier string, dirIndex int, name string) string {
	for _, tl := range f.layout {
		if tl.Name == tier {
			return filepath.Join(tl.Dirs[dirIndex], name)
		}
	}
	f.t.Fatalf("no tier %s", tier)
	return ""
}

func ids(es []Entry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

func TestIndexKeepsEntriesAcrossRestarts(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	a := f.write("nvme", 1, "a", "alpha")
	a.Accesses, a.Pinned, a.Clean = 7, true, true
	g.Expect(f.idx.Put(a)).To(Succeed())
	f.write("mem", 0, "b", "beta")
	g.Expect(f.idx.Delete("b")).To(Succeed())
	g.Expect(f.idx.Delete("never-there")).To(Succeed())

	f.restart()

	got, err := f.idx.Get("a")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(a))
	_, err = f.idx.Get("b")
	g.Expect(err).To(MatchError(ErrNotFound))
	all, err := f.idx.All()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ids(all)).To(Equal([]string{"a"}))
}

func TestReconcile(t *testing.T) {
	cases := map[string]struct {
		// damage sets up blocks and then breaks some of them, as a crash or a bad disk would.
		damage   func(f *fixture)
		kept     []string
		findings map[Problem]int
		expected bool // whether every finding is one a restart produces normally
	}{
		"intact blocks on every tier survive": {
			damage: func(f *fixture) {
				f.write("mem", 0, "m1", "memory block")
				f.write("nvme", 0, "n1", "nvme block")
				f.write("nvme", 1, "n2", "another nvme block")
			},
			kept: []string{"m1", "n1", "n2"},
		},
		"a reboot empties the memory tier and its entries are dropped as expected": {
			damage: func(f *fixture) {
				f.write("mem", 0, "m1", "memory block")
				f.write("nvme", 0, "n1", "nvme block")
				must(f.t, os.RemoveAll(f.path("mem", 0, "")))
				must(f.t, os.Mkdir(f.path("mem", 0, ""), 0o750))
			},
			kept:     []string{"n1"},
			findings: map[Problem]int{ProblemMissing: 1},
			expected: true,
		},
		"a block with one flipped byte is removed": {
			damage: func(f *fixture) {
				f.write("nvme", 0, "n1", "nvme block")
				f.write("nvme", 1, "n2", "the block that rots")
				p := f.path("nvme", 1, "n2")
				b, err := os.ReadFile(p)
				must(f.t, err)
				b[4] ^= 0x01
				must(f.t, os.WriteFile(p, b, 0o640))
			},
			kept:     []string{"n1"},
			findings: map[Problem]int{ProblemChecksumMismatch: 1},
		},
		"a truncated block is removed": {
			damage: func(f *fixture) {
				f.write("nvme", 0, "n1", "a block cut short")
				must(f.t, os.Truncate(f.path("nvme", 0, "n1"), 3))
			},
			findings: map[Problem]int{ProblemSizeMismatch: 1},
		},
		"the temporary file of a torn write is removed and nothing is indexed for it": {
			damage: func(f *fixture) {
				f.write("nvme", 0, "n1", "nvme block")
				must(f.t, os.WriteFile(f.path("nvme", 1, TempPrefix+"n2-123"), []byte("half a bl"), 0o640))
			},
			kept:     []string{"n1"},
			findings: map[Problem]int{ProblemTornWrite: 1},
			expected: true,
		},
		"a block file without an entry is removed": {
			damage: func(f *fixture) {
				must(f.t, os.WriteFile(f.path("nvme", 1, "stray"), []byte("moved here, entry never written"), 0o640))
			},
			findings: map[Problem]int{ProblemOrphan: 1},
		},
		"a second copy left by an interrupted move is removed and the recorded one kept": {
			damage: func(f *fixture) {
				f.write("mem", 0, "m1", "moving down")
				must(f.t, os.WriteFile(f.path("nvme", 0, "m1"), []byte("moving down"), 0o640))
			},
			kept:     []string{"m1"},
			findings: map[Problem]int{ProblemOrphan: 1},
		},
		"an entry in a directory that no tier has any more is dropped": {
			damage: func(f *fixture) {
				e := f.write("nvme", 0, "n1", "old layout")
				e.Dir = filepath.Join(f.dir, "retired")
				must(f.t, f.idx.Put(e))
				must(f.t, os.Remove(f.path("nvme", 0, "n1")))
			},
			findings: map[Problem]int{ProblemUnplaced: 1},
		},
		"files that are not blocks are left alone": {
			damage: func(f *fixture) {
				f.write("nvme", 0, "n1", "nvme block")
				must(f.t, os.Mkdir(f.path("nvme", 0, "lost+found"), 0o700))
				must(f.t, os.WriteFile(f.path("nvme", 0, ".operator-note"), []byte("x"), 0o640))
				must(f.t, os.Symlink("/etc/passwd", f.path("nvme", 1, "looks-like-a-block")))
			},
			kept: []string{"n1"},
		},
		"a symlink planted under a block's name is never served": {
			damage: func(f *fixture) {
				f.write("nvme", 0, "n1", "nvme block")
				p := f.path("nvme", 0, "n1")
				must(f.t, os.Remove(p))
				must(f.t, os.Symlink("/etc/hostname", p))
			},
			findings: map[Problem]int{ProblemMissing: 1},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			f := newFixture(t)
			tc.damage(f)
			f.restart()

			rep, err := f.idx.Reconcile(context.Background(), f.layout, 2)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ids(rep.Kept)).To(ConsistOf(tc.kept))
			got := make(map[Problem]int)
			for _, fd := range rep.Findings {
				got[fd.Problem]++
				g.Expect(fd.Expected).To(Equal(tc.expected), "finding %s", fd)
			}
			if tc.findings == nil {
				tc.findings = map[Problem]int{}
			}
			g.Expect(got).To(Equal(tc.findings))

			// The index now records exactly the kept blocks, and the tier directories hold
			// exactly their files (plus what is not the worker's), so a second pass finds nothing.
			all, err := f.idx.All()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(ids(all)).To(ConsistOf(tc.kept))
			again, err := f.idx.Reconcile(context.Background(), f.layout, 2)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(again.Findings).To(BeEmpty())
			g.Expect(ids(again.Kept)).To(ConsistOf(tc.kept))
			for _, e := range again.Kept {
				b, err := os.ReadFile(e.Path())
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(Checksum(b)).To(Equal(e.Checksum))
			}
		})
	}
}

func TestReconcileFollowsADirectoryToItsNewTier(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	f.write("nvme", 1, "n1", "block")
	f.layout = []TierLayout{
		f.layout[0],
		{Name: "nvme", Dirs: f.layout[1].Dirs[:1]},
		{Name: "ssd", Dirs: f.layout[1].Dirs[1:]},
	}
	rep, err := f.idx.Reconcile(context.Background(), f.layout, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rep.Kept).To(HaveLen(1))
	g.Expect(rep.Kept[0].Tier).To(Equal("ssd"))
	e, err := f.idx.Get("n1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(e.Tier).To(Equal("ssd"))
}

func TestReconcileRefusesADirectoryInTwoTiers(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	layout := []TierLayout{f.layout[0], {Name: "nvme", Dirs: f.layout[0].Dirs}}
	_, err := f.idx.Reconcile(context.Background(), layout, 1)
	g.Expect(err).To(MatchError(ContainSubstring("belongs to both tier mem and tier nvme")))
}

func TestReconcileStopsWhenCancelled(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t)
	f.write("nvme", 0, "n1", strings.Repeat("x", 4<<20))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.idx.Reconcile(ctx, f.layout, 1)
	g.Expect(err).To(MatchError(context.Canceled))
	// Nothing was dropped on the way out.
	_, err = f.idx.Get("n1")
	g.Expect(err).NotTo(HaveOccurred())
}

func TestValidateID(t *testing.T) {
	cases := map[string]struct {
		id    string
		valid bool
	}{
		"a hash and a block number are fine":                {id: "3f2a9c-000017", valid: true},
		"dots and underscores inside are fine":              {id: "part_0.block.1", valid: true},
		"an empty id is refused":                            {id: ""},
		"a parent reference is refused":                     {id: ".."},
		"a path is refused":                                 {id: "../../etc/passwd"},
		"a slash is refused":                                {id: "a/b"},
		"a leading dot, as temporary files use, is refused": {id: ".tmp-a"},
		"a NUL byte is refused":                             {id: "a\x00b"},
		"a space is refused":                                {id: "a b"},
		"an id longer than the limit is refused":            {id: strings.Repeat("a", MaxIDLength+1)},
		"an id of exactly the limit is fine":                {id: strings.Repeat("a", MaxIDLength), valid: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			err := ValidateID(tc.id)
			if tc.valid {
				g.Expect(err).NotTo(HaveOccurred())
			} else {
				g.Expect(err).To(MatchError(ErrInvalidID))
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
