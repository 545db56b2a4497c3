package fusefs

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// memoryBlocks serves every block of every file from one buffer: the FUSE serving path alone,
// with no tier store or under-store behind it.
type memoryBlocks struct{ block []byte }

func (m memoryBlocks) ReadBlock(context.Context, string, int64) ([]byte, error) { return m.block, nil }

// BenchmarkReadThroughTheMount reads a 256 MiB file through the mount, its pages dropped from
// the page cache first so that every byte is a FUSE read answered by the server.
//
//	go test -run '^$' -bench ReadThroughTheMount ./cacheworker/fusefs/
func BenchmarkReadThroughTheMount(b *testing.B) {
	if err := unix.Access("/dev/fuse", unix.R_OK|unix.W_OK); err != nil || os.Getuid() != 0 {
		b.Skip("needs root and /dev/fuse")
	}
	const blockSize, fileSize = 8 << 20, 256 << 20
	dir := filepath.Join(b.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	s, err := Mount(context.Background(), dir, Config{
		Objects:   fakeLister{{Path: "big.bin", Size: fileSize}},
		Blocks:    memoryBlocks{block: make([]byte, blockSize)},
		BlockSize: blockSize,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Unmount(context.Background()) }()
	buf := make([]byte, 1<<20)
	b.SetBytes(fileSize)
	for b.Loop() {
		f, err := os.Open(filepath.Join(dir, "big.bin"))
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
		if err != nil || n != fileSize {
			b.Fatalf("read %d bytes: %v", n, err)
		}
		_ = f.Close()
	}
}
