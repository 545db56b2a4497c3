package fusefs

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/fuseconn"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/internal/testenv"
)

// walk returns every file of the mount with its bytes, and every folder, by path relative to dir.
func walk(t *testing.T, dir string) (files map[string][]byte, folders []string) {
	t.Helper()
	files = map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			folders = append(folders, filepath.ToSlash(rel))
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, folders
}

func TestAMountedDatasetShowsEveryObjectWithItsBytes(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	s := mount(t, f.config(nil))

	files, folders := walk(t, s.Dir())
	g.Expect(slices.Sorted(mapsKeys(files))).To(Equal(slices.Sorted(mapsKeys(f.data.files))), "the listing matches the bucket")
	for p, want := range f.data.files {
		g.Expect(files[p]).To(HaveLen(len(want)), "size of %s", p)
		g.Expect(sum(files[p])).To(Equal(sum(want)), "sha256 of %s", p)
	}
	g.Expect(folders).To(ConsistOf(".", "données", "empty folder", "nested", "nested/a", "nested/a/b", "nested/a/b/c", "small"))
	g.Expect(s.Files()).To(Equal(len(f.data.files)))

	t.Run("sizes, modes, owners and times come from the listing", func(t *testing.T) {
		g := NewWithT(t)
		listed := map[string]time.Time{}
		for info, err := range f.objects.List(context.Background(), "") {
			g.Expect(err).NotTo(HaveOccurred())
			listed[info.Path] = info.ModTime
		}
		for p, want := range f.data.files {
			st, err := os.Stat(filepath.Join(s.Dir(), p))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st.Size()).To(BeEquivalentTo(len(want)))
			g.Expect(st.Mode()).To(Equal(fs.FileMode(0o444)), p)
			sys := st.Sys().(*syscall.Stat_t)
			g.Expect(sys.Uid).To(BeZero())
			g.Expect(sys.Gid).To(BeZero())
			g.Expect(st.ModTime().Equal(listed[p])).To(BeTrue(), "mtime of %s: %s, the listing says %s", p, st.ModTime(), listed[p])
		}
		st, err := os.Stat(filepath.Join(s.Dir(), "nested", "a"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.Mode()).To(Equal(fs.ModeDir | 0o555))
		g.Expect(st.ModTime()).NotTo(BeZero())
	})

	t.Run("reads at any offset and length return the right bytes, short at the end", func(t *testing.T) {
		g := NewWithT(t)
		want := f.data.files["big.bin"]
		file, err := os.Open(filepath.Join(s.Dir(), "big.bin"))
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = file.Close() }()
		for _, c := range []struct{ off, n int }{
			{0, 10},
			{testBlockSize - 5, 10},                // across a block boundary
			{testBlockSize / 2, 3 * testBlockSize}, // across several
			{len(want) - 100, 1000},                // past the end: short
			{len(want), 10},                        // at the end: nothing
			{5*testBlockSize + 1000, 234},          // within the last, short block
			{2 * testBlockSize, testBlockSize},     // one whole block
			{testBlockSize - 1, 2},                 // one byte either side
		} {
			buf := make([]byte, c.n)
			n, err := file.ReadAt(buf, int64(c.off))
			end := min(c.off+c.n, len(want))
			if c.off+c.n > len(want) {
				g.Expect(err).To(MatchError(io.EOF), "read [%d, +%d)", c.off, c.n)
			} else {
				g.Expect(err).NotTo(HaveOccurred(), "read [%d, +%d)", c.off, c.n)
			}
			g.Expect(buf[:n]).To(Equal(want[c.off:end]), "read [%d, +%d)", c.off, c.n)
		}
	})

	t.Run("nothing can be written, created, renamed or removed", func(t *testing.T) {
		g := NewWithT(t)
		p := filepath.Join(s.Dir(), "big.bin")
		_, err := os.OpenFile(p, os.O_WRONLY, 0)
		g.Expect(err).To(MatchError(syscall.EROFS))
		_, err = os.OpenFile(p, os.O_RDWR, 0)
		g.Expect(err).To(MatchError(syscall.EROFS))
		g.Expect(os.WriteFile(filepath.Join(s.Dir(), "new.txt"), []byte("x"), 0o644)).To(MatchError(syscall.EROFS))
		g.Expect(os.Mkdir(filepath.Join(s.Dir(), "new"), 0o755)).To(MatchError(syscall.EROFS))
		g.Expect(os.Rename(p, filepath.Join(s.Dir(), "moved.bin"))).To(MatchError(syscall.EROFS))
		g.Expect(os.Remove(p)).To(MatchError(syscall.EROFS))
		g.Expect(os.RemoveAll(filepath.Join(s.Dir(), "nested"))).To(MatchError(syscall.EROFS))
		g.Expect(os.Chmod(p, 0o666)).To(MatchError(syscall.EROFS))
		g.Expect(os.Truncate(p, 0)).To(MatchError(syscall.EROFS))
		g.Expect(os.Symlink("big.bin", filepath.Join(s.Dir(), "link"))).To(MatchError(syscall.EROFS))
		got, err := os.ReadFile(p)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sum(got)).To(Equal(sum(f.data.files["big.bin"])), "the file is unchanged")
	})

	t.Run("statfs reports the Dataset's size and file count", func(t *testing.T) {
		g := NewWithT(t)
		var st syscall.Statfs_t
		g.Expect(syscall.Statfs(s.Dir(), &st)).To(Succeed())
		g.Expect(st.Files).To(BeEquivalentTo(len(f.data.files)))
		g.Expect(int64(st.Blocks) * st.Bsize).To(BeNumerically(">=", s.Bytes()))
		g.Expect(st.Flags&1).To(BeEquivalentTo(1), "ST_RDONLY")
	})
}

func mapsKeys[V any](m map[string]V) iter.Seq[string] {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestASecondReadIsServedWithoutTheUnderStore(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	want := f.data.files["big.bin"]
	blocks := int64(len(want)+testBlockSize-1) / testBlockSize
	// Without local block files: every read goes through cache.ReadBlock.
	s := mount(t, f.config(nil))

	got, err := os.ReadFile(filepath.Join(s.Dir(), "big.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sum(got)).To(Equal(sum(want)))
	fetches := counter(t, f.reg, "strata_worker_under_store_fetches_total")
	g.Expect(fetches).To(BeEquivalentTo(blocks), "every block fetched once")
	g.Eventually(func() float64 { return counter(t, f.reg, "strata_worker_cache_prefetches_total") }).Should(BeNumerically(">", 0),
		"a sequential reader's next blocks are read ahead of it (and not again when it gets there)")
	reads := counter(t, f.reg, "strata_worker_fuse_reads_total")
	g.Expect(reads).To(BeNumerically(">", 0))
	g.Expect(counter(t, f.reg, "strata_worker_fuse_read_bytes_total")).To(BeEquivalentTo(len(want)))

	t.Run("through the same mount, the kernel's page cache answers", func(t *testing.T) {
		g := NewWithT(t)
		got, err := os.ReadFile(filepath.Join(s.Dir(), "big.bin"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sum(got)).To(Equal(sum(want)))
		g.Expect(counter(t, f.reg, "strata_worker_fuse_reads_total")).To(Equal(reads), "no read reached the worker (FOPEN_KEEP_CACHE)")
	})

	t.Run("through a new mount, the local tier answers", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func() bool {
			for i := range blocks {
				if !f.stored("big.bin", i) {
					return false
				}
			}
			return true
		}).WithTimeout(10*time.Second).Should(BeTrue(), "the cache has stored every block it fetched")
		hits := counter(t, f.reg, "strata_worker_cache_hits_total")
		again := mount(t, f.config(nil))
		got, err := os.ReadFile(filepath.Join(again.Dir(), "big.bin"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sum(got)).To(Equal(sum(want)))
		g.Expect(counter(t, f.reg, "strata_worker_under_store_fetches_total")).To(Equal(fetches), "no new fetch from MinIO")
		g.Expect(counter(t, f.reg, "strata_worker_cache_hits_total")-hits).To(BeEquivalentTo(blocks),
			"one cache hit per block: the open file keeps the block it read last")
	})

	t.Run("with local block files, reads open the tier's files and fetch nothing", func(t *testing.T) {
		g := NewWithT(t)
		hits := counter(t, f.reg, "strata_worker_cache_hits_total")
		spliced := counter(t, f.reg, "strata_worker_fuse_spliced_reads_total")
		local := mount(t, f.config(func(c *Config) { c.Local = localBlocks{f.store} }))
		got, err := os.ReadFile(filepath.Join(local.Dir(), "big.bin"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sum(got)).To(Equal(sum(want)))
		g.Expect(counter(t, f.reg, "strata_worker_under_store_fetches_total")).To(Equal(fetches))
		g.Expect(counter(t, f.reg, "strata_worker_cache_hits_total")).To(Equal(hits), "read from the block files, not copied out of the cache")
		g.Expect(counter(t, f.reg, "strata_worker_fuse_spliced_reads_total")-spliced).To(BeNumerically(">", 0),
			"reads of local blocks are spliced from their files into the FUSE device")
	})
}

func TestConcurrentReadersOfOneLargeFileGetTheRightBytes(t *testing.T) {
	fusetest.Require(t)
	data := testDataset()
	data.files["large.bin"] = randomBytes(40*testBlockSize+777, 42)
	f := newFixture(t, data)
	want := data.files["large.bin"]
	for name, change := range map[string]func(*Config){
		"through the cache":         nil,
		"with the tier's own files": func(c *Config) { c.Local = localBlocks{f.store} },
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			s := mount(t, f.config(change))
			const readers = 8
			var wg sync.WaitGroup
			errs := make(chan error, readers)
			for r := range readers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					file, err := os.Open(filepath.Join(s.Dir(), "large.bin"))
					if err != nil {
						errs <- err
						return
					}
					defer func() { _ = file.Close() }()
					rng := rand.New(rand.NewPCG(uint64(r), 1))
					for range 40 {
						off := rng.IntN(len(want))
						n := 1 + rng.IntN(3*testBlockSize)
						buf := make([]byte, n)
						got, err := file.ReadAt(buf, int64(off))
						if err != nil && !errors.Is(err, io.EOF) {
							errs <- err
							return
						}
						if string(buf[:got]) != string(want[off:min(off+n, len(want))]) {
							errs <- errors.New("wrong bytes")
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				g.Expect(err).NotTo(HaveOccurred())
			}
		})
	}
}

// failingBlocks fails every read.
type failingBlocks struct{ err error }

func (b failingBlocks) ReadBlock(context.Context, string, string, int64, int64) ([]byte, error) {
	return nil, b.err
}

// shortBlocks holds every block as a local file of a few bytes: a tier's file that is not
// the block it should be.
type shortBlocks struct{ dir string }

func (b shortBlocks) OpenBlock(_ context.Context, file, _ string, index int64) (*os.File, error) {
	p := filepath.Join(b.dir, fmt.Sprintf("%x-%d", sha256.Sum256([]byte(file)), index))
	if err := os.WriteFile(p, []byte("short"), 0o600); err != nil {
		return nil, err
	}
	return os.Open(p)
}

// TestALocalBlockFileCutShortIsEIO: a read is spliced from a block's file only once the file
// has every byte the answer needs; a file that ends early leaves the read to Read, which fails
// it with EIO rather than answer short bytes. (Its own fixture: the reads have the cache read
// ahead, which would cache blocks that other tests need uncached.)
func TestALocalBlockFileCutShortIsEIO(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	s := mount(t, f.config(func(c *Config) { c.Local = shortBlocks{t.TempDir()} }))
	_, err := os.ReadFile(filepath.Join(s.Dir(), "big.bin"))
	g.Expect(err).To(MatchError(syscall.EIO))
	g.Expect(counter(t, f.reg, "strata_worker_fuse_spliced_reads_total")).To(BeZero(), "nothing spliced from a short file")
	g.Expect(counter(t, f.reg, "strata_worker_fuse_read_errors_total")).To(BeNumerically(">", 0))
}

func TestReadFailuresBecomeErrnos(t *testing.T) {
	fusetest.Require(t)
	f := newFixture(t, testDataset())

	t.Run("a cache failure is EIO, logged once per block", func(t *testing.T) {
		g := NewWithT(t)
		s := mount(t, f.config(func(c *Config) { c.Blocks = failingBlocks{errors.New("disk on fire")} }))
		for range 3 {
			_, err := os.ReadFile(filepath.Join(s.Dir(), "big.bin"))
			g.Expect(err).To(MatchError(syscall.EIO))
		}
		g.Expect(f.logs.count("disk on fire", `"file"="big.bin"`, `"block"=0`)).To(Equal(1), "logged once, however often the block is read")
		g.Expect(counter(t, f.reg, "strata_worker_fuse_read_errors_total")).To(BeNumerically(">=", 3))
	})

	t.Run("an object removed from the under-store after the mount is ENOENT", func(t *testing.T) {
		g := NewWithT(t)
		s := mount(t, f.config(nil))
		g.Expect(f.srv.Client.RemoveObject(context.Background(), bucket, prefix+"nested/a/b/c/deep.txt", minio.RemoveObjectOptions{})).To(Succeed())
		_, err := os.ReadFile(filepath.Join(s.Dir(), "nested/a/b/c/deep.txt"))
		g.Expect(err).To(MatchError(syscall.ENOENT))
		g.Expect(f.logs.count("deep.txt", "not found")).To(Equal(1))
	})

	t.Run("an object replaced after the mount is read as the version listed, or EIO: never a mix", func(t *testing.T) {
		g := NewWithT(t)
		s := mount(t, f.config(nil))
		old := f.data.files["big.bin"]
		file, err := os.Open(filepath.Join(s.Dir(), "big.bin"))
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = file.Close() }()
		first := make([]byte, testBlockSize)
		_, err = file.ReadAt(first, 0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(first).To(Equal(old[:testBlockSize]))

		// Same size, other bytes: only the version tells the two apart.
		replaced := randomBytes(len(old), 99)
		f.srv.Put(t, bucket, prefix+"big.bin", replaced)
		later := make([]byte, testBlockSize)
		_, err = file.ReadAt(later, 3*testBlockSize)
		g.Expect(err).To(MatchError(syscall.EIO), "a block of the listed version that is not cached cannot be had")
		g.Expect(f.logs.count("changed in the under-store since the Dataset was listed", `"file"="big.bin"`)).To(Equal(1))
		_, err = file.ReadAt(first, 0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(first).To(Equal(old[:testBlockSize]), "what is cached of the listed version is still that version")

		again := mount(t, f.config(nil))
		got, err := os.ReadFile(filepath.Join(again.Dir(), "big.bin"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sum(got)).To(Equal(sum(replaced)), "a mount that lists again reads the new version whole, none of the old one's cached blocks")
		f.srv.Put(t, bucket, prefix+"big.bin", old)
	})

	t.Run("an object that shrank after the mount is EIO, not short data", func(t *testing.T) {
		g := NewWithT(t)
		s := mount(t, f.config(nil))
		f.srv.Put(t, bucket, prefix+"nested/a/side by side.md", []byte("short now"))
		_, err := os.ReadFile(filepath.Join(s.Dir(), "nested/a/side by side.md"))
		g.Expect(err).To(MatchError(syscall.EIO))
	})
}

func TestPassthroughServesLocalOneBlockFiles(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	s := mount(t, f.config(func(c *Config) { c.Local = localBlocks{f.store} }))
	if !s.Passthrough() {
		testenv.Lacking(t, "this kernel does not offer FUSE passthrough (Linux 6.9 or later with CONFIG_FUSE_PASSTHROUGH)")
	}
	const name = "one-block.bin"
	want := f.data.files[name]
	p := filepath.Join(s.Dir(), name)
	opens := func() float64 { return counter(t, f.reg, "strata_worker_fuse_passthrough_opens_total") }
	reads := func() float64 { return counter(t, f.reg, "strata_worker_fuse_reads_total") }
	readAll := func(file *os.File) []byte {
		b := make([]byte, len(want)+10)
		n, err := file.ReadAt(b, 0)
		g.Expect(err).To(MatchError(io.EOF))
		return b[:n]
	}

	// The block is not local yet: the first open is cached, and its read fetches the block.
	first, err := os.Open(p)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = first.Close() }()
	g.Expect(readAll(first)).To(Equal(want))
	g.Expect(opens()).To(BeZero())
	g.Eventually(func() bool { return f.stored(name, 0) }).WithTimeout(10*time.Second).Should(BeTrue(), "the block is stored")

	// While a cached open is outstanding, a new open must be cached too: the kernel would
	// fail a passthrough open of an inode open in cached mode with EIO.
	second, err := os.Open(p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(readAll(second)).To(Equal(want))
	g.Expect(opens()).To(BeZero())
	g.Expect(second.Close()).To(Succeed())
	g.Expect(first.Close()).To(Succeed())

	// With no cached open left, opens are passed through, several at once with one backing file.
	g.Eventually(func() error {
		third, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = third.Close() }()
		if opens() == 0 {
			return errors.New("not passed through yet: the kernel may not have released the earlier opens")
		}
		return nil
	}).WithTimeout(10 * time.Second).Should(Succeed())
	before, readsBefore := opens(), reads()
	var files []*os.File
	for range 3 {
		file, err := os.Open(p)
		g.Expect(err).NotTo(HaveOccurred())
		files = append(files, file)
	}
	for _, file := range files {
		g.Expect(readAll(file)).To(Equal(want))
	}
	for _, file := range files {
		g.Expect(file.Close()).To(Succeed())
	}
	g.Expect(opens() - before).To(Equal(3.0))
	g.Expect(reads()).To(Equal(readsBefore), "passthrough reads never reach the worker")

	t.Run("a file of more than one block is never passed through", func(t *testing.T) {
		g := NewWithT(t)
		before := opens()
		for range 2 {
			got, err := os.ReadFile(filepath.Join(s.Dir(), "big.bin"))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(sum(got)).To(Equal(sum(f.data.files["big.bin"])))
		}
		g.Expect(opens()).To(Equal(before))
	})

	t.Run("disabled, nothing is passed through", func(t *testing.T) {
		g := NewWithT(t)
		off := mount(t, f.config(func(c *Config) { c.Local = localBlocks{f.store}; c.DisablePassthrough = true }))
		g.Expect(off.Passthrough()).To(BeFalse())
		before := opens()
		got, err := os.ReadFile(filepath.Join(off.Dir(), name))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal(want))
		g.Expect(opens()).To(Equal(before))
	})
}

func TestUnmountWaitsForBindMountsToGo(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	s := mount(t, f.config(nil))
	bind := filepath.Join(t.TempDir(), "pod-volume")
	g.Expect(os.Mkdir(bind, 0o755)).To(Succeed())
	g.Expect(syscall.Mount(s.Dir(), bind, "", syscall.MS_BIND, "")).To(Succeed())
	t.Cleanup(func() { _ = syscall.Unmount(bind, syscall.MNT_DETACH) })

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	g.Expect(s.Unmount(ctx)).To(MatchError(fuseconn.ErrStillMounted))
	got, err := os.ReadFile(filepath.Join(bind, "données", "été 2024.csv"))
	g.Expect(err).NotTo(HaveOccurred(), "the pod's mount keeps working")
	g.Expect(got).To(Equal(f.data.files["données/été 2024.csv"]))

	g.Expect(syscall.Unmount(bind, 0)).To(Succeed())
	g.Eventually(s.Done()).WithTimeout(10*time.Second).Should(BeClosed(), "the file system ends with its last mount")
	g.Expect(s.Unmount(context.Background())).To(Succeed(), "unmounting again is harmless")
}

func TestUnmountOfABusyMountSaysSo(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	s := mount(t, f.config(nil))
	file, err := os.Open(filepath.Join(s.Dir(), "big.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	err = s.Unmount(context.Background())
	g.Expect(err).To(MatchError(fuseconn.ErrBusy))
	g.Expect(err.Error()).To(ContainSubstring(s.Dir()))
	g.Expect(file.Close()).To(Succeed())
	g.Eventually(func() error { return s.Unmount(context.Background()) }).WithTimeout(10 * time.Second).Should(Succeed())
}

// fakeLister lists fixed objects.
type fakeLister []understore.ObjectInfo

func (l fakeLister) List(context.Context, string) iter.Seq2[understore.ObjectInfo, error] {
	return func(yield func(understore.ObjectInfo, error) bool) {
		for _, o := range l {
			if !yield(o, nil) {
				return
			}
		}
	}
}

func TestTheTreeLogsWhatItLeavesOut(t *testing.T) {
	g := NewWithT(t)
	logs := &logLines{}
	tr, err := buildTree(context.Background(), fakeLister{
		{Path: "a", Size: 1},       // hidden by the folder a/
		{Path: "a/b.txt", Size: 2}, // makes a/ a folder
		{Path: "x//y", Size: 3},    // empty element
		{Path: "top.txt", Size: 5},
	}, funcr.New(logs.add, funcr.Options{}))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tr.Files).To(Equal(2))
	g.Expect(logs.count("leaving out an object the tree cannot show", `"key"="a"`, "folder of the same name")).To(Equal(1))
	g.Expect(logs.count("leaving out an object the tree cannot show", `"key"="x//y"`, "empty element")).To(Equal(1))
}

func TestAListingFailureFailsTheMount(t *testing.T) {
	g := NewWithT(t)
	denied := &understore.Error{Op: "list", Store: "s3://b/p/", Kind: understore.ErrAccessDenied}
	lister := failingLister{denied}
	_, err := Mount(context.Background(), t.TempDir(), Config{Objects: lister, Blocks: failingBlocks{}, BlockSize: 1})
	g.Expect(err).To(MatchError(understore.ErrAccessDenied))
	g.Expect(err.Error()).To(ContainSubstring("s3://b/p/"))
}

type failingLister struct{ err error }

func (l failingLister) List(context.Context, string) iter.Seq2[understore.ObjectInfo, error] {
	return func(yield func(understore.ObjectInfo, error) bool) { yield(understore.ObjectInfo{}, l.err) }
}

func TestAHandoverKeepsEachFilesVersion(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC)
	tr, err := buildTree(context.Background(), fakeLister{
		{Path: "a/b.txt", Size: 2, ModTime: t0, ETag: "v-b"},
		{Path: "c.txt", Size: 3, ModTime: t0, ETag: "v-c"},
		{Path: "empty/", ModTime: t0},
	}, logr.Discard())
	g.Expect(err).NotTo(HaveOccurred())
	nodes := flatten(tr, t0)
	restored, err := restoreNodes(snapshotNodes(nodes))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(restored).To(HaveLen(len(nodes)))
	for i := range nodes {
		g.Expect(restored[i]).To(Equal(nodes[i]), "node %d: the taking-over server reads every file from the version the mount listed", i)
	}
	var etags []string
	for _, n := range restored {
		if n.etag != "" {
			etags = append(etags, n.path+"@"+n.etag)
		}
	}
	g.Expect(etags).To(ConsistOf("a/b.txt@v-b", "c.txt@v-c"))
}

// The kernel reads ahead of a sequential reader a whole request (fuseconn.ReadAhead), not its
// default of 128 KiB for FUSE, so that uncached pages come in requests of a megabyte.
func TestAMountReadsAheadAWholeRequest(t *testing.T) {
	fusetest.Require(t)
	f := newFixture(t, testDataset())
	s := mount(t, f.config(nil))
	var st unix.Stat_t
	if err := unix.Stat(s.dir, &st); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint(fuseconn.ReadAhead >> 10); strings.TrimSpace(string(got)) != want {
		t.Fatalf("the mount reads ahead %s KiB, want %s", strings.TrimSpace(string(got)), want)
	}
}
