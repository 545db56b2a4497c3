package tierstore

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/internal/durable"
)

// copyBufferSize is the chunk in which blocks are written and copied: large enough that the
// system-call count does not matter, small enough that a cancelled context is noticed soon.
const copyBufferSize = 1 << 20

// writeFile writes size bytes from r as block id in dirPath, atomically: a temporary file
// renamed over the final name, so that the name never shows a partial block. If sync, the
// file is fsynced before the rename and the directory after it, so that the block survives a
// crash; blocks with a copy elsewhere skip both, since a torn one is caught by its checksum
// when the store starts and read again. It returns the bytes' CRC-32C. If want is non-nil,
// the bytes must match it, or the file is removed and the error wraps ErrCorrupt.
func writeFile(ctx context.Context, dirPath, id string, r io.Reader, size int64, want *uint32, sync bool) (sum uint32, err error) {
	f, err := os.CreateTemp(dirPath, blockindex.TempPrefix+id+"-*")
	if err != nil {
		return 0, fmt.Errorf("creating temporary file for block %s in %s: %w", id, dirPath, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	h := blockindex.NewHash()
	// One byte more than declared, to notice a reader that has more to give.
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, size+1), make([]byte, min(copyBufferSize, size+1)))
	if err != nil {
		return 0, fmt.Errorf("writing block %s to %s: %w", id, tmp, err)
	}
	if n != size {
		return 0, fmt.Errorf("writing block %s: the reader gave %s bytes, %d were declared", id, atLeast(n, size), size)
	}
	sum = h.Sum32()
	if want != nil && sum != *want {
		return 0, fmt.Errorf("copying block %s: crc32c %08x, expected %08x: %w", id, sum, *want, ErrCorrupt)
	}
	if sync {
		if err = f.Sync(); err != nil {
			return 0, fmt.Errorf("syncing block %s in %s: %w", id, tmp, err)
		}
	}
	if err = f.Close(); err != nil {
		return 0, fmt.Errorf("closing block %s in %s: %w", id, tmp, err)
	}
	if err = os.Rename(tmp, blockindex.BlockPath(dirPath, id)); err != nil {
		return 0, fmt.Errorf("renaming block %s into place in %s: %w", id, dirPath, err)
	}
	if sync {
		if err = durable.SyncDir(dirPath); err != nil {
			return 0, err
		}
	}
	return sum, nil
}

// errOtherFileSystem: a file cannot be linked into a directory of another file system.
var errOtherFileSystem = errors.New("on another file system")

// sameFileSystem is those of dirs on the file system of the file at path, into which it can be
// linked.
func sameFileSystem(dirs []*dir, path string) []*dir {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil // Adopt's open says why
	}
	var same []*dir
	for _, d := range dirs {
		var ds unix.Stat_t
		if unix.Stat(d.path, &ds) == nil && ds.Dev == st.Dev {
			same = append(same, d)
		}
	}
	return same
}

// linkFile makes the file at src, of size bytes, block id in dirPath without copying it: a hard
// link, under a temporary name renamed over the final one, as writeFile does. It reads the
// file once for its CRC-32C, which it returns, unless the caller knows it already (known). If sync, the file and the directory are
// synced as writeFile syncs them. It fails with errOtherFileSystem when src is not on dirPath's
// file system, and the caller copies instead.
func linkFile(ctx context.Context, dirPath, id, src string, size int64, known *uint32, sync bool) (sum uint32, err error) {
	f, err := openBlock(src)
	if err != nil {
		return 0, fmt.Errorf("opening %s to store it as block %s: %w", src, id, err)
	}
	defer func() { _ = f.Close() }() // read only; the sync below is what matters
	fi, err := f.Stat()
	switch {
	case err != nil:
		return 0, fmt.Errorf("storing %s as block %s: %w", src, id, err)
	case !fi.Mode().IsRegular():
		return 0, fmt.Errorf("storing %s as block %s: not a regular file", src, id)
	case fi.Size() != size:
		return 0, fmt.Errorf("storing %s as block %s: it has %d bytes, %d were declared", src, id, fi.Size(), size)
	}
	if known != nil {
		sum = *known
	} else if sum, err = checksumFile(ctx, f, size); err != nil {
		return 0, fmt.Errorf("reading %s to store it as block %s: %w", src, id, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("syncing %s to store it as block %s: %w", src, id, err)
		}
	}
	tmp := filepath.Join(dirPath, fmt.Sprintf("%s%s-link-%d", blockindex.TempPrefix, id, time.Now().UnixNano()))
	if err := os.Link(src, tmp); err != nil {
		if errors.Is(err, syscall.EXDEV) {
			return 0, errOtherFileSystem
		}
		return 0, fmt.Errorf("linking %s into %s as block %s: %w", src, dirPath, id, err)
	}
	if err := os.Rename(tmp, blockindex.BlockPath(dirPath, id)); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("renaming block %s into place in %s: %w", id, dirPath, err)
	}
	if sync {
		if err := durable.SyncDir(dirPath); err != nil {
			return 0, err
		}
	}
	return sum, nil
}

// checksumFile is the CRC-32C of the size bytes of f. (Through a mapping of the file instead
// of copies out of it, the CPU it takes was the same: mapping the pages costs what copying them
// does.)
func checksumFile(ctx context.Context, f *os.File, size int64) (uint32, error) {
	h := blockindex.NewHash()
	if _, err := io.CopyBuffer(h, ctxReader{ctx, f}, make([]byte, min(copyBufferSize, size+1))); err != nil {
		return 0, err
	}
	return h.Sum32(), nil
}

func atLeast(n, size int64) string {
	if n > size {
		return fmt.Sprintf("more than %d", size)
	}
	return fmt.Sprint(n)
}

// inMemory tells whether p is on a file system that lives in memory only.
func inMemory(p string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return false, fmt.Errorf("finding the file system of %s: %w", p, err)
	}
	return st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC, nil
}

// openBlock opens a block file for reading. O_NOFOLLOW: a block is always a regular file the
// store wrote, never a link to something else.
func openBlock(p string) (*os.File, error) {
	return os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
}

// readBlock reads a whole block of the given size from p. A file of another size is corrupt.
func readBlock(p string, size int64) ([]byte, error) {
	f, err := openBlock(p)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only: a failed close loses nothing
	buf := make([]byte, size+1)
	n, err := io.ReadFull(f, buf)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		if int64(n) != size {
			return nil, fmt.Errorf("%s has %d bytes, %d expected: %w", p, n, size, ErrCorrupt)
		}
		return buf[:n], nil
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", p, err)
	default:
		return nil, fmt.Errorf("%s is longer than the %d bytes expected: %w", p, size, ErrCorrupt)
	}
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// verifyingReader checksums what it reads and, at the end, fails with ErrCorrupt rather than
// io.EOF if the bytes do not match: whoever consumes it (a checkpoint upload) then fails
// instead of storing corrupt data as good.
type verifyingReader struct {
	id   string
	r    io.Reader
	h    hash.Hash32
	want uint32
	size int64
	n    int64
}

func newVerifyingReader(id string, r io.Reader, size int64, want uint32) *verifyingReader {
	return &verifyingReader{id: id, r: r, h: blockindex.NewHash(), want: want, size: size}
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if errors.Is(err, io.EOF) {
		if v.n != v.size {
			return n, fmt.Errorf("block %s has %d bytes, %d expected: %w", v.id, v.n, v.size, ErrCorrupt)
		}
		if sum := v.h.Sum32(); sum != v.want {
			return n, fmt.Errorf("block %s: crc32c %08x, expected %08x: %w", v.id, sum, v.want, ErrCorrupt)
		}
	}
	return n, err
}
