package checkpoint_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// Sizes of the benchmark: one output file of 64 MiB in blocks of 4 MiB, as a step writes it.
const (
	benchFileSize  = 64 << 20
	benchBlockSize = 4 << 20
)

// BenchmarkCheckpoint writes one sealed output file from a MEM tier on tmpfs to MinIO on
// 127.0.0.1, in one run next to its baseline:
//
//   - "checkpoint": the checkpointer's write of the file, at once (as a write-through or a
//     persist before a drop does): its blocks read back from tmpfs, each checked against its
//     CRC-32C on the way, streamed to MinIO, and recorded at the master over mutual TLS, as in
//     a cluster;
//
//   - "checkpoint, master in plaintext": the same with a master that speaks no TLS, what the
//     write cost before components proved who they are;
//
//   - "PutObject from memory": the same bytes put to MinIO with minio-go from a byte slice, the
//     least any copy to the under-store costs;
//
//   - "checkpoint in the background, capped at 32 MiB/s": the background loop's write under a
//     CachePolicy's bandwidthLimit of 32Mi, from the file's seal to its blocks marked clean.
//
//     go test ./cacheworker/checkpoint/ -run '^$' -bench Checkpoint -benchtime 5x -count 3
func BenchmarkCheckpoint(b *testing.B) {
	ctx := context.Background()
	n := newNode(b, 4*benchFileSize)
	n.bs = benchBlockSize
	// The real clock: the background loop's retries must come due.
	n.cp = checkpoint.New(checkpoint.Config{Master: n.master, Poll: 10 * time.Millisecond})
	n.store = benchStore(b, n)
	n.cp.Attach(n.store)
	data := randomBytes(benchFileSize, 7)
	// Every file sealed gets a new path and token: b.Run calls each function more than once, and
	// a seal of a path and token the master knows would find that file, checkpointed already.

	writeThrough := func(n *node) func(b *testing.B) {
		return func(b *testing.B) {
			n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/now/u1", Strategy: datav1alpha1.CheckpointNone, SyncWriteThreshold: 1})
			b.SetBytes(benchFileSize)
			for range b.N {
				b.StopTimer()
				seed := n.nextID.Add(1)
				f := n.sealData("ns/now/u1", fmt.Sprintf("part-%d", seed), data, seed)
				sealed := checkpoint.SealedFile{Dataset: f.dataset, Path: f.path(), Token: f.token, Size: benchFileSize, Blocks: f.blocks}
				b.StartTimer()
				wrote, err := n.cp.WriteThrough(ctx, sealed)
				if err != nil || wrote == "" {
					b.Fatalf("wrote %v: %v", wrote, err)
				}
				n.cp.Published(ctx, sealed, wrote)
				b.StopTimer()
				n.drop(f)
				b.StartTimer()
			}
		}
	}
	b.Run("checkpoint", writeThrough(n))
	plain := newNodeWith(b, 4*benchFileSize, mastertest.Options{GRPC: true})
	plain.bs = benchBlockSize
	plain.cp = checkpoint.New(checkpoint.Config{Master: plain.master, Poll: 10 * time.Millisecond})
	plain.store = benchStore(b, plain)
	plain.cp.Attach(plain.store)
	b.Run("checkpoint, master in plaintext", writeThrough(plain))
	b.Run("PutObject from memory", func(b *testing.B) {
		b.SetBytes(benchFileSize)
		for i := range b.N {
			if _, err := n.minio.Client.PutObject(ctx, bucket, fmt.Sprintf("direct/part-%d", i), bytes.NewReader(data), benchFileSize,
				minio.PutObjectOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("checkpoint in the background, capped at 32 MiB/s", func(b *testing.B) {
		n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/later/u2", BandwidthLimit: 32 << 20})
		cleaned := make(chan struct{}, 1)
		n.cp.Attach(&cleaningStore{Store: n.store, cleaned: cleaned})
		defer n.cp.Attach(n.store)
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { n.cp.Run(runCtx); close(done) }()
		defer func() { cancel(); <-done }()
		b.SetBytes(benchFileSize)
		for range b.N {
			seed := n.nextID.Add(1)
			f := n.sealData("ns/later/u2", fmt.Sprintf("part-%d", seed), data, seed)
			n.cp.Published(ctx, checkpoint.SealedFile{Dataset: f.dataset, Path: f.path(), Token: f.token, Size: benchFileSize, Blocks: f.blocks}, "")
			for !n.checkpointed(f) {
				<-cleaned
			}
			b.StopTimer()
			n.drop(f)
			b.StartTimer()
		}
	})
}

// benchStore is a tier store whose MEM tier is on tmpfs, as in production, persisting through
// n's checkpointer.
func benchStore(b *testing.B, n *node) *tierstore.Store {
	b.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "strata-bench-checkpoint-")
	if err != nil {
		b.Logf("no /dev/shm (%v): the MEM tier is on disk, which this measures instead", err)
		dir = b.TempDir()
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	_ = n.store.Close()
	s, err := tierstore.Open(context.Background(), tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{dir}, Quota: 4 * benchFileSize}},
		IndexDir: filepath.Join(b.TempDir(), "index"), Persist: n.cp.Persist,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// drop removes a checkpointed file's blocks, to make room for the next.
func (n *node) drop(f file) {
	for _, id := range f.blocks {
		if err := n.store.Delete(context.Background(), id); err != nil {
			n.t.Fatal(err)
		}
	}
}

// BenchmarkCheckpointingSmallFilesOnABusyNode checkpoints 200 small files (4 KiB) of a step in
// the background, on a node whose tier store also holds 20,000 blocks of earlier outputs
// (clean: checkpointed before, or of a Dataset that is not): every look at the store lists
// them all, as on a node that ran a pipeline for a while. Reported as files checkpointed a
// second.
//
//	go test -run '^$' -bench CheckpointingSmallFilesOnABusyNode -benchtime 3x ./cacheworker/checkpoint/
func BenchmarkCheckpointingSmallFilesOnABusyNode(b *testing.B) {
	const held, files, size = 20000, 200, 4096
	ctx := context.Background()
	n := newNode(b, 1<<30)
	// The real clock, and no poll: only the files' wake starts the rounds.
	recorded := &recordingMaster{Master: n.master, recorded: make(chan struct{}, files)}
	n.cp = checkpoint.New(checkpoint.Config{Master: recorded, Poll: time.Hour})
	n.store = benchStore(b, n)
	n.cp.Attach(n.store)
	for i := range held {
		origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: fmt.Sprintf("%s/part-%05d", root("ns/old/u0"), i), Dataset: "ns/old/u0",
			Root: root("ns/old/u0"), FileToken: fmt.Sprintf("%032x", i)})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := n.store.Put(ctx, fmt.Sprintf("%032x-0", i), bytes.NewReader([]byte{1}), 1, tierstore.PutOptions{Origin: origin, Clean: true}); err != nil {
			b.Fatal(err)
		}
	}
	n.settings(n.endpoint(), checkpoint.Dataset{Name: "ns/new/u1"})
	n.run()
	data := randomBytes(size, 9)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		var written []file
		for range files {
			seed := n.nextID.Add(1) + held
			f, publish := n.storeFile("ns/new/u1", fmt.Sprintf("part-%d", seed), data, seed)
			n.publish(publish)
			written = append(written, f)
		}
		b.StartTimer()
		n.cp.Wake() // as the last file's seal does
		for range written {
			<-recorded.recorded
		}
		b.StopTimer()
		for _, f := range written {
			if !n.checkpointed(f) {
				b.Fatalf("%s recorded as checkpointed, but its blocks are not clean", f.path())
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.N*files)/b.Elapsed().Seconds(), "files/s")
}

// cleaningStore wakes a waiter on cleaned each time the checkpointer marked a block clean (a
// send that finds the channel full is dropped: the waiter has a wake-up pending already, and
// looks at every block when it wakes).
type cleaningStore struct {
	*tierstore.Store
	cleaned chan struct{}
}

func (s *cleaningStore) SetClean(ctx context.Context, id string) error {
	err := s.Store.SetClean(ctx, id)
	select {
	case s.cleaned <- struct{}{}:
	default:
	}
	return err
}

// recordingMaster says on recorded each checkpoint the master recorded.
type recordingMaster struct {
	checkpoint.Master
	recorded chan struct{}
}

func (m *recordingMaster) CheckpointFile(ctx context.Context, req *masterpb.CheckpointFileRequest) (*masterpb.File, error) {
	f, err := m.Master.CheckpointFile(ctx, req)
	if err == nil {
		m.recorded <- struct{}{}
	}
	return f, err
}
