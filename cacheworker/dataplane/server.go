package dataplane

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// ChunkSize is the size of the data messages of a stream: large enough that per-message costs
// vanish, well under gRPC's default 4 MiB message limit.
const ChunkSize = 1 << 20

// MaxBlockSize bounds a written block when the server is given no block size; the API caps a
// TierPool's block size at 1 GiB.
const MaxBlockSize = 1 << 30

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// BlockStore is the worker's tier store, as the data plane uses it.
type BlockStore interface {
	OpenBlock(ctx context.Context, id string) (*os.File, tierstore.BlockInfo, error)
	Put(ctx context.Context, id string, r io.Reader, size int64, opts tierstore.PutOptions) (tierstore.BlockInfo, error)
	Info(id string) (tierstore.BlockInfo, error)
	Delete(ctx context.Context, id string) error
}

// StoredFunc is told of every block a client wrote, once it is committed, so that the worker can
// report it to the master.
type StoredFunc func(ctx context.Context, info tierstore.BlockInfo)

// Server serves the worker's blocks over gRPC.
type Server struct {
	workerpb.UnimplementedWorkerServer

	store  BlockStore
	stored StoredFunc
	// maxBlock bounds what a write may reserve before its first byte arrives.
	maxBlock int64
	writes   keyedMutex
	m        *Metrics
	log      logr.Logger
	// listings, if set, are the listings this worker keeps, which GetListing serves.
	listings *listings.Store
	// mounted says whether this worker mounts a Dataset now (ServeListings).
	mounted func(uid string) bool
}

// NewServer returns a server over store that takes blocks of up to maxBlock bytes (the pool's
// block size; MaxBlockSize when 0). stored may be nil; m may be nil (counts unregistered).
func NewServer(store BlockStore, stored StoredFunc, maxBlock int64, m *Metrics, log logr.Logger) *Server {
	if maxBlock <= 0 || maxBlock > MaxBlockSize {
		maxBlock = MaxBlockSize
	}
	if m == nil {
		m = newUnregisteredMetrics()
	}
	if stored == nil {
		stored = func(context.Context, tierstore.BlockInfo) {}
	}
	return &Server{store: store, stored: stored, maxBlock: maxBlock, m: m, log: log}
}

// ReadBlock streams a range of a block from the local tiers. A whole-block read is checked
// against the block's CRC-32C as it is sent: a block that fails the check ends the stream with
// DATA_LOSS before its last bytes, so a client never takes corrupt data for good data.
func (s *Server) ReadBlock(req *workerpb.ReadBlockRequest, stream workerpb.Worker_ReadBlockServer) error {
	ctx := stream.Context()
	f, info, err := s.store.OpenBlock(ctx, req.GetBlockId())
	if err != nil {
		return s.m.done("ReadBlock", storeStatus("reading block", req.GetBlockId(), err))
	}
	defer func() { _ = f.Close() }()

	off, length := req.GetOffset(), req.GetLength()
	if length == 0 {
		length = info.Size - off
	}
	if off < 0 || length < 0 || off+length > info.Size {
		return s.m.done("ReadBlock", status.Errorf(codes.OutOfRange,
			"block %s has %d bytes: range [%d, %d) is outside it", info.ID, info.Size, off, off+length))
	}
	whole := off == 0 && length == info.Size
	header := &workerpb.BlockHeader{BlockId: info.ID, Size: info.Size, Crc32C: info.Checksum, Tier: info.Tier}
	if err := stream.Send(&workerpb.ReadBlockResponse{Header: header}); err != nil {
		return s.m.done("ReadBlock", err)
	}

	buf := make([]byte, min(ChunkSize, max(length, 1)))
	var crc uint32
	for sent := int64(0); sent < length; {
		n := int(min(int64(len(buf)), length-sent))
		if _, err := f.ReadAt(buf[:n], off+sent); err != nil {
			return s.m.done("ReadBlock", status.Errorf(codes.Internal, "reading block %s at %d: %v", info.ID, off+sent, err))
		}
		if whole {
			crc = crc32.Update(crc, castagnoli, buf[:n])
			if sent+int64(n) == length && crc != info.Checksum {
				s.log.Error(nil, "block failed its checksum while being served; removing it so that it is fetched again",
					"block", info.ID, "tier", info.Tier, "crc32c", crc, "expected", info.Checksum)
				if err := s.store.Delete(ctx, info.ID); err != nil && !errors.Is(err, tierstore.ErrNotFound) {
					s.log.Error(err, "removing a corrupt block", "block", info.ID)
				}
				return s.m.done("ReadBlock", status.Errorf(codes.DataLoss,
					"block %s in tier %s: crc32c %08x, expected %08x", info.ID, info.Tier, crc, info.Checksum))
			}
		}
		if err := stream.Send(&workerpb.ReadBlockResponse{Data: buf[:n]}); err != nil {
			return s.m.done("ReadBlock", err)
		}
		sent += int64(n)
		s.m.sent.Add(float64(n))
	}
	return s.m.done("ReadBlock", nil)
}

// WriteBlock stores a streamed block of at most the pool's block size. The data is checked against the header's size and
// CRC-32C before the tier store commits it: a stream that ends early, runs long or carries other
// bytes stores nothing.
func (s *Server) WriteBlock(stream workerpb.Worker_WriteBlockServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return s.m.done("WriteBlock", err)
	}
	h := first.GetHeader()
	switch {
	case h == nil:
		return s.m.done("WriteBlock", status.Error(codes.InvalidArgument, "the first message of a block write must be its header"))
	case h.GetSize() < 0 || h.GetSize() > s.maxBlock:
		return s.m.done("WriteBlock", status.Errorf(codes.InvalidArgument,
			"block %s: size %d is outside [0, %d], the pool's block size", h.GetBlockId(), h.GetSize(), s.maxBlock))
	}
	if err := blockindex.ValidateID(h.GetBlockId()); err != nil {
		return s.m.done("WriteBlock", status.Error(codes.InvalidArgument, err.Error()))
	}
	defer s.writes.lock(h.GetBlockId())()
	if info, err := s.store.Info(h.GetBlockId()); err == nil {
		return s.m.done("WriteBlock", s.existing(stream, h, info))
	}
	var origin []byte
	if h.GetOrigin() != nil {
		if origin, err = proto.Marshal(h.GetOrigin()); err != nil {
			return s.m.done("WriteBlock", status.Errorf(codes.InvalidArgument, "block %s: origin: %v", h.GetBlockId(), err))
		}
	}
	body := &streamReader{stream: stream, id: h.GetBlockId(), size: h.GetSize(), want: h.GetCrc32C()}
	// A copy written by a peer is neither clean nor pinned here: the worker's policies pin it,
	// and it is clean only once a checkpoint or the under-store is known to hold it.
	info, err := s.store.Put(ctx, h.GetBlockId(), body, h.GetSize(), tierstore.PutOptions{Origin: origin})
	if err != nil {
		var st interface{ GRPCStatus() *status.Status }
		if errors.As(err, &st) {
			return s.m.done("WriteBlock", st.GRPCStatus().Err())
		}
		return s.m.done("WriteBlock", storeStatus("writing block", h.GetBlockId(), err))
	}
	s.m.received.Add(float64(info.Size))
	s.stored(ctx, info)
	return s.m.done("WriteBlock", stream.SendAndClose(&workerpb.WriteBlockResponse{Block: headerOf(info)}))
}

// existing answers a write of a block the store already has: success if it is the same block.
func (s *Server) existing(stream workerpb.Worker_WriteBlockServer, h *workerpb.WriteBlockHeader, info tierstore.BlockInfo) error {
	if info.Size != h.GetSize() || info.Checksum != h.GetCrc32C() {
		return status.Errorf(codes.AlreadyExists,
			"block %s is stored with %d bytes and crc32c %08x, not %d bytes and %08x",
			info.ID, info.Size, info.Checksum, h.GetSize(), h.GetCrc32C())
	}
	return stream.SendAndClose(&workerpb.WriteBlockResponse{Block: headerOf(info)})
}

func headerOf(info tierstore.BlockInfo) *workerpb.BlockHeader {
	return &workerpb.BlockHeader{BlockId: info.ID, Size: info.Size, Crc32C: info.Checksum, Tier: info.Tier}
}

// streamReader reads a block's data messages. It returns its last bytes only once it has
// checked the checksum and that the stream ends there, so the tier store (which commits after
// reading exactly size bytes) never commits a block that does not match its header.
type streamReader struct {
	stream workerpb.Worker_WriteBlockServer
	id     string
	size   int64
	want   uint32

	pending []byte
	read    int64
	crc     uint32
}

func (r *streamReader) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		if r.read == r.size {
			return 0, io.EOF
		}
		msg, err := r.stream.Recv()
		if errors.Is(err, io.EOF) {
			return 0, status.Errorf(codes.InvalidArgument, "block %s: the stream ended after %d of %d bytes", r.id, r.read, r.size)
		}
		if err != nil {
			return 0, fmt.Errorf("receiving block %s: %w", r.id, err)
		}
		if msg.GetHeader() != nil {
			return 0, status.Errorf(codes.InvalidArgument, "block %s: a second header in the stream", r.id)
		}
		data := msg.GetData()
		if r.read+int64(len(data)) > r.size {
			return 0, status.Errorf(codes.InvalidArgument, "block %s: the stream carries more than the %d bytes of its header", r.id, r.size)
		}
		r.pending = data
		r.read += int64(len(data))
		r.crc = crc32.Update(r.crc, castagnoli, data)
		if r.read == r.size {
			if err := r.finish(); err != nil {
				return 0, err
			}
		}
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// finish checks the whole block once its last bytes have arrived.
func (r *streamReader) finish() error {
	if r.crc != r.want {
		return status.Errorf(codes.DataLoss, "block %s: received bytes have crc32c %08x, the header says %08x", r.id, r.crc, r.want)
	}
	if _, err := r.stream.Recv(); !errors.Is(err, io.EOF) {
		if err != nil {
			return fmt.Errorf("receiving block %s: %w", r.id, err)
		}
		return status.Errorf(codes.InvalidArgument, "block %s: the stream carries more than the %d bytes of its header", r.id, r.size)
	}
	return nil
}

// storeStatus turns a tier-store error into a gRPC status that says what to do.
func storeStatus(what, id string, err error) error {
	msg := fmt.Sprintf("%s %s: %v", what, id, err)
	switch {
	case errors.Is(err, tierstore.ErrNotFound):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, blockindex.ErrInvalidID):
		return status.Error(codes.InvalidArgument, msg)
	case errors.Is(err, tierstore.ErrTierFull):
		return status.Error(codes.ResourceExhausted, msg)
	case errors.Is(err, tierstore.ErrExists):
		return status.Error(codes.AlreadyExists, msg)
	case errors.Is(err, tierstore.ErrClosed):
		return status.Error(codes.Unavailable, msg)
	case errors.Is(err, tierstore.ErrCorrupt):
		return status.Error(codes.DataLoss, msg)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, msg)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msg)
	}
	return status.Error(codes.Internal, msg)
}
