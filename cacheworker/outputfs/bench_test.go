package outputfs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/replication"
	"github.com/strata-cache/strata/cacheworker/tiermount"
	"github.com/strata-cache/strata/cacheworker/tierstore"
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
	base := fusetest.MemoryFolder(b)
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

// BenchmarkWritingAReplicatedOutput writes four files of 64 MiB through an output mount, with
// replication off and on (two copies on any node, at the default cap of 200 MiB/s), in one
// run: replication is asynchronous, so the writer should keep most of its throughput while the
// blocks of the files it sealed are copied to the other worker. Everything shares the two
// cores: the writer, the mount, both workers and the master.
//
//	go test -run '^$' -bench WritingAReplicatedOutput -benchtime 5x ./cacheworker/outputfs/
func BenchmarkWritingAReplicatedOutput(b *testing.B) {
	base := fusetest.MemoryFolder(b)
	master := mastertest.New(b, 1, mastertest.Options{GRPC: true}).Client()
	writer := startWorkerIn(b, master, "pool/node-a", 2<<30, filepath.Join(base, "writer"))
	other := startWorkerIn(b, master, "pool/node-b", 2<<30, filepath.Join(base, "other"))
	mnt := mountOutputIn(b, master, writer, 8<<20, filepath.Join(base, "staging"), logr.Discard())
	raw, err := json.Marshal(policy.File{Datasets: []policy.Dataset{{Name: dataset,
		Replication: &policy.Replication{Count: 2, Selective: true, BandwidthBytes: 200 << 20}}}})
	if err != nil {
		b.Fatal(err)
	}
	set, err := policy.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	peers := dataplane.NewPeers()
	b.Cleanup(func() { _ = peers.Close() })
	replicator := replication.New(replication.Config{Self: writer.id, Node: writer.id, Store: writer.store, Master: master, Sender: peers,
		Policies: func() *policy.Set { return set }, Recheck: time.Nanosecond})
	data := randomBytes(64<<20, 1)
	const files = 4
	for _, mode := range []string{"off", "on", "off", "on"} {
		b.Run("replication "+mode, func(b *testing.B) {
			b.SetBytes(files * int64(len(data)))
			for i := range b.N {
				ctx, stop := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					if mode == "on" {
						replicator.Run(ctx, 50*time.Millisecond)
					}
				}()
				dir := filepath.Join(mnt.Dir(), fmt.Sprintf("%s-%d", mode, i))
				if err := os.Mkdir(dir, 0o755); err != nil {
					b.Fatal(err)
				}
				for f := range files {
					if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("part-%d", f)), data, 0o644); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if mode == "on" {
					// The copies of the last file finish outside the measure, before the next run.
					for {
						res, err := replicator.Pass(context.Background())
						if err != nil {
							b.Fatal(err)
						}
						if res.Unreplicated == 0 {
							break
						}
					}
				}
				stop()
				<-done
				if err := os.RemoveAll(dir); err != nil {
					b.Fatal(err)
				}
				for _, blk := range other.store.Blocks() { // the replicas of what was removed
					if err := other.store.Delete(context.Background(), blk.ID); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkReadingASealedOutput reads a sealed 256 MiB output file (four 64 MiB blocks in this
// node's MEM tier on /dev/shm) whole through the output mount, its pages dropped before each
// read so that every byte is a FUSE read, as a later pipeline step on the node reads its input:
// spliced from the blocks' files, and copied through the worker, beside the same file in a
// tmpfs folder, alternating in one run.
//
//	go test -run '^$' -bench ReadingASealedOutput -benchtime 10x ./cacheworker/outputfs/
func BenchmarkReadingASealedOutput(b *testing.B) {
	const size = 256 << 20
	base := fusetest.MemoryFolder(b)
	master := mastertest.New(b, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorkerIn(b, master, "pool/node-a", 2<<30, filepath.Join(base, "worker"))
	writer := mountOutputIn(b, master, w, 64<<20, filepath.Join(base, "staging"), logr.Discard())
	data := randomBytes(size, 1)
	if err := os.WriteFile(filepath.Join(writer.Dir(), "big.bin"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	tmpfs := filepath.Join(base, "tmpfs")
	if err := os.Mkdir(tmpfs, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmpfs, "big.bin"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	readers := map[string]string{
		"tmpfs":   tmpfs,
		"spliced": mountOutputIn(b, master, w, 64<<20, filepath.Join(base, "staging-spliced"), logr.Discard()).Dir(),
		"copied": mountOutputIn(b, master, w, 64<<20, filepath.Join(base, "staging-copied"), logr.Discard(),
			func(c *outputfs.Config) { c.DisableSplice = true }).Dir(),
	}
	for _, mode := range []string{"tmpfs", "spliced", "copied", "tmpfs", "spliced", "copied"} {
		b.Run(mode, func(b *testing.B) {
			fusetest.ReadDroppedEachLoop(b, filepath.Join(readers[mode], "big.bin"), size)
		})
	}
}

// BenchmarkReadingSmallSealedOutputs walks a folder of 1,000 sealed output files of 4 KiB
// through an output mount of the node that wrote them, as a later pipeline step reads its
// input once the step that wrote it finished (the Dataset complete): it lists the folder, then
// opens and reads each file whole. It reports files/s.
//
//	go test -run '^$' -bench ReadingSmallSealedOutputs -benchtime 10x ./cacheworker/outputfs/
func BenchmarkReadingSmallSealedOutputs(b *testing.B) {
	const files, size = 1000, 4 << 10
	base := fusetest.MemoryFolder(b)
	master := mastertest.New(b, 1, mastertest.Options{GRPC: true}).Client()
	w := startWorkerIn(b, master, "pool/node-a", 2<<30, filepath.Join(base, "worker"))
	writer := mountOutputIn(b, master, w, 64<<20, filepath.Join(base, "staging"), logr.Discard())
	data := randomBytes(size, 1)
	if err := os.Mkdir(filepath.Join(writer.Dir(), "parts"), 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range files {
		if err := os.WriteFile(filepath.Join(writer.Dir(), "parts", fmt.Sprintf("part-%05d", i)), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := master.CompleteDataset(context.Background(), dataset); err != nil {
		b.Fatal(err)
	}
	reader := mountOutputIn(b, master, w, 64<<20, filepath.Join(base, "staging-reader"), logr.Discard())
	dir := filepath.Join(reader.Dir(), "parts")
	buf := make([]byte, 2*size)
	b.ResetTimer()
	for range b.N {
		entries, err := os.ReadDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		if len(entries) != files {
			b.Fatalf("listed %d files, want %d", len(entries), files)
		}
		for _, e := range entries {
			f, err := os.Open(filepath.Join(dir, e.Name()))
			if err != nil {
				b.Fatal(err)
			}
			if n, err := io.ReadFull(f, buf); n != size || !errors.Is(err, io.ErrUnexpectedEOF) {
				b.Fatalf("%s: read %d bytes (%v), want %d", e.Name(), n, err, size)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*files)/b.Elapsed().Seconds(), "files/s")
}

// BenchmarkWritingIntoTheWorkersTmpfs writes one 256 MiB output file (blocks of 64 MiB, a
// TierPool's default) through an output mount whose worker keeps its MEM tier and staging
// folder on a tmpfs mounted the way the worker mounts one (tiermount: huge pages within a
// file's size), and through one on a tmpfs of ordinary pages (the default, as /dev/shm), each
// beside a writer to a folder of the same tmpfs, alternating in one run.
//
//	go test -run '^$' -bench WritingIntoTheWorkersTmpfs -benchtime 5x ./cacheworker/outputfs/
func BenchmarkWritingIntoTheWorkersTmpfs(b *testing.B) {
	fusetest.Require(b)
	if os.Geteuid() != 0 {
		testenv.Lacking(b, "mounting tmpfs needs root")
	}
	master := mastertest.New(b, 1, mastertest.Options{GRPC: true}).Client()
	dirs := map[string]string{}
	for i, pages := range []string{"huge pages", "ordinary pages"} {
		base := b.TempDir()
		if mem, err := tiermount.InMemory(base); err != nil || mem {
			testenv.Lacking(b, "the temporary directory must be on a disk, for the benchmark to mount its own tmpfs: set TMPDIR")
		}
		if pages == "huge pages" {
			tier := tierstore.Tier{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{base}, Quota: 4 << 30}
			if err := tiermount.EnsureMemoryTiers([]tierstore.Tier{tier}, logr.Discard()); err != nil {
				b.Fatal(err)
			}
		} else if err := unix.Mount("strata-bench", base, "tmpfs", 0, "size=4g"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = unix.Unmount(base, unix.MNT_DETACH) }) // last: after the mounts in it
		w := startWorkerIn(b, master, fmt.Sprintf("pool/node-%d", i), 2<<30, filepath.Join(base, "worker"))
		dirs[pages+"/output mount"] = mountOutputIn(b, master, w, 64<<20, filepath.Join(base, "staging"), logr.Discard()).Dir()
		dirs[pages+"/tmpfs"] = filepath.Join(base, "tmpfs")
		if err := os.Mkdir(dirs[pages+"/tmpfs"], 0o755); err != nil {
			b.Fatal(err)
		}
	}
	data := randomBytes(256<<20, 1)
	for range 2 {
		for _, target := range []string{"ordinary pages/tmpfs", "ordinary pages/output mount", "huge pages/tmpfs", "huge pages/output mount"} {
			b.Run(target, func(b *testing.B) {
				b.SetBytes(int64(len(data)))
				for i := range b.N {
					name := filepath.Join(dirs[target], fmt.Sprintf("part-%d", i))
					if err := os.WriteFile(name, data, 0o644); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := os.Remove(name); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}
