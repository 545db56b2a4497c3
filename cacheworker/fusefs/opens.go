package fusefs

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openCounts is what the kernel must be told consistently about one file's opens (see
// passthrough.go): the backing file's id while passthrough opens are outstanding, and how
// many opens are outstanding in each mode.
type openCounts struct {
	backingID   int32
	passthrough int32
	cached      int32
}

// opensHeader starts the table: the server generation, which handle numbers carry so that a
// process taking over never reuses a handle number of an open it did not make.
type opensHeader struct {
	generation uint32
	_          uint32
}

const (
	opensHeaderSize = int(unsafe.Sizeof(opensHeader{}))
	openCountsSize  = int(unsafe.Sizeof(openCounts{}))
)

// opensTable holds every file's openCounts in shared memory (a memfd), so that they outlive
// the process: the kernel keeps a file's mode and backing file across a worker restart, and
// the process taking over must answer the next open of that file the same way. The memfd
// travels with the FUSE connection in a handover. A refresh that adds nodes grows it (grow);
// the file is never shorter than the node list its process serves.
type opensTable struct {
	file *os.File

	// mu guards the mapping, which grow replaces: held for reading while a count is used.
	mu     sync.RWMutex
	mem    []byte
	header *opensHeader
	counts []openCounts // by node id
}

// newOpensTable makes a zeroed table for nodes node ids.
func newOpensTable(nodes int) (*opensTable, error) {
	fd, err := unix.MemfdCreate("strata-fuse-opens", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating the table of open files: %w", err)
	}
	f := os.NewFile(uintptr(fd), "strata-fuse-opens")
	if err := f.Truncate(int64(opensTableSize(nodes))); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("sizing the table of open files: %w", err)
	}
	t, err := mapOpensTable(f, nodes)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return t, nil
}

func opensTableSize(nodes int) int { return opensHeaderSize + nodes*openCountsSize }

// mapOpensTable maps a table made by newOpensTable, here or in an earlier process. It takes
// f over.
func mapOpensTable(f *os.File, nodes int) (*opensTable, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading the table of open files: %w", err)
	}
	// Larger is fine: the process that handed over may have grown it for a refresh whose
	// state it did not hand over yet.
	if want := opensTableSize(nodes); st.Size() < int64(want) {
		return nil, fmt.Errorf("the table of open files has %d bytes, want at least %d for %d nodes", st.Size(), want, nodes)
	}
	t := &opensTable{file: f}
	if err := t.mapFile(int(st.Size())); err != nil {
		return nil, err
	}
	return t, nil
}

// mapFile maps the first size bytes of the file; t.mu is held or t not yet shared.
func (t *opensTable) mapFile(size int) error {
	mem, err := unix.Mmap(int(t.file.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mapping the table of open files: %w", err)
	}
	if t.mem != nil {
		_ = unix.Munmap(t.mem) // nothing refers to it: every user holds t.mu
	}
	t.mem = mem
	t.header = (*opensHeader)(unsafe.Pointer(&mem[0]))
	t.counts = unsafe.Slice((*openCounts)(unsafe.Pointer(&mem[opensHeaderSize])), (size-opensHeaderSize)/openCountsSize)
	return nil
}

// at returns node id's counts, valid until unlock is called.
func (t *opensTable) at(id uint64) (c *openCounts, unlock func()) {
	t.mu.RLock()
	return &t.counts[id], t.mu.RUnlock
}

// grow makes room for nodes node ids; the counts already there stay as they are.
func (t *opensTable) grow(nodes int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if nodes <= len(t.counts) {
		return nil
	}
	size := opensTableSize(nodes)
	if err := t.file.Truncate(int64(size)); err != nil {
		return fmt.Errorf("growing the table of open files to %d nodes: %w", nodes, err)
	}
	return t.mapFile(size)
}

// nextGeneration starts a new server generation and returns it.
func (t *opensTable) nextGeneration() uint32 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return atomic.AddUint32(&t.header.generation, 1)
}

func (t *opensTable) close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return errors.Join(unix.Munmap(t.mem), t.file.Close())
}
