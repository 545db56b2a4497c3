package fusefs

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/fusetest"
)

// treeOf builds the node list a mount of these objects starts with.
func treeOf(t *testing.T, objects fakeLister) []*node {
	t.Helper()
	tr, err := buildTree(context.Background(), objects, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return flatten(tr, tr.Root.MTime)
}

// shown lists the files of a node list that are in the tree, as path@etag:size, and its
// folders as path/, walking from the root as lookups do.
func shown(nodes []*node) []string {
	var out []string
	var walk func(id uint64, prefix string)
	walk = func(id uint64, prefix string) {
		for _, c := range nodes[id].children {
			n := nodes[c]
			if n.dir {
				out = append(out, prefix+n.name+"/")
				walk(c, prefix+n.name+"/")
				continue
			}
			out = append(out, n.path+"@"+n.etag+":"+strings.Repeat("x", int(n.size)))
		}
	}
	walk(1, "")
	return out
}

func TestARefreshBringsTheTreeInLineWithTheNewListing(t *testing.T) {
	t0 := time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Hour)
	base := fakeLister{
		{Path: "a/b.txt", Size: 2, ModTime: t0, ETag: "b1"},
		{Path: "a/c.txt", Size: 1, ModTime: t0, ETag: "c1"},
		{Path: "d.txt", Size: 3, ModTime: t0, ETag: "d1"},
		{Path: "e/f/g.txt", Size: 1, ModTime: t0, ETag: "g1"},
	}
	with := func(change func(l fakeLister) fakeLister) fakeLister { return change(slices.Clone(base)) }
	cases := []struct {
		name                    string
		listing                 fakeLister
		added, removed, changed int
		replaced                []string
		entries                 []string // parent-name/name of the kernel's names to drop
		show                    []string
		unchangedKeepIDs        []string
	}{
		{
			name: "nothing changed", listing: base,
			show:             []string{"a/", "a/b.txt@b1:xx", "a/c.txt@c1:x", "d.txt@d1:xxx", "e/", "e/f/", "e/f/g.txt@g1:x"},
			unchangedKeepIDs: []string{"a/b.txt", "a/c.txt", "d.txt", "e/f/g.txt"},
		},
		{
			name: "an object overwritten with another size and version",
			listing: with(func(l fakeLister) fakeLister {
				l[2] = fakeLister{{Path: "d.txt", Size: 5, ModTime: t1, ETag: "d2"}}[0]
				return l
			}),
			changed: 1, replaced: []string{"d.txt@d1"}, entries: []string{"/d.txt"},
			show:             []string{"a/", "a/b.txt@b1:xx", "a/c.txt@c1:x", "d.txt@d2:xxxxx", "e/", "e/f/", "e/f/g.txt@g1:x"},
			unchangedKeepIDs: []string{"a/b.txt", "a/c.txt", "e/f/g.txt"},
		},
		{
			name: "an object added in a new folder, one removed with its folder",
			listing: with(func(l fakeLister) fakeLister {
				l = slices.Delete(l, 3, 4)
				return append(l, fakeLister{{Path: "h/i.txt", Size: 4, ModTime: t1, ETag: "i1"}}...)
			}),
			added: 1, removed: 1, replaced: []string{"e/f/g.txt@g1"}, entries: []string{"/e", "/h"},
			show:             []string{"a/", "a/b.txt@b1:xx", "a/c.txt@c1:x", "d.txt@d1:xxx", "h/", "h/i.txt@i1:xxxx"},
			unchangedKeepIDs: []string{"a/b.txt", "a/c.txt", "d.txt"},
		},
		{
			name: "a file becomes a folder and a folder a file",
			listing: fakeLister{
				{Path: "a", Size: 1, ModTime: t1, ETag: "a1"},
				{Path: "d.txt/x", Size: 1, ModTime: t1, ETag: "x1"},
				{Path: "d.txt/y", Size: 2, ModTime: t1, ETag: "y1"},
				{Path: "e/f/g.txt", Size: 1, ModTime: t0, ETag: "g1"},
			},
			added: 3, removed: 3, replaced: []string{"a/b.txt@b1", "a/c.txt@c1", "d.txt@d1"}, entries: []string{"/a", "/d.txt"},
			show:             []string{"a@a1:x", "d.txt/", "d.txt/x@x1:x", "d.txt/y@y1:xx", "e/", "e/f/", "e/f/g.txt@g1:x"},
			unchangedKeepIDs: []string{"e/f/g.txt"},
		},
		{
			name:    "everything removed",
			listing: fakeLister{},
			removed: 4, replaced: []string{"a/b.txt@b1", "a/c.txt@c1", "d.txt@d1", "e/f/g.txt@g1"},
			entries: []string{"/a", "/d.txt", "/e"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			old := treeOf(t, base)
			before := snapshotNodes(old)
			tr, err := buildTree(context.Background(), tc.listing, logr.Discard())
			g.Expect(err).NotTo(HaveOccurred())
			u := diffTree(old, tr)

			g.Expect(snapshotNodes(old)).To(Equal(before), "the list the mount serves meanwhile is not touched")
			g.Expect(u.changes.Added).To(Equal(tc.added), "added")
			g.Expect(u.changes.Removed).To(Equal(tc.removed), "removed")
			g.Expect(u.changes.Changed).To(Equal(tc.changed), "changed")
			var replaced []string
			for _, r := range u.changes.Replaced {
				replaced = append(replaced, r.Path+"@"+r.ETag)
			}
			g.Expect(replaced).To(ConsistOf(stringsOrEmpty(tc.replaced)...))
			var entries []string
			for _, e := range u.entries {
				entries = append(entries, folderPath(u.nodes, e.parent)+"/"+e.name)
			}
			g.Expect(entries).To(ConsistOf(stringsOrEmpty(tc.entries)...), "names the kernel is told to drop")
			g.Expect(shown(u.nodes)).To(Equal(tc.show), "the new tree")
			g.Expect(u.changes.Files).To(Equal(tr.Files))
			if tc.added+tc.removed+tc.changed == 0 {
				g.Expect(u.folders).To(BeEmpty(), "nothing to tell the kernel")
			} else {
				g.Expect(u.folders).To(ContainElement(uint64(1)), "the root's listing and time changed")
			}

			for _, p := range tc.unchangedKeepIDs {
				g.Expect(idOf(u.nodes, p)).To(Equal(idOf(old, p)), "%s keeps its node id", p)
			}
			for id := range old {
				if id > 0 && !old[id].dir && !slices.Contains(tc.unchangedKeepIDs, old[id].path) {
					g.Expect(u.nodes[id].retired).To(BeTrue(), "%s's old node is retired, not reused", old[id].path)
					g.Expect(u.nodes[id].etag).To(Equal(old[id].etag), "and keeps its version for the files open on it")
				}
			}

			restored, err := restoreNodes(snapshotNodes(u.nodes))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(shown(restored)).To(Equal(tc.show), "a process taking over after the refresh shows the new tree")
		})
	}
}

func stringsOrEmpty(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// idOf finds the node id of a file path in the tree, 0 if it is not there.
func idOf(nodes []*node, path string) uint64 {
	for id, n := range nodes {
		if id > 0 && !n.retired && !n.dir && n.path == path {
			return uint64(id)
		}
	}
	return 0
}

func TestARefreshedMountShowsTheStoresChangesAndOpenFilesKeepTheirVersion(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	s := mount(t, f.config(nil))
	ctx := context.Background()
	dir := s.Dir()

	// Read everything once, so that the kernel caches names, attributes, missing names and
	// pages for 24 hours, and the cache holds the first version's blocks.
	walk(t, dir)
	_, err := os.Stat(filepath.Join(dir, "new/later.txt"))
	g.Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue(), "the kernel now remembers that new/ is missing")
	heldOpen, err := os.Open(filepath.Join(dir, "big.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = heldOpen.Close() }()

	newBig := randomBytes(2*testBlockSize+77, 99)
	newOneBlock := randomBytes(100, 98)
	f.srv.Put(t, bucket, prefix+"big.bin", newBig)
	f.srv.Put(t, bucket, prefix+"one-block.bin", newOneBlock)
	f.srv.Put(t, bucket, prefix+"new/later.txt", []byte("added"))
	g.Expect(f.srv.Client.RemoveObject(ctx, bucket, prefix+"nested/a/b/c/deep.txt", minio.RemoveObjectOptions{})).To(Succeed())

	changes, err := s.Refresh(ctx, f.objects)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changes.Added).To(Equal(1))
	g.Expect(changes.Removed).To(Equal(1))
	g.Expect(changes.Changed).To(Equal(2))
	g.Expect(changes.Files).To(Equal(len(f.data.files)))
	g.Expect(s.Files()).To(Equal(len(f.data.files)))
	for _, r := range changes.Replaced {
		g.Expect(r.Open).To(Equal(r.Path == "big.bin"), "%s was open when the tree changed", r.Path)
	}

	want := map[string][]byte{}
	for p, b := range f.data.files {
		want[p] = b
	}
	want["big.bin"], want["one-block.bin"], want["new/later.txt"] = newBig, newOneBlock, []byte("added")
	delete(want, "nested/a/b/c/deep.txt")
	files, folders := walk(t, dir)
	g.Expect(slices.Sorted(mapsKeys(files))).To(Equal(slices.Sorted(mapsKeys(want))), "new files appear, removed ones vanish, despite what the kernel cached")
	for p, b := range want {
		g.Expect(sum(files[p])).To(Equal(sum(b)), "the bytes of %s are the store's now", p)
	}
	g.Expect(folders).To(ContainElement("new"))
	g.Expect(folders).NotTo(ContainElement("nested/a/b"), "folders that held only the removed object go with it")
	g.Expect(folders).To(ContainElement("nested/a"))
	st, err := os.Stat(filepath.Join(dir, "big.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Size()).To(Equal(int64(len(newBig))), "the new size shows")

	// The file opened before the refresh is the old version, whole: its blocks are cached.
	old, err := readAllAt(heldOpen)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sum(old)).To(Equal(sum(f.data.files["big.bin"])), "an open file reads the version it opened, never a mix")

	t.Run("a process taking over serves the refreshed tree", func(t *testing.T) {
		g := NewWithT(t)
		h, err := s.Handover()
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = h.Close() }()
		st, err := decodeState(h.State)
		g.Expect(err).NotTo(HaveOccurred())
		nodes, err := restoreNodes(st.Nodes)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(idOf(nodes, "new/later.txt")).NotTo(BeZero())
		g.Expect(idOf(nodes, "nested/a/b/c/deep.txt")).To(BeZero())
	})

	t.Run("a refresh that finds nothing new tells the kernel nothing", func(t *testing.T) {
		g := NewWithT(t)
		changes, err := s.Refresh(ctx, f.objects)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changes.None()).To(BeTrue())
	})

	t.Run("a failed listing keeps the tree", func(t *testing.T) {
		g := NewWithT(t)
		_, err := s.Refresh(ctx, failingLister{err: syscall.ECONNREFUSED})
		g.Expect(err).To(MatchError(ContainSubstring("listing the objects")))
		got, err := os.ReadFile(filepath.Join(dir, "new/later.txt"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(got)).To(Equal("added"))
	})
}

// readAllAt reads a whole open file from its start with pread, as a reader holding it would.
func readAllAt(f *os.File) ([]byte, error) {
	return io.ReadAll(io.NewSectionReader(f, 0, 1<<40))
}
