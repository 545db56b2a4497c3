package main

import (
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// A measure is one workload's result on one system: a rate in unit.
type measure struct {
	value float64
	unit  string // "MB/s" or "files/s"
	cpu   cpuUse // the cores busy meanwhile (metered)
}

func mbps(bytes int64, d time.Duration) measure {
	return measure{value: float64(bytes) / 1e6 / d.Seconds(), unit: "MB/s"}
}

func filesPerSecond(files int, d time.Duration) measure {
	return measure{value: float64(files) / d.Seconds(), unit: "files/s"}
}

// readBuffer is what the reader asks of read(2) at a time, as dd bs=1M does.
const readBuffer = 1 << 20

// readSequential reads path from its first byte to its last.
func readSequential(path string) (measure, error) {
	f, err := os.Open(path)
	if err != nil {
		return measure{}, err
	}
	defer func() { _ = f.Close() }()
	start := time.Now()
	n, err := io.CopyBuffer(io.Discard, onlyReader{f}, make([]byte, readBuffer))
	if err != nil {
		return measure{}, fmt.Errorf("reading %s: %w", path, err)
	}
	return mbps(n, time.Since(start)), nil
}

// onlyReader hides *os.File's WriterTo, so that every read is one read(2) of readBuffer.
type onlyReader struct{ io.Reader }

// dropPages asks the kernel to forget the cached pages of path, so that the next read goes
// through the file system again (a no-op on tmpfs, whose pages are the file).
func dropPages(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("dropping the cached pages of %s: %w", path, err)
	}
	return nil
}

// readRandom makes reads of size at random aligned offsets of path, the same offsets on every
// system (seeded), and rates them in MB/s.
func readRandom(path string, size, reads int) (measure, error) {
	f, err := os.Open(path)
	if err != nil {
		return measure{}, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return measure{}, err
	}
	slots := st.Size() / int64(size)
	if slots == 0 {
		return measure{}, fmt.Errorf("%s has fewer than %d bytes", path, size)
	}
	rnd := rand.New(rand.NewPCG(1, uint64(size)))
	buf := make([]byte, size)
	start := time.Now()
	for range reads {
		if _, err := f.ReadAt(buf, rnd.Int64N(slots)*int64(size)); err != nil {
			return measure{}, fmt.Errorf("reading %s: %w", path, err)
		}
	}
	return mbps(int64(reads)*int64(size), time.Since(start)), nil
}

// readTree lists dir and reads every file under it, one after the other, as a data loader
// walking a folder of samples does.
func readTree(dir string, wantFiles int) (measure, error) {
	buf := make([]byte, readBuffer)
	files := 0
	start := time.Now()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		_, err = io.CopyBuffer(io.Discard, onlyReader{f}, buf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		files++
		return err
	})
	d := time.Since(start)
	if err != nil {
		return measure{}, fmt.Errorf("reading the files under %s: %w", dir, err)
	}
	if files != wantFiles {
		return measure{}, fmt.Errorf("%s holds %d files, want %d", dir, files, wantFiles)
	}
	return filesPerSecond(files, d), nil
}

// writeLarge writes size bytes into a new file of dir, a megabyte at a time, and closes it:
// for an output mount the close is when the file is published.
func writeLarge(dir string, size int64) (measure, error) {
	data := payload(readBuffer, 7)
	path := filepath.Join(dir, "large.out")
	start := time.Now()
	f, err := os.Create(path)
	if err != nil {
		return measure{}, err
	}
	for written := int64(0); written < size; written += readBuffer {
		if _, err := f.Write(data); err != nil {
			_ = f.Close()
			return measure{}, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return measure{}, fmt.Errorf("closing %s: %w", path, err)
	}
	return mbps(size, time.Since(start)), nil
}

// writeSmall writes files new files of size bytes each into dir, each created, written and
// closed before the next.
func writeSmall(dir string, files, size int) (measure, error) {
	data := payload(size, 11)
	start := time.Now()
	for i := range files {
		path := filepath.Join(dir, fmt.Sprintf("part-%05d", i))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return measure{}, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return filesPerSecond(files, time.Since(start)), nil
}

// payload is n bytes that do not compress, the same for a seed.
func payload(n int, seed uint64) []byte {
	b := make([]byte, n)
	rnd := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i+8 <= n; i += 8 {
		v := rnd.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}
