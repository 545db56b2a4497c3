package fusefs

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/internal/fusetest"
)

const testLoaderUID = 65400

// openAsLoader opens file name of the mount at dir as the loader does: from a thread whose
// file-system user is the loader's (the kernel gives it in the FUSE open).
func openAsLoader(dir, name string) (*os.File, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = unix.Close(root) }()
	fd, err := func() (int, error) {
		// Setfsuid changes this thread only: it must stay on it until set back.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := unix.Setfsuid(testLoaderUID); err != nil {
			return -1, err
		}
		defer func() { _ = unix.Setfsuid(0) }()
		return unix.Openat(root, name, unix.O_RDONLY, 0)
	}()
	if err != nil {
		return nil, fmt.Errorf("opening %s as the loader: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// loaderRead reads file name of the mount at dir as the loader would: opened as the loader,
// read whole, its pages dropped (as cacheworker/warmup does), so that the next read reaches the
// worker.
func loaderRead(dir, name string) ([]byte, error) {
	f, err := openAsLoader(dir, name)
	if err != nil {
		return nil, err
	}
	return readPastPageCache(f)
}

// podRead reads file name of the mount at dir past the page cache, as a new pod would.
func podRead(dir, name string) ([]byte, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	return readPastPageCache(f)
}

// readPastPageCache reads f whole with its pages dropped before and after, and closes it.
func readPastPageCache(f *os.File) ([]byte, error) {
	defer func() { _ = f.Close() }()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	return b, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

func TestLoadsAreCountedApartFromPodsAndTheirHitsOnce(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	loads, err := NewLoads(f.reg, testLoaderUID)
	g.Expect(err).NotTo(HaveOccurred())
	s := mount(t, f.config(func(c *Config) { c.Local = localBlocks{f.store}; c.Loads = loads }))
	fetched := func() float64 { return counter(t, f.reg, "strata_worker_load_fetched_bytes_total") }
	held := func() float64 { return counter(t, f.reg, "strata_worker_load_held_bytes_total") }
	hits := func() float64 { return counter(t, f.reg, "strata_worker_load_hit_bytes_total") }
	read := func(as func(dir, name string) ([]byte, error), name string) [32]byte {
		b, err := as(s.Dir(), name)
		g.Expect(err).NotTo(HaveOccurred())
		return sum(b)
	}

	const name = "big.bin"
	want := f.data.files[name]
	size := float64(len(want))
	g.Expect(read(loaderRead, name)).To(Equal(sum(want)))
	g.Expect(fetched()).To(Equal(size), "the load brought every byte in")
	g.Expect(held()).To(BeZero())
	g.Expect(hits()).To(BeZero(), "no pod read it yet")

	// Loaded again, it is held: nothing fetched.
	g.Expect(read(loaderRead, name)).To(Equal(sum(want)))
	g.Expect(fetched()).To(Equal(size))
	g.Expect(held()).To(Equal(size))

	// A pod's read finds every block the load brought, once.
	g.Expect(read(podRead, name)).To(Equal(sum(want)))
	g.Expect(hits()).To(Equal(size))
	g.Expect(read(podRead, name)).To(Equal(sum(want)))
	g.Expect(hits()).To(Equal(size), "a block counts once, for the first pod that read it")
	g.Expect(fetched()).To(Equal(size), "a pod's reads are no load's")

	// A pod's read of a file no load brought in is no hit.
	other := "nested/a/side by side.md"
	g.Expect(read(podRead, other)).To(Equal(sum(f.data.files[other])))
	g.Expect(hits()).To(Equal(size))
	g.Expect(fetched()).To(Equal(size))

	// The series go with the mount.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g.Expect(s.Unmount(ctx)).To(Succeed())
	g.Expect(fetched()).To(BeZero())
}

// gatedBlocks holds the fetches of one file until released, saying when one started, and
// records the order in which files were fetched.
type gatedBlocks struct {
	BlockReader
	gated    string
	started  chan struct{}
	release  chan struct{}
	mu       sync.Mutex
	startOne sync.Once
	order    []string
}

func (b *gatedBlocks) ReadBlock(ctx context.Context, file, etag string, size, index int64) ([]byte, error) {
	b.mu.Lock()
	b.order = append(b.order, file)
	b.mu.Unlock()
	if file == b.gated {
		b.startOne.Do(func() { close(b.started) })
		select {
		case <-b.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return b.BlockReader.ReadBlock(ctx, file, etag, size, index)
}

func (b *gatedBlocks) fetched() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.order...)
}

func TestALoadWaitsWhileAPodWaitsForAFetch(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	loads, err := NewLoads(f.reg, testLoaderUID)
	g.Expect(err).NotTo(HaveOccurred())
	blocks := &gatedBlocks{BlockReader: f.cache, gated: "big.bin", started: make(chan struct{}), release: make(chan struct{})}
	s := mount(t, f.config(func(c *Config) { c.Local = localBlocks{f.store}; c.Loads = loads; c.Blocks = blocks }))

	// A pod waits for a block of big.bin.
	type result struct {
		b   []byte
		err error
	}
	podDone := make(chan result)
	go func() { b, err := podRead(s.Dir(), "big.bin"); podDone <- result{b, err} }()
	<-blocks.started

	// A load of another file waits for it, and fetches nothing meanwhile.
	const loaded = "nested/a/side by side.md"
	loadDone := make(chan result)
	go func() { b, err := loaderRead(s.Dir(), loaded); loadDone <- result{b, err} }()
	g.Eventually(func() float64 { return counter(t, f.reg, "strata_worker_loads_waiting") }).
		WithTimeout(10 * time.Second).Should(Equal(1.0))
	g.Expect(blocks.fetched()).NotTo(ContainElement(loaded), "the load fetched while a pod waited")

	// Once the pod has its block, the load goes on.
	close(blocks.release)
	pod, load := <-podDone, <-loadDone
	g.Expect(pod.err).NotTo(HaveOccurred())
	g.Expect(sum(pod.b)).To(Equal(sum(f.data.files["big.bin"])))
	g.Expect(load.err).NotTo(HaveOccurred())
	g.Expect(sum(load.b)).To(Equal(sum(f.data.files[loaded])))
	g.Expect(blocks.fetched()).To(ContainElement(loaded))
	g.Expect(counter(t, f.reg, "strata_worker_loads_waiting")).To(BeZero())
}

// storedGate holds a fetch of one block once the cache has stored it, until released (or, so
// that a kernel that sends no second request meanwhile cannot hang the test, two seconds).
type storedGate struct {
	BlockReader
	mu      sync.Mutex
	index   int64 // the block whose next fetch is held; -1: none
	stored  chan struct{}
	release chan struct{}
}

// hold holds the next fetch of block index: stored is closed when it is in the tier, and it goes
// on when release is closed.
func (b *storedGate) hold(index int64) (stored, release chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.index, b.stored, b.release = index, make(chan struct{}), make(chan struct{})
	return b.stored, b.release
}

func (b *storedGate) ReadBlock(ctx context.Context, file, etag string, size, index int64) ([]byte, error) {
	data, err := b.BlockReader.ReadBlock(ctx, file, etag, size, index)
	b.mu.Lock()
	held := index == b.index
	if held {
		b.index = -1
	}
	stored, release := b.stored, b.release
	b.mu.Unlock()
	if held {
		close(stored)
		select {
		case <-release:
		case <-time.After(2 * time.Second):
		}
	}
	return data, err
}

// Two requests of one load for one block at once (the kernel splits reads): the second finds in
// the tier the block the first is still fetching. The block is counted once, as the load's
// fetch, not as one it found held.
func TestABlockALoadFetchesIsCountedFetchedWhicheverRequestFindsItFirst(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	f := newFixture(t, testDataset())
	loads, err := NewLoads(f.reg, testLoaderUID)
	g.Expect(err).NotTo(HaveOccurred())
	gate := &storedGate{BlockReader: f.cache, index: -1}
	s := mount(t, f.config(func(c *Config) { c.Local = localBlocks{f.store}; c.Loads = loads; c.Blocks = gate }))

	file, err := openAsLoader(s.Dir(), "big.bin")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = file.Close() }()
	fd := int(file.Fd())
	// No read-ahead: each read of a page is a FUSE request of its own.
	g.Expect(unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM)).To(Succeed())

	// The kernel now and then sends the second read only once the first is answered: each try
	// takes the next block, until one had both requests at once.
	concurrent, blocks := false, int64(0)
	for index := int64(0); index < 5 && !concurrent; index++ {
		stored, release := gate.hold(index)
		first := make(chan error, 1)
		go func() {
			_, err := unix.Pread(fd, make([]byte, 4096), index*testBlockSize)
			first <- err
		}()
		<-stored
		// The last page of the block: in another folio than the first.
		_, err = unix.Pread(fd, make([]byte, 4096), (index+1)*testBlockSize-4096)
		g.Expect(err).NotTo(HaveOccurred(), "the second request reads the stored block")
		select {
		case err := <-first:
			g.Expect(err).NotTo(HaveOccurred())
		default:
			concurrent = true
			close(release)
			g.Expect(<-first).To(Succeed())
		}
		blocks++
	}
	g.Expect(concurrent).To(BeTrue(), "in one of five tries, the second request was answered while the first still fetched")
	g.Expect(counter(t, f.reg, "strata_worker_load_fetched_bytes_total")).To(BeEquivalentTo(blocks*testBlockSize), "every block, fetched by the load")
	g.Expect(counter(t, f.reg, "strata_worker_load_held_bytes_total")).To(BeZero(), "none also, or instead, held")
}
