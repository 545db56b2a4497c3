package objtree

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/understore"
)

func TestTheTreeFollowsTheKeys(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC)
	tr := New()
	for _, o := range []understore.ObjectInfo{
		{Path: "a", Size: 1, ModTime: t0},                       // hidden by the folder a/
		{Path: "a/b.txt", Size: 2, ModTime: t0.Add(time.Hour)},  // makes a/ a folder
		{Path: "a/c/", ModTime: t0.Add(2 * time.Hour)},          // a marker: an empty folder
		{Path: "x//y", Size: 3},                                 // empty element
		{Path: "../up", Size: 3},                                // leaves the root
		{Path: "./here", Size: 3},                               // a '.' element
		{Path: strings.Repeat("n", 256), Size: 3},               // too long
		{Path: "unknown-size", Size: -1},                        // no size
		{Path: "top.txt", Size: 5, ModTime: t0.Add(-time.Hour)}, // fine
		{Path: "/", ModTime: t0},                                // the root's own marker
		{Path: "d/e/f.txt", Size: 7, ModTime: t0.Add(3 * time.Hour)},
		{Path: "d/e", Size: 9, ModTime: t0}, // after the folder: left out
	} {
		tr.Add(o)
	}
	tr.Done()
	g.Expect(tr.Root.SortedNames()).To(Equal([]string{"a", "d", "top.txt"}))
	a := tr.Root.Children["a"]
	g.Expect(a.IsDir()).To(BeTrue())
	g.Expect(a.SortedNames()).To(Equal([]string{"b.txt", "c"}))
	g.Expect(a.Children["c"].IsDir()).To(BeTrue())
	g.Expect(a.MTime).To(Equal(t0.Add(2*time.Hour)), "a folder's time is the newest of what it holds")
	g.Expect(tr.Root.MTime).To(Equal(t0.Add(3 * time.Hour)))
	g.Expect(tr.Root.Children["d"].Children["e"].IsDir()).To(BeTrue())
	g.Expect(tr.Files).To(Equal(3))
	g.Expect(tr.Bytes).To(Equal(int64(2 + 5 + 7)))

	var keys []string
	for _, o := range tr.LeftOut {
		keys = append(keys, o.Key)
	}
	g.Expect(keys).To(ConsistOf("a", "x//y", "../up", "./here", strings.Repeat("n", 256), "unknown-size", "d/e"),
		"every object the tree does not show is named")
	g.Expect(tr.LeftOut).To(ContainElements(
		LeftOut{Key: "a", Reason: ReasonHiddenByFolder},
		LeftOut{Key: "d/e", Reason: ReasonHiddenByFolder},
		LeftOut{Key: "unknown-size", Reason: ReasonUnknownSize},
		LeftOut{Key: "x//y", Reason: "its key is not a valid path: an empty element (two slashes in a row, or a leading slash)"},
	))
}

func TestALaterVersionOfAKeyReplacesTheFile(t *testing.T) {
	g := NewWithT(t)
	tr := New()
	tr.Add(understore.ObjectInfo{Path: "f", Size: 3, ETag: "v1"})
	tr.Add(understore.ObjectInfo{Path: "f", Size: 5, ETag: "v2"})
	g.Expect(tr.Files).To(Equal(1))
	g.Expect(tr.Bytes).To(Equal(int64(5)))
	g.Expect(tr.Root.Children["f"].ETag).To(Equal("v2"))
	g.Expect(tr.LeftOut).To(BeEmpty())
}
