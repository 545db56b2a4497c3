package dataplane

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// worker is a real tier store served by a real gRPC server on loopback.
type worker struct {
	store  *tierstore.Store
	addr   string
	stored chan tierstore.BlockInfo
}

// testBlockSize is the pool block size of the test workers.
const testBlockSize = 8 << 20

func startWorker(t *testing.T, quota int64) *worker {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	store, err := tierstore.Open(ctx, tierstore.Config{
		Tiers: []tierstore.Tier{{
			Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(dir, "mem")},
			Quota: quota, High: 0.9, Low: 0.7,
		}},
		IndexDir: filepath.Join(dir, "index"),
	})
	if err != nil {
		t.Fatalf("opening the tier store: %v", err)
	}
	w := &worker{store: store, stored: make(chan tierstore.BlockInfo, 16)}
	srv := grpc.NewServer()
	workerpb.RegisterWorkerServer(srv, NewServer(store, func(_ context.Context, info tierstore.BlockInfo) {
		w.stored <- info
	}, testBlockSize, nil, logr.Discard()))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening: %v", err)
	}
	w.addr = lis.Addr().String()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		_ = store.Close()
	})
	return w
}

func payload(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func newPeers(t testing.TB) *Peers {
	p := NewPeers()
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestWriteThenReadAcrossTheNetwork(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	w := startWorker(t, 64<<20)
	peers := newPeers(t)
	// Larger than a chunk and not a multiple of it, so the stream has a short last message.
	data := payload(3*ChunkSize+12345, 1)
	origin := &workerpb.BlockOrigin{Path: "/datasets/ns/d/part-0", Dataset: "ns/d", Index: 2, Offset: 2 * 4 << 20}

	hdr, err := peers.WriteBlock(ctx, w.addr, &workerpb.WriteBlockHeader{BlockId: "b-1", Origin: origin}, data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(hdr.GetSize()).To(Equal(int64(len(data))))
	g.Expect(hdr.GetTier()).To(Equal("mem"))
	g.Expect(hdr.GetCrc32C()).To(Equal(crc32.Checksum(data, castagnoli)))

	got, rh, err := peers.ReadBlock(ctx, w.addr, "b-1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bytes.Equal(got, data)).To(BeTrue(), "the block read back differs from the one written")
	g.Expect(rh.GetCrc32C()).To(Equal(hdr.GetCrc32C()))

	info, err := w.store.Info("b-1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Clean).To(BeFalse(), "a block written with clean=false must be kept durable until persisted")
	var stored workerpb.BlockOrigin
	g.Expect(proto.Unmarshal(info.Origin, &stored)).To(Succeed())
	g.Expect(proto.Equal(&stored, origin)).To(BeTrue(), "the origin kept in the index differs: %v", &stored)
	g.Expect(<-w.stored).To(HaveField("ID", "b-1"), "the stored callback must be told of the write")
}

func TestReadRange(t *testing.T) {
	ctx := context.Background()
	w := startWorker(t, 64<<20)
	data := payload(2*ChunkSize+7, 2)
	if _, err := newPeers(t).WriteBlock(ctx, w.addr, &workerpb.WriteBlockHeader{BlockId: "r"}, data); err != nil {
		t.Fatal(err)
	}
	stub := rawClient(t, w.addr)
	cases := map[string]struct {
		off, length int64
		want        []byte
		code        codes.Code
	}{
		"a range inside one chunk":             {off: 10, length: 100, want: data[10:110]},
		"a range across chunks":                {off: ChunkSize - 5, length: ChunkSize + 10, want: data[ChunkSize-5 : 2*ChunkSize+5]},
		"length zero reads to the end":         {off: 2 * ChunkSize, want: data[2*ChunkSize:]},
		"a range past the end is out of range": {off: int64(len(data)) - 1, length: 2, code: codes.OutOfRange},
		"a negative offset is out of range":    {off: -1, length: 2, code: codes.OutOfRange},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			stream, err := stub.ReadBlock(ctx, &workerpb.ReadBlockRequest{BlockId: "r", Offset: tc.off, Length: tc.length})
			g.Expect(err).NotTo(HaveOccurred())
			got, err := drain(stream)
			if tc.code != codes.OK {
				g.Expect(status.Code(err)).To(Equal(tc.code), "error: %v", err)
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(bytes.Equal(got, tc.want)).To(BeTrue(), "got %d bytes, want %d", len(got), len(tc.want))
		})
	}
}

func TestReadOfAnAbsentBlockIsNotFound(t *testing.T) {
	w := startWorker(t, 1<<20)
	_, _, err := newPeers(t).ReadBlock(context.Background(), w.addr, "nope")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("got %v, want ErrNotFound", err)
	}
}

func TestBadWritesStoreNothing(t *testing.T) {
	data := payload(ChunkSize+100, 3)
	sum := crc32.Checksum(data, castagnoli)
	header := func(id string, size int64, crc uint32) *workerpb.WriteBlockRequest {
		return &workerpb.WriteBlockRequest{Part: &workerpb.WriteBlockRequest_Header{
			Header: &workerpb.WriteBlockHeader{BlockId: id, Size: size, Crc32C: crc}}}
	}
	chunk := func(b []byte) *workerpb.WriteBlockRequest {
		return &workerpb.WriteBlockRequest{Part: &workerpb.WriteBlockRequest_Data{Data: b}}
	}
	cases := map[string]struct {
		id   string
		msgs []*workerpb.WriteBlockRequest
		code codes.Code
		// msg, when set, is part of the refusal: it tells a refusal of the header from one of
		// a stream that ends early.
		msg string
	}{
		"bytes that do not match the checksum": {
			id: "crc", msgs: []*workerpb.WriteBlockRequest{header("crc", int64(len(data)), sum+1), chunk(data)}, code: codes.DataLoss,
		},
		"a stream that ends early": {
			id: "short", msgs: []*workerpb.WriteBlockRequest{header("short", int64(len(data)), sum), chunk(data[:100])}, code: codes.InvalidArgument,
		},
		"a stream longer than its header": {
			id: "long", msgs: []*workerpb.WriteBlockRequest{header("long", 100, crc32.Checksum(data[:100], castagnoli)), chunk(data[:100]), chunk(data[100:200])},
			code: codes.InvalidArgument,
		},
		"a chunk that overruns the size": {
			id: "over", msgs: []*workerpb.WriteBlockRequest{header("over", 100, sum), chunk(data[:200])}, code: codes.InvalidArgument,
		},
		"data before the header": {id: "nohdr", msgs: []*workerpb.WriteBlockRequest{chunk(data[:10])}, code: codes.InvalidArgument},
		"a block id that is a path": {
			id: "../x", msgs: []*workerpb.WriteBlockRequest{header("../x", 10, 0)}, code: codes.InvalidArgument,
		},
		"a block larger than the pool's block size, which would reserve space before any byte": {
			id: "big", msgs: []*workerpb.WriteBlockRequest{header("big", testBlockSize+1, 0)}, code: codes.InvalidArgument,
			msg: "the pool's block size",
		},
		"a block larger than any tier allows": {
			id: "huge", msgs: []*workerpb.WriteBlockRequest{header("huge", MaxBlockSize+1, 0)}, code: codes.InvalidArgument,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			w := startWorker(t, 64<<20)
			stream, err := rawClient(t, w.addr).WriteBlock(context.Background())
			g.Expect(err).NotTo(HaveOccurred())
			for _, m := range tc.msgs {
				if stream.Send(m) != nil {
					break // the server has answered; CloseAndRecv says how
				}
			}
			_, err = stream.CloseAndRecv()
			g.Expect(status.Code(err)).To(Equal(tc.code), "error: %v", err)
			g.Expect(status.Convert(err).Message()).To(ContainSubstring(tc.msg))
			_, err = w.store.Info(tc.id)
			g.Expect(err).To(MatchError(tierstore.ErrNotFound), "a bad write must store nothing")
			g.Expect(w.store.Stats()[0].Used).To(BeZero(), "a bad write must leave no space reserved")
		})
	}
}

func TestRewritingABlock(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	w := startWorker(t, 64<<20)
	peers := newPeers(t)
	data := payload(1000, 4)
	_, err := peers.WriteBlock(ctx, w.addr, &workerpb.WriteBlockHeader{BlockId: "same"}, data)
	g.Expect(err).NotTo(HaveOccurred())

	_, err = peers.WriteBlock(ctx, w.addr, &workerpb.WriteBlockHeader{BlockId: "same"}, data)
	g.Expect(err).NotTo(HaveOccurred(), "writing the same block again must succeed (retries are harmless)")

	_, err = peers.WriteBlock(ctx, w.addr, &workerpb.WriteBlockHeader{BlockId: "same"}, payload(1000, 5))
	g.Expect(status.Code(err)).To(Equal(codes.AlreadyExists), "error: %v", err)
}

func TestConcurrentWritesOfOneBlockStoreItOnce(t *testing.T) {
	g := NewWithT(t)
	w := startWorker(t, 64<<20)
	peers := newPeers(t)
	data := payload(2*ChunkSize, 6)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := peers.WriteBlock(context.Background(), w.addr, &workerpb.WriteBlockHeader{BlockId: "hot"}, data)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(w.store.Stats()[0].Used).To(Equal(int64(len(data))), "one copy, however many writers")
}

func TestACorruptBlockIsNeverServed(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	w := startWorker(t, 64<<20)
	peers := newPeers(t)
	data := payload(ChunkSize+10, 7)
	_, err := peers.WriteBlock(ctx, w.addr, &workerpb.WriteBlockHeader{BlockId: "rot"}, data)
	g.Expect(err).NotTo(HaveOccurred())
	info, err := w.store.Info("rot")
	g.Expect(err).NotTo(HaveOccurred())

	// Flip one byte of the block's file, as a bad disk or a stray write would.
	f, err := os.OpenFile(filepath.Join(info.Dir, info.ID), os.O_RDWR, 0)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = f.WriteAt([]byte{data[ChunkSize+3] ^ 0xff}, ChunkSize+3)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.Close()).To(Succeed())

	_, _, err = peers.ReadBlock(ctx, w.addr, "rot")
	g.Expect(status.Code(err)).To(Equal(codes.DataLoss), "error: %v", err)
	_, err = w.store.Info("rot")
	g.Expect(err).To(MatchError(tierstore.ErrNotFound), "a corrupt block is removed so that it is fetched again")
}

func TestAFullTierIsResourceExhausted(t *testing.T) {
	w := startWorker(t, 1000)
	_, err := newPeers(t).WriteBlock(context.Background(), w.addr, &workerpb.WriteBlockHeader{BlockId: "big"}, payload(2000, 8))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want RESOURCE_EXHAUSTED", err)
	}
}

func rawClient(t *testing.T, addr string) workerpb.WorkerClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return workerpb.NewWorkerClient(conn)
}

func drain(stream workerpb.Worker_ReadBlockClient) ([]byte, error) {
	var out []byte
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		out = append(out, msg.GetData()...)
	}
}

// TestAPeerThatNeverAnswersIsGivenUp: a worker whose node stopped drops every packet; a block
// read from it ends with ErrNoAnswer once the answer timeout passes, so that the reader tries
// another copy, instead of waiting for TCP to give up. Here the peer accepts connections and
// never says a word.
func TestAPeerThatNeverAnswersIsGivenUp(t *testing.T) {
	g := NewWithT(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	var mu sync.Mutex
	var silent []net.Conn
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			silent = append(silent, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range silent {
			_ = c.Close()
		}
	})
	p := newPeers(t).WithAnswerTimeout(100 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, _, err := p.ReadBlock(context.Background(), lis.Addr().String(), "b1")
		done <- err
	}()
	var got error
	g.Eventually(done, "20s").Should(Receive(&got), "the read ends although the peer never answers")
	g.Expect(got).To(MatchError(ErrNoAnswer))

	// The next read does not wait for it again (it would wait an hour): the peer is taken for
	// gone for a while.
	p.WithAnswerTimeout(time.Hour)
	go func() {
		_, _, err := p.ReadBlock(context.Background(), lis.Addr().String(), "b2")
		done <- err
	}()
	g.Eventually(done, "20s").Should(Receive(&got), "a peer that just stayed silent is not asked again")
	g.Expect(got).To(MatchError(ErrNoAnswer))

	// A caller that gives up is told so, not that the peer is silent.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = newPeers(t).ReadBlock(ctx, lis.Addr().String(), "b1")
	g.Expect(err).NotTo(MatchError(ErrNoAnswer))
	g.Expect(err).To(HaveOccurred())
}
