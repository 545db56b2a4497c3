package outputfs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/internal/testenv"
	"github.com/strata-cache/strata/master/mastertest"
)

// BenchmarkWritingAnOutput writes what a pipeline step writes, through an output mount (each
// file staged in memory, sealed at close into the tier store and published at the master)
// beside the same writes to a tmpfs folder, the baseline of a step writing to memory with no
// cache at all. Both are on /dev/shm; the master is one in-process replica.
//
//	go test -run '^$' -bench WritingAnOutput -benchtime 10x ./cacheworker/outputfs/
func BenchmarkWritingAnOutput(b *testing.B) {
	fusetest.Require(b)
	base, err := os.MkdirTemp("/dev/shm", "strata-bench-")
	if err != nil {
		testenv.Lacking(b, fmt.Sprint("needs /dev/shm: ", err))
	}
	b.Cleanup(func() { _ = os.RemoveAll(base) })
	master := mastertest.New(b, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorkerIn(b, master, "pool/node-a", 2<<30, filepath.Join(base, "worker"))
	mnt := mountOutputIn(b, master, w, 8<<20, filepath.Join(base, "staging"), logr.Discard())
	tmpfs := filepath.Join(base, "tmpfs")
	if err := os.Mkdir(tmpfs, 0o755); err != nil {
		b.Fatal(err)
	}

	for _, shape := range []struct {
		name        string
		files, size int
	}{
		{"one 256 MiB file", 1, 256 << 20},
		{"1000 files of 4 KiB", 1000, 4 << 10},
	} {
		data := randomBytes(shape.size, 1)
		for _, target := range []struct{ name, dir string }{{"tmpfs", tmpfs}, {"output mount", mnt.Dir()}} {
			b.Run(shape.name+"/"+target.name, func(b *testing.B) {
				b.SetBytes(int64(shape.files * shape.size))
				for i := range b.N {
					dir := filepath.Join(target.dir, fmt.Sprintf("run-%d", i))
					if err := os.Mkdir(dir, 0o755); err != nil {
						b.Fatal(err)
					}
					for f := range shape.files {
						// WriteFile closes the file: through the mount, that seals it.
						if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("part-%05d", f)), data, 0o644); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					if err := os.RemoveAll(dir); err != nil { // the tier keeps sealed blocks until they are deleted
						b.Fatal(err)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*shape.files), "ns/file")
			})
		}
	}
}
