package locations_test

import (
	"bytes"
	"context"
	"hash/crc32"
	"net"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc"

	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/masterpb"
)

// liar is a worker that serves other bytes than the block asked for, with a header whose
// CRC-32C matches them: its own word vouches for what it sends.
type liar struct {
	workerpb.UnimplementedWorkerServer
	bytes []byte
}

func (l *liar) ReadBlock(req *workerpb.ReadBlockRequest, stream workerpb.Worker_ReadBlockServer) error {
	crc := crc32.Checksum(l.bytes, crc32.MakeTable(crc32.Castagnoli))
	if err := stream.Send(&workerpb.ReadBlockResponse{Header: &workerpb.BlockHeader{
		BlockId: req.GetBlockId(), Size: int64(len(l.bytes)), Crc32C: crc, Tier: "mem",
	}}); err != nil {
		return err
	}
	return stream.Send(&workerpb.ReadBlockResponse{Data: l.bytes})
}

// TestACopyThatIsNotTheRecordedBlockIsRefused: a worker that tells the master it holds a block
// and serves other bytes plants nothing; the reader checks the copy against the checksum the
// master recorded when the block was first committed, and reads the under-store instead.
func TestACopyThatIsNotTheRecordedBlockIsRefused(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	content := bytes.Repeat([]byte("strata honest bytes "), 2*blockSize/20+3)
	master, _, a, b := startPeers(t, content)
	_, err := a.cache.ReadBlock(ctx, "train.bin", "", -1, 0)
	g.Expect(err).NotTo(HaveOccurred())
	id := cache.BlockID("uid-1", "train.bin", "", 0)
	g.Eventually(func() ([]string, error) { return holders(ctx, master, id) }).WithTimeout(10*time.Second).
		Should(ConsistOf("pool/a"), "the master learns that worker a holds the block")

	// The liar registers and claims the block, with the checksum the master recorded.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	srv := grpc.NewServer()
	planted := bytes.Repeat([]byte("planted "), blockSize/8)
	workerpb.RegisterWorkerServer(srv, &liar{bytes: planted})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	_, err = master.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: "pool/liar", Address: lis.Addr().String(), Node: "node-liar"})
	g.Expect(err).NotTo(HaveOccurred())
	locs, err := master.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{BlockIds: []uint64{locations.MasterBlockID(id)}})
	g.Expect(err).NotTo(HaveOccurred())
	rec := locs.GetBlocks()[0]
	_, err = master.CommitBlock(ctx, &masterpb.CommitBlockRequest{BlockId: rec.GetId(), Path: rec.GetPath(), Offset: rec.GetOffset(),
		Size: rec.GetSize(), Checksum: rec.GetChecksum(), Worker: "pool/liar", Tier: "mem"})
	g.Expect(err).NotTo(HaveOccurred())

	// With worker a gone, the liar is the only peer that claims the block.
	a.srv.Stop()
	got, err := b.cache.ReadBlock(ctx, "train.bin", "", -1, 0)
	g.Expect(err).NotTo(HaveOccurred(), "a reader never fails because a peer lies")
	g.Expect(bytes.Equal(got, content[:blockSize])).To(BeTrue(), "worker b took the liar's bytes for the block")
	g.Expect(b.source.reads.Load()).To(BeNumerically(">", 0), "the block came from the under-store")
}
