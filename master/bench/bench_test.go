package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
	"github.com/strata-cache/strata/master/store"
)

// Run, for example:
//
//	go test ./master/bench -run '^$' -bench . -benchtime 3s
//	go test ./master/bench -run '^$' -bench 'Failover|MemoryPerFile' -benchtime 3x -files 1000000 -timeout 2h
var (
	files   = flag.Int("files", 1000, "files in the namespace before BenchmarkFailover and BenchmarkMemoryPerFile (e.g. 1000000)")
	clients = flag.Int("clients", 32, "concurrent clients issuing operations (DFS-Perf's threads)")
)

// productionConfig keeps the store's production defaults (Raft timeouts, memtables) so the
// figures mean what a deployment would see; only the directories and addresses are the test's.
func productionConfig(cfg *store.Config) {
	cfg.HeartbeatTimeout = store.DefaultHeartbeatTimeout
	cfg.ElectionTimeout = store.DefaultElectionTimeout
	cfg.LeaderLeaseTimeout = store.DefaultLeaderLeaseTimeout
	cfg.CommitTimeout = store.DefaultCommitTimeout
	cfg.ApplyTimeout = store.DefaultApplyTimeout
	cfg.LogSegmentSize = 0 // the default, as cmd/master runs
}

func newCluster(b *testing.B) (*mastertest.Cluster, *client.Client) {
	b.Helper()
	c := mastertest.New(b, 3, mastertest.Options{GRPC: true, Transport: mastertest.TCP, Tune: productionConfig})
	return c, c.Client()
}

func background(b *testing.B) context.Context {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Hour)
	b.Cleanup(cancel)
	return ctx
}

// parallel runs n operations spread over the configured number of clients and returns the
// elapsed time.
func parallel(b *testing.B, n int, op func(worker, i int) error) time.Duration {
	b.Helper()
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || firstErr.Load() != nil {
					return
				}
				if err := op(w, i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		b.Fatal(err)
	}
	return time.Since(start)
}

func reportRate(b *testing.B, n int, elapsed time.Duration) {
	b.ReportMetric(float64(n)/elapsed.Seconds(), "ops/s")
}

func create(ctx context.Context, cl *client.Client, p string) error {
	_, err := cl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: p})
	if err != nil {
		return fmt.Errorf("creating %s: %w", p, err)
	}
	return nil
}

// preload creates /<dir>/f<i> for i in [0, n) with all clients.
func preload(ctx context.Context, b *testing.B, cl *client.Client, dir string, n int) {
	b.Helper()
	elapsed := parallel(b, n, func(_, i int) error { return create(ctx, cl, fmt.Sprintf("/%s/f%d", dir, i)) })
	if n >= 10000 {
		b.Logf("preloaded %d files in %v (%.0f creates/s)", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	}
}

func BenchmarkCreate(b *testing.B) {
	ctx := background(b)
	_, cl := newCluster(b)
	b.ResetTimer()
	elapsed := parallel(b, b.N, func(_, i int) error { return create(ctx, cl, fmt.Sprintf("/create/f%d", i)) })
	reportRate(b, b.N, elapsed)
}

func BenchmarkExists(b *testing.B) {
	ctx := background(b)
	_, cl := newCluster(b)
	const n = 1000
	preload(ctx, b, cl, "exists", n)
	b.ResetTimer()
	elapsed := parallel(b, b.N, func(_, i int) error {
		p := fmt.Sprintf("/exists/f%d", (i*7919)%n)
		ok, err := cl.Exists(ctx, p)
		if err != nil || !ok {
			return fmt.Errorf("exists %s: %v, %w", p, ok, err)
		}
		return nil
	})
	reportRate(b, b.N, elapsed)
}

func BenchmarkRename(b *testing.B) {
	ctx := background(b)
	_, cl := newCluster(b)
	// Each client owns one file and moves it back and forth, so no preload depends on b.N.
	preload(ctx, b, cl, "rename/a", *clients)
	moves := make([]int, *clients) // moves[w] is touched by client w only
	b.ResetTimer()
	elapsed := parallel(b, b.N, func(w, _ int) error {
		from, to := fmt.Sprintf("/rename/a/f%d", w), fmt.Sprintf("/rename/b/f%d", w)
		if moves[w]%2 == 1 {
			from, to = to, from
		}
		moves[w]++
		if _, err := cl.RenameFile(ctx, from, to); err != nil {
			return fmt.Errorf("renaming %s: %w", from, err)
		}
		return nil
	})
	reportRate(b, b.N, elapsed)
}

func BenchmarkDelete(b *testing.B) {
	ctx := background(b)
	_, cl := newCluster(b)
	b.StopTimer()
	preload(ctx, b, cl, "delete", b.N)
	b.StartTimer()
	elapsed := parallel(b, b.N, func(_, i int) error {
		p := fmt.Sprintf("/delete/f%d", i)
		if _, err := cl.DeleteFile(ctx, p); err != nil {
			return fmt.Errorf("deleting %s: %w", p, err)
		}
		return nil
	})
	reportRate(b, b.N, elapsed)
}

func BenchmarkList(b *testing.B) {
	ctx := background(b)
	_, cl := newCluster(b)
	// DFS-Perf lists a directory per operation; a directory of 100 files.
	const n = 100
	preload(ctx, b, cl, "list", n)
	b.ResetTimer()
	elapsed := parallel(b, b.N, func(int, int) error {
		resp, err := cl.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: "/list"})
		if err != nil || len(resp.Entries) != n {
			return fmt.Errorf("listing: %d entries, %w", len(resp.GetEntries()), err)
		}
		return nil
	})
	reportRate(b, b.N, elapsed)
}

// BenchmarkFailover fails the leader of a cluster holding -files files and measures until the
// client's next write is acknowledged by the new leader, in two ways:
//   - killed: its gRPC server and Raft stop at once, as in a crash (SIGKILL): the client's
//     connections are reset; Raft over loopback TCP.
//   - stopped: it stops answering while its connections stay open, as a stopped node, a frozen
//     VM or a cut network does: the client learns it only by asking the others (its attempt
//     timeout is 2 s); Raft over the in-memory transport, which can cut a replica off.
//
// Each iteration brings the replica back and waits for it to catch up before the next; that
// part is not measured.
func BenchmarkFailover(b *testing.B) {
	for _, mode := range []struct {
		name      string
		transport mastertest.Transport
		fail      func(*mastertest.Cluster, *mastertest.Node)
		recover   func(*mastertest.Cluster, *mastertest.Node)
	}{
		{"killed", mastertest.TCP, (*mastertest.Cluster).Kill, (*mastertest.Cluster).Restart},
		{"stopped", mastertest.Inmem, (*mastertest.Cluster).Stop, (*mastertest.Cluster).Resume},
	} {
		b.Run(mode.name, func(b *testing.B) {
			ctx := background(b)
			c := mastertest.New(b, 3, mastertest.Options{GRPC: true, Transport: mode.transport, Tune: productionConfig})
			cl, err := client.New(c.APIAddrs(), client.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = cl.Close() })
			preload(ctx, b, cl, "ns", *files)
			var times []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if err := c.WaitConverged(ctx); err != nil {
					b.Fatal(err)
				}
				leader, err := c.Leader(ctx)
				if err != nil {
					b.Fatal(err)
				}
				// Point the client at the leader first, as a busy client would be.
				if err := create(ctx, cl, fmt.Sprintf("/failover/warm-%d", i)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				mode.fail(c, leader)
				if err := create(ctx, cl, fmt.Sprintf("/failover/after-%d", i)); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(start))
				b.StopTimer()
				mode.recover(c, leader)
			}
			b.Logf("each failover, in order: %v", times)
			sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
			var sum time.Duration
			for _, d := range times {
				sum += d
			}
			b.Logf("each failover, shortest first: %v", times)
			b.ReportMetric(float64(sum.Milliseconds())/float64(len(times)), "ms/failover")
			b.ReportMetric(float64(times[len(times)-1].Milliseconds()), "max-ms")
			b.ReportMetric(float64(*files), "files")
		})
	}
}

// BenchmarkMemoryPerFile creates -files files and reports what one file costs a replica: the
// bytes of its records in the state machine (keys and values), the bytes it adds to a snapshot
// (what a replica writes to disk and ships to a lagging peer), and the growth of the Go heap
// (for the three replicas of this process together, divided by three). The op is one create;
// ns/op is meaningless here.
func BenchmarkMemoryPerFile(b *testing.B) {
	ctx := background(b)
	c, cl := newCluster(b)
	heapBefore := heapInUse()
	preload(ctx, b, cl, "mem", *files)
	if err := c.WaitConverged(ctx); err != nil {
		b.Fatal(err)
	}
	heapAfter := heapInUse()
	leader, err := c.Leader(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var logical int64
	err = leader.Store.Read(ctx, true, func(m *fsm.FSM) error {
		return m.DB().View(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.DefaultIteratorOptions)
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				logical += int64(len(it.Item().Key())) + it.Item().ValueSize()
			}
			return nil
		})
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := leader.Store.Snapshot(ctx); err != nil {
		b.Fatal(err)
	}
	snapshot := newestSnapshotSize(b, filepath.Join(leader.Dir, "snapshots"))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := create(ctx, cl, fmt.Sprintf("/mem-op/f%d-%d", i, rand.Int())); err != nil {
			b.Fatal(err)
		}
	}
	// After ResetTimer, which drops reported metrics.
	n := float64(*files)
	b.ReportMetric(float64(logical)/n, "state-bytes/file")
	b.ReportMetric(float64(snapshot)/n, "snapshot-bytes/file")
	b.ReportMetric(float64(int64(heapAfter)-int64(heapBefore))/3/n, "heap-bytes/file")
}

// newestSnapshotSize is the size of the newest snapshot raft's file store holds in dir.
func newestSnapshotSize(b *testing.B, dir string) int64 {
	b.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	var newest string
	for _, e := range entries {
		// Snapshot directories are named term-index-timestamp, so the greatest name is newest.
		if e.IsDir() && e.Name() > newest && !strings.HasSuffix(e.Name(), ".tmp") {
			newest = e.Name()
		}
	}
	fi, err := os.Stat(filepath.Join(dir, newest, "state.bin"))
	if err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// BenchmarkHeartbeat sends workers' heartbeats through the client, side by side: "steady",
// whose tier usage holds still (the leader keeps them in memory), and "moving", whose usage
// moves by a tenth of the tier each time (each is a Raft entry, as every heartbeat was before).
// It reports heartbeats per second and Raft entries per heartbeat.
func BenchmarkHeartbeat(b *testing.B) {
	const workers = 100
	for _, bc := range []struct {
		name string
		used func(i int) int64
	}{
		{"steady", func(int) int64 { return 100 }},
		{"moving", func(i int) int64 { return int64(i%2) * 100 }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := background(b)
			c, cl := newCluster(b)
			for w := range workers {
				if _, err := cl.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: fmt.Sprintf("pool/node-%d", w), Node: fmt.Sprintf("node-%d", w)}); err != nil {
					b.Fatal(err)
				}
			}
			leader, err := c.Leader(ctx)
			if err != nil {
				b.Fatal(err)
			}
			before := leader.Store.AppliedIndex()
			b.ResetTimer()
			elapsed := parallel(b, b.N, func(_, i int) error {
				_, err := cl.Heartbeat(ctx, &masterpb.HeartbeatRequest{
					Worker: fmt.Sprintf("pool/node-%d", i%workers),
					Tiers:  []*masterpb.TierUsage{{Tier: "mem", CapacityBytes: 1000, UsedBytes: bc.used(i / workers)}},
				})
				return err
			})
			reportRate(b, b.N, elapsed)
			b.ReportMetric(float64(leader.Store.AppliedIndex()-before)/float64(b.N), "entries/op")
		})
	}
}

// BenchmarkBackupAndRestore backs up three replicas holding -files files, as the operator does
// (the leader's snapshot streamed over gRPC, here to a file), and restores each backup into a
// new three-replica master: the restore is done when raft has replicated it (raft.Restore waits
// for a follower to take the restored snapshot and the entry after it). One op is one backup
// and one restore.
func BenchmarkBackupAndRestore(b *testing.B) {
	ctx := background(b)
	_, cl := newCluster(b)
	preload(ctx, b, cl, "backup", *files)
	path := filepath.Join(b.TempDir(), "master.backup")
	var backups, restores time.Duration
	var size int64
	attempts := 0 // restores asked again
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		header, stream, err := cl.Backup(ctx)
		if err != nil {
			b.Fatal(err)
		}
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if size, err = io.Copy(f, stream); err != nil || size != header.Size {
			b.Fatalf("backup: %d of %d bytes: %v", size, header.Size, err)
		}
		_ = stream.Close()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		backups += time.Since(start)

		b.StopTimer()
		_, fresh := newCluster(b)
		in, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start = time.Now()
		// As the operator does: a restore whose outcome was not learnt is asked again, after a
		// pause in which the replicas finish installing it and elect a leader.
		var resp *masterpb.RestoreResponse
		for attempt := 1; ; attempt++ {
			if resp, err = fresh.Restore(ctx, in); err == nil {
				break
			}
			b.Logf("restore attempt %d: %v", attempt, err)
			if attempt == 10 {
				b.Fatal(err)
			}
			if _, err := in.Seek(0, io.SeekStart); err != nil {
				b.Fatal(err)
			}
			attempts++
			select {
			case <-ctx.Done():
				b.Fatal(ctx.Err())
			case <-time.After(2 * time.Second):
			}
		}
		restores += time.Since(start)
		_ = in.Close()
		if resp.Files != int64(*files) {
			b.Fatalf("restored %d files, want %d", resp.Files, *files)
		}
	}
	b.ReportMetric(float64(*files), "files")
	b.ReportMetric(float64(size)/float64(*files), "bytes/file")
	b.ReportMetric(backups.Seconds()/float64(b.N), "s/backup")
	b.ReportMetric(restores.Seconds()/float64(b.N), "s/restore")
	b.ReportMetric(float64(size)/1e6/(backups.Seconds()/float64(b.N)), "backup-MB/s")
	b.ReportMetric(float64(attempts)/float64(b.N), "retries/restore")
}
