package shortcircuit_test

import (
	"context"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/tierstore"
)

// benchBlockSize is the block size of the benchmarks, as in the cache's benchmarks.
const benchBlockSize = 4 << 20

// benchStore is a store holding one 4 MiB block on tmpfs when the machine has /dev/shm, as the
// MEM tier would be, so that the benchmarks measure the copies and not a disk.
func benchStore(b *testing.B) *tierstore.Store {
	b.Helper()
	root := b.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "strata-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
		root = dir
	}
	s := newStore(b, root)
	putBlock(b, s, "blk-1", benchBlockSize)
	return s
}

// BenchmarkShortCircuitRead gets the block's descriptor over the socket and reads it: with
// pread into a buffer the caller reuses (one copy, kernel to caller), and by mapping it and
// touching every page (no copy at all). Each iteration includes the request and the open.
func BenchmarkShortCircuitRead(b *testing.B) {
	ctx := context.Background()
	store := benchStore(b)
	srv := startServer(b, store)
	c := dial(b, srv.path)
	page := os.Getpagesize()

	b.Run("pread", func(b *testing.B) {
		buf := make([]byte, benchBlockSize)
		b.SetBytes(benchBlockSize)
		b.ReportAllocs()
		for b.Loop() {
			f, _, err := c.Open(ctx, "blk-1")
			if err != nil {
				b.Fatal(err)
			}
			if n, err := f.ReadAt(buf, 0); err != nil || n != benchBlockSize {
				b.Fatalf("read %d bytes: %v", n, err)
			}
			_ = f.Close()
		}
	})
	b.Run("mmap", func(b *testing.B) {
		b.SetBytes(benchBlockSize)
		b.ReportAllocs()
		var sum byte
		for b.Loop() {
			f, info, err := c.Open(ctx, "blk-1")
			if err != nil {
				b.Fatal(err)
			}
			m, err := unix.Mmap(int(f.Fd()), 0, int(info.Size), unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				b.Fatal(err)
			}
			for off := 0; off < len(m); off += page {
				sum += m[off]
			}
			if err := unix.Munmap(m); err != nil {
				b.Fatal(err)
			}
			_ = f.Close()
		}
		_ = sum
	})
}

// BenchmarkStoreGet reads the same block through the store, as the worker's data plane does:
// a new buffer per read, filled by a copy, and the CRC-32C checked over it.
func BenchmarkStoreGet(b *testing.B) {
	ctx := context.Background()
	store := benchStore(b)
	b.SetBytes(benchBlockSize)
	b.ReportAllocs()
	for b.Loop() {
		data, _, err := store.Get(ctx, "blk-1")
		if err != nil || len(data) != benchBlockSize {
			b.Fatalf("got %d bytes: %v", len(data), err)
		}
	}
}
