package outputfs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"
	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestLargeFilesAreWrittenThroughAndLostBlocksReadBack runs two nodes' output mounts with real
// checkpointers, a real master and a real MinIO: a file above the Dataset's syncWriteThreshold
// is in MinIO when its writer's close returns, a smaller one is not; and once the writer's node
// holds the large file no more, the other node reads it back from its checkpoint.
func TestLargeFilesAreWrittenThroughAndLostBlocksReadBack(t *testing.T) {
	fusetest.Require(t)
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	s3 := miniotest.Start(t)
	s3.MakeBucket(t, "outputs")
	raw, err := json.Marshal(checkpoint.File{Datasets: []checkpoint.Dataset{{
		Name: dataset, Root: root, Strategy: datav1alpha1.CheckpointNone, SyncWriteThreshold: 2 * blockSize,
		Target: checkpoint.Target{URI: "s3://outputs/features", Endpoint: "http://" + s3.Endpoint, Credentials: map[string]string{
			understore.CredentialAccessKeyID: miniotest.AccessKey, understore.CredentialSecretAccessKey: miniotest.SecretKey}},
	}}})
	g.Expect(err).NotTo(HaveOccurred())
	settings, err := checkpoint.Parse(raw)
	g.Expect(err).NotTo(HaveOccurred())
	withCheckpoints := func(w *worker) *worker {
		cp := checkpoint.New(checkpoint.Config{Master: master, Stored: w.dir.Enqueue, Log: testr.New(t)})
		cp.Attach(w.store)
		cp.Apply(settings)
		w.cp = cp
		return w
	}
	writer := withCheckpoints(startWorker(t, master, "writer", 64<<20))
	reader := withCheckpoints(startWorker(t, master, "reader", 64<<20))
	written := mountOutput(t, master, writer)
	read := mountOutput(t, master, reader)
	object := func(key string) []byte {
		obj, err := s3.Client.GetObject(ctx, "outputs", key, minio.GetObjectOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = obj.Close() }()
		data, err := io.ReadAll(obj)
		if err != nil {
			return nil // no such object
		}
		return data
	}

	large, small := randomBytes(3*blockSize+123, 1), randomBytes(blockSize, 2)
	g.Expect(os.MkdirAll(filepath.Join(written.Dir(), "part"), 0o755)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(written.Dir(), "part", "large.bin"), large, 0o644)).To(Succeed())
	g.Expect(object("features/part/large.bin")).To(Equal(large), "in MinIO when close returned, under its path")
	g.Expect(os.WriteFile(filepath.Join(written.Dir(), "small.bin"), small, 0o644)).To(Succeed())
	g.Expect(object("features/small.bin")).To(BeNil(), "below the threshold: left to the background")
	f, err := master.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/part/large.bin"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.GetCheckpointState()).To(Equal(masterpb.CheckpointState_CHECKPOINT_STATE_DONE))
	g.Expect(f.GetCheckpointUri()).To(Equal("s3://outputs/features/part/large.bin"))

	// The writer's node no longer holds the file (as when memory dropped it once checkpointed):
	// the other node reads it from MinIO, and keeps its blocks.
	for index := int64(0); index*blockSize < int64(len(large)); index++ {
		g.Expect(writer.store.Delete(ctx, blockindex.OutputBlockID(f.GetClientToken(), index))).To(Succeed())
	}
	got, err := os.ReadFile(filepath.Join(read.Dir(), "part", "large.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bytes.Equal(got, large)).To(BeTrue(), "read back whole from its checkpoint")
	info, err := reader.store.Info(blockindex.OutputBlockID(f.GetClientToken(), 3))
	g.Expect(err).NotTo(HaveOccurred(), "a block read back is kept by the node that read it")
	g.Expect(info.Clean).To(BeTrue())

	// A file with no checkpoint whose blocks are gone cannot be read: it is recomputed.
	sf, err := master.GetFile(ctx, &masterpb.GetFileRequest{Path: root + "/small.bin"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(writer.store.Delete(ctx, blockindex.OutputBlockID(sf.GetClientToken(), 0))).To(Succeed())
	_, err = os.ReadFile(filepath.Join(read.Dir(), "small.bin"))
	g.Expect(err).To(MatchError(ContainSubstring("input/output error")))
}
