package policy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/lineage/kariz"
)

func TestPinnedPathsMatchGlobsSegmentBySegment(t *testing.T) {
	cases := []struct {
		pattern string
		match   []string
		miss    []string
	}{
		{"labels/**", []string{"labels/a.txt", "labels/2024/01/a.txt"}, []string{"labels", "images/labels/a.txt", "labelsx/a"}},
		{"**/index.json", []string{"index.json", "a/b/index.json"}, []string{"a/index.json.bak", "a/b"}},
		{"train/*.parquet", []string{"train/part-1.parquet"}, []string{"train/x/part-1.parquet", "train/part-1.csv"}},
		{"/été 2024/?.csv", []string{"été 2024/a.csv"}, []string{"été 2024/ab.csv"}},
		{"**", []string{"a", "a/b/c"}, nil},
		{"a/**/z", []string{"a/z", "a/b/c/z"}, []string{"a/b/c", "b/z"}},
	}
	for _, tc := range cases {
		t.Run(tc.pattern, func(t *testing.T) {
			g := NewWithT(t)
			p, err := Compile(tc.pattern)
			g.Expect(err).NotTo(HaveOccurred())
			for _, f := range tc.match {
				g.Expect(p.Match(f)).To(BeTrue(), "%q should match %q", tc.pattern, f)
			}
			for _, f := range tc.miss {
				g.Expect(p.Match(f)).To(BeFalse(), "%q should not match %q", tc.pattern, f)
			}
		})
	}
}

func TestBadPatternsSayWhatIsWrong(t *testing.T) {
	for pattern, says := range map[string]string{
		"":          "names no file",
		"/":         "names no file",
		"a/../b":    "empty, . or .. segment",
		"a//b":      "empty, . or .. segment",
		"images/[a": "is not a valid glob",
	} {
		_, err := Compile(pattern)
		NewWithT(t).Expect(err).To(MatchError(ContainSubstring(says)), "pattern %q", pattern)
	}
	_, err := Parse([]byte(`{"datasets":[{"name":"ns/d/u","cachePolicy":"ns/p","pinnedPaths":["[x"]}]}`))
	NewWithT(t).Expect(err).To(MatchError(And(ContainSubstring("ns/d/u"), ContainSubstring("ns/p"))))
	_, err = Parse([]byte(`{"datasets":[{"name":"ns/d/u","cachePolicy":"ns/p","replication":{"count":1}}]}`))
	NewWithT(t).Expect(err).To(MatchError(And(ContainSubstring("ns/d/u"), ContainSubstring("at least 2 copies"))))
}

// openStore is a real tier store with one memory tier in a temporary folder.
func openStore(t *testing.T) *tierstore.Store {
	t.Helper()
	dir := t.TempDir()
	s, err := tierstore.Open(context.Background(), tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(dir, "mem")}, Quota: 1 << 20}},
		IndexDir: filepath.Join(dir, "index"),
		Log:      logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// put stores a block of file in dataset, with the origin the cache gives it.
func put(t *testing.T, s *tierstore.Store, id, dataset, file string) {
	t.Helper()
	root := "/datasets/" + dataset
	origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: root + "/" + file, Dataset: dataset, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(context.Background(), id, bytes.NewReader([]byte("block")), 5, tierstore.PutOptions{Clean: true, Origin: origin}); err != nil {
		t.Fatal(err)
	}
}

func pinnedIDs(s *tierstore.Store) []string {
	var out []string
	for _, b := range s.Blocks() {
		if b.Pinned {
			out = append(out, b.ID)
		}
	}
	return out
}

func TestAChangedPolicyFileRepinsTheBlocksHeld(t *testing.T) {
	g := NewWithT(t)
	store := openStore(t)
	put(t, store, "a1", "ns/a/uid", "labels/x.txt")
	put(t, store, "a2", "ns/a/uid", "images/x.jpg")
	put(t, store, "b1", "ns/b/uid", "labels/x.txt") // another Dataset's file of the same path
	if _, err := store.Put(context.Background(), "raw", bytes.NewReader([]byte("x")), 1, tierstore.PutOptions{}); err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(t.TempDir(), FileName)
	write := func(body string) {
		// As the kubelet updates a ConfigMap's file: a new file renamed into place.
		tmp := file + ".tmp"
		g.Expect(os.WriteFile(tmp, []byte(body), 0o644)).To(Succeed())
		g.Expect(os.Rename(tmp, file)).To(Succeed())
	}
	write(`{"datasets":[{"name":"ns/a/uid","cachePolicy":"ns/p","pinnedPaths":["labels/**"]}]}`)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// refused receives a line each time the applier refuses a policies file: the signal that it
	// has read one.
	refused := make(chan struct{}, 16)
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "Ignoring what does not apply") {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
	}, funcr.Options{})
	a := &Applier{Store: store, Log: log}
	done := make(chan struct{})
	go func() { a.Run(ctx, file, 20*time.Millisecond, time.Hour); close(done) }()

	g.Eventually(func() []string { return pinnedIDs(store) }).Should(ConsistOf("a1"), "only Dataset a's labels are pinned")
	g.Expect(a.Pinned("ns/a/uid", "labels/new.txt", 0, 0)).To(BeTrue(), "new blocks of a pinned path are stored pinned")
	g.Expect(a.Pinned("ns/b/uid", "labels/new.txt", 0, 0)).To(BeFalse())
	g.Expect(store.Stats()[0].Pinned).To(Equal(1))

	write(`{"datasets":[{"name":"ns/a/uid","cachePolicy":"ns/p","pinnedPaths":["images/*.jpg"]},{"name":"ns/b/uid","pinnedPaths":["**"]}]}`)
	g.Eventually(func() []string { return pinnedIDs(store) }).Should(ConsistOf("a2", "b1"), "the change applies to the blocks held")

	write(`not json`)
	g.Eventually(refused).Should(Receive(), "the applier reads the file that does not parse, and refuses it")
	g.Expect(pinnedIDs(store)).To(ConsistOf("a2", "b1"), "a file that does not parse keeps the last policies")

	g.Expect(os.Remove(file)).To(Succeed())
	write(`{"datasets":[]}`)
	g.Eventually(func() []string { return pinnedIDs(store) }).Should(BeEmpty(), "no policy pins nothing")
	cancel()
	<-done
}

func TestAPrefetchPinsTheShareOfEachFileItLoaded(t *testing.T) {
	g := NewWithT(t)
	const ds = "ns/a/uid"
	set, err := Parse([]byte(`{"datasets":[{"name":"ns/a/uid","prefetch":{"paths":["train/**"],"percent":50}}]}`))
	g.Expect(err).NotTo(HaveOccurred())
	share := kariz.Share(8, 50)
	g.Expect(share).To(HaveLen(4))
	for i := range int64(8) {
		g.Expect(set.Pinned(ds, "train/x.bin", i, 8)).To(Equal(slices.Contains(share, int(i))), "block %d", i)
	}
	g.Expect(set.Pinned(ds, "train/x.bin", 0, 0)).To(BeFalse(), "a block of a file of unknown length cannot be placed in a share")
	g.Expect(set.Pinned(ds, "test/x.bin", int64(share[0]), 8)).To(BeFalse(), "a path the prefetch did not select")
	g.Expect(set.Pinned("ns/b/uid", "train/x.bin", int64(share[0]), 8)).To(BeFalse(), "another Dataset")

	all, err := Parse([]byte(`{"datasets":[{"name":"ns/a/uid","prefetch":{"percent":100}}]}`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(all.Pinned(ds, "any/file", 3, 0)).To(BeTrue(), "a whole prefetch pins every block")

	// Repin follows the blocks' origins: their index and their file's block count.
	store := openStore(t)
	for i := range int64(8) {
		origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: "/datasets/ns/a/uid/train/x.bin", Dataset: ds, Root: "/datasets/ns/a/uid",
			Index: i, FileBlocks: 8})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = store.Put(context.Background(), fmt.Sprint("b", i), bytes.NewReader([]byte("block")), 5, tierstore.PutOptions{Clean: true, Origin: origin})
		g.Expect(err).NotTo(HaveOccurred())
	}
	pinned, unpinned, err := Repin(context.Background(), store, set)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect([]int{pinned, unpinned}).To(Equal([]int{4, 0}))
	var want []string
	for _, i := range share {
		want = append(want, fmt.Sprint("b", i))
	}
	g.Expect(pinnedIDs(store)).To(ConsistOf(want))
	// The stage ended: the operator leaves the prefetch out, and the pins go.
	_, unpinned, err = Repin(context.Background(), store, &Set{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(unpinned).To(Equal(4))
	g.Expect(pinnedIDs(store)).To(BeEmpty())

	_, err = Parse([]byte(`{"datasets":[{"name":"ns/a/uid","prefetch":{"percent":0}}]}`))
	g.Expect(err).To(MatchError(ContainSubstring("1 to 100")))
}

func TestAWorkerThatReadNoPoliciesLeavesThePinsItFound(t *testing.T) {
	g := NewWithT(t)
	store := openStore(t)
	put(t, store, "a1", "ns/a/uid", "labels/x.txt")
	g.Expect(store.Pin(context.Background(), "a1", true)).To(Succeed()) // as an earlier worker left it
	a := &Applier{Store: store, Log: logr.Discard()}
	a.repin(context.Background(), "resweep")
	g.Expect(pinnedIDs(store)).To(ConsistOf("a1"))
}

// TestAPolicyFileBoundsADatasetsShareLive gives Dataset a half of a small tier by the policies
// file: once applied, a's writes past its share drop its own oldest blocks (clean, from the last
// tier), and b's are not touched.
func TestAPolicyFileBoundsADatasetsShareLive(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	store, err := tierstore.Open(context.Background(), tierstore.Config{
		Tiers:     []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(dir, "mem")}, Quota: 40}},
		IndexDir:  filepath.Join(dir, "index"),
		DatasetOf: DatasetOf,
		Log:       logr.Discard(),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = store.Close() })
	file := filepath.Join(t.TempDir(), FileName)
	g.Expect(os.WriteFile(file, []byte(`{"datasets":[
		{"name":"ns/a/uid","cachePolicy":"ns/half","eviction":"LFU","watermarks":{"high":0.5,"low":0.25},"promotionThreshold":1}]}`), 0o644)).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := &Applier{Store: store, Log: logr.Discard()}
	done := make(chan struct{})
	go func() { a.Run(ctx, file, 20*time.Millisecond, time.Hour); close(done) }()
	g.Eventually(func() int { return a.current.Load().Datasets() }).Should(Equal(1))

	put(t, store, "b1", "ns/b/uid", "x")
	for _, id := range []string{"a1", "a2", "a3", "a4", "a5"} {
		put(t, store, id, "ns/a/uid", id)
	}
	g.Expect(store.DatasetUsage("mem")).To(Equal(map[string]int64{"ns/a/uid": 10, "ns/b/uid": 5}),
		"a, at its share of 20 bytes, went down to 10 to write a5")
	cancel()
	<-done

	_, err = Parse([]byte(`{"datasets":[{"name":"ns/c/uid","cachePolicy":"ns/p","eviction":"MRU"}]}`))
	g.Expect(err).To(MatchError(And(ContainSubstring("ns/c/uid"), ContainSubstring("MRU"))))
}

// TestMRDCarriesTheNextUse: an MRD Dataset's rules carry how far its next read is, and one the
// operator gives no next use is read by no step again.
func TestMRDCarriesTheNextUse(t *testing.T) {
	g := NewWithT(t)
	set, err := Parse([]byte(`{"datasets":[
		{"name":"ns/soon/u","eviction":"MRD","nextUse":2},
		{"name":"ns/never/u","eviction":"MRD"},
		{"name":"ns/lru/u","eviction":"LRU","nextUse":5}]}`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(set.Rules()).To(Equal(map[string]tierstore.DatasetRules{
		"ns/soon/u":  {Eviction: eviction.Config{Kind: eviction.MRD}, NextUse: 2},
		"ns/never/u": {Eviction: eviction.Config{Kind: eviction.MRD}, NextUse: tierstore.NoNextUse},
		"ns/lru/u":   {Eviction: eviction.Config{Kind: eviction.LRU}},
	}), "a next use means nothing to LRU")
}
