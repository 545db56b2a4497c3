package dataplane

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// ErrNotFound is returned when a peer does not hold the block asked for.
var ErrNotFound = errors.New("block not on that worker")

// ErrClosed is returned once the client is closed.
var ErrClosed = errors.New("data-plane client closed")

// ErrNoAnswer is returned when a peer does not start sending a block within the answer timeout.
var ErrNoAnswer = errors.New("the worker did not answer in time")

// DefaultAnswerTimeout is how long a block read waits for a peer's first message. A worker
// whose node stopped never answers, and never refuses either: its packets are dropped, so a
// connection to it takes the kernel's SYN retries (about 30 s), or a stream over a connection
// made before hangs until TCP gives up. The reader has other copies to try (another holder, the
// checkpoint), so it gives up on one that does not answer quickly; a live worker sends a
// block's header as soon as it opened the block.
const DefaultAnswerTimeout = 5 * time.Second

// silentFor is how long a peer that did not answer a block read is taken for gone: reads in the
// meantime go to other copies at once instead of each waiting out the answer timeout. A worker
// that comes back is asked again after that.
const silentFor = 30 * time.Second

// Peers is a client of other workers' data planes, keeping one connection per address.
type Peers struct {
	dialOpts []grpc.DialOption
	// answerTimeout bounds the wait for a block read's first message.
	answerTimeout time.Duration

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
	// silentUntil holds, by address, until when a peer that did not answer is not asked.
	silentUntil map[string]time.Time
}

// NewPeers returns a client. With no options it dials without transport security, as the
// master client does; the data plane runs inside the cluster's pod network.
func NewPeers(opts ...grpc.DialOption) *Peers {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return &Peers{dialOpts: opts, conns: map[string]*grpc.ClientConn{}, answerTimeout: DefaultAnswerTimeout, silentUntil: map[string]time.Time{}}
}

// WithAnswerTimeout sets how long a block read waits for a peer's first message (see
// DefaultAnswerTimeout), and returns p.
func (p *Peers) WithAnswerTimeout(d time.Duration) *Peers {
	p.answerTimeout = d
	return p
}

// Close closes every connection.
func (p *Peers) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	for addr, c := range p.conns {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the connection to %s: %w", addr, err))
		}
	}
	clear(p.conns)
	return errors.Join(errs...)
}

func (p *Peers) stub(addr string) (workerpb.WorkerClient, error) {
	c, err := p.conn(addr)
	if err != nil {
		return nil, err
	}
	return workerpb.NewWorkerClient(c), nil
}

// silent says whether the worker at addr did not answer a block read within the last silentFor.
func (p *Peers) silent(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.silentUntil[addr]
	if ok && !time.Now().Before(until) {
		delete(p.silentUntil, addr)
		return false
	}
	return ok
}

func (p *Peers) markSilent(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.silentUntil[addr] = time.Now().Add(silentFor)
}

// conn is the connection to the worker at addr, made at first use.
func (p *Peers) conn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	c, ok := p.conns[addr]
	if !ok {
		var err error
		if c, err = grpc.NewClient(addr, p.dialOpts...); err != nil {
			p.mu.Unlock()
			return nil, fmt.Errorf("connecting to worker %s: %w", addr, err)
		}
		p.conns[addr] = c
	}
	p.mu.Unlock()
	redialIfFailed(c)
	return c, nil
}

// redialWait bounds the wait for a failed connection to start its new dial.
const redialWait = time.Second

// redialIfFailed starts a new dial of c at once if its last one failed. Otherwise gRPC fails
// every call until its backoff runs out (up to two minutes after repeated failures), even once
// the worker is back: a restarted worker keeps its node's address. A call is worth a new dial,
// which fails as fast as the last one if the worker is still gone; a peer that does not answer
// at all is passed over by its reader (silentUntil) rather than dialled at each read.
func redialIfFailed(c *grpc.ClientConn) {
	if c.GetState() != connectivity.TransientFailure {
		return
	}
	c.ResetConnectBackoff()
	// The reset takes effect asynchronously; a call made before then would still fail at once.
	ctx, cancel := context.WithTimeout(context.Background(), redialWait)
	defer cancel()
	c.WaitForStateChange(ctx, connectivity.TransientFailure)
}

// SyncDataset asks the worker at addr to sync its mount of Dataset uid with the source, or,
// with listingFrom (another worker's address), with the listing that worker took: the
// operator's call (DatasetSync), over the same connections.
func (p *Peers) SyncDataset(ctx context.Context, addr, uid, listingFrom string) (*workerpb.SyncDatasetResponse, error) {
	c, err := p.conn(addr)
	if err != nil {
		return nil, err
	}
	return workerpb.NewDatasetSyncClient(c).SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid, ListingFrom: listingFrom})
}

// ForgetDataset tells the worker at addr that Dataset uid is deleted, so that it drops the
// listing it keeps of it: the operator's call (DatasetSync).
func (p *Peers) ForgetDataset(ctx context.Context, addr, uid string) error {
	c, err := p.conn(addr)
	if err != nil {
		return err
	}
	_, err = workerpb.NewDatasetSyncClient(c).SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: uid, Forget: true})
	return err
}

// DescribeDataset asks the worker at addr what its mount of Dataset uid shows, and, with a
// selection, how much of the selected files it holds: the operator's call (DatasetSync), over
// the same connections.
func (p *Peers) DescribeDataset(ctx context.Context, addr, uid string, selection *workerpb.Selection) (*workerpb.DescribeDatasetResponse, error) {
	c, err := p.conn(addr)
	if err != nil {
		return nil, err
	}
	return workerpb.NewDatasetSyncClient(c).DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: uid, Selection: selection})
}

// ReadBlock reads a whole block from the worker at addr and checks it against its CRC-32C. It
// fails with ErrNotFound when that worker does not hold the block.
func (p *Peers) ReadBlock(ctx context.Context, addr, id string) ([]byte, *workerpb.BlockHeader, error) {
	if p.silent(addr) {
		return nil, nil, fmt.Errorf("reading block %s from %s: %w recently", id, addr, ErrNoAnswer)
	}
	stub, err := p.stub(addr)
	if err != nil {
		return nil, nil, err
	}
	caller := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream if we stop reading early
	// Only the first message is bounded: a block being sent takes as long as it takes.
	silent := time.AfterFunc(p.answerTimeout, cancel)
	stream, err := stub.ReadBlock(ctx, &workerpb.ReadBlockRequest{BlockId: id})
	var first *workerpb.ReadBlockResponse
	if err == nil {
		first, err = stream.Recv()
	}
	if !silent.Stop() && caller.Err() == nil {
		p.markSilent(addr)
		return nil, nil, fmt.Errorf("reading block %s from %s: %w within %s", id, addr, ErrNoAnswer, p.answerTimeout)
	}
	if err != nil {
		return nil, nil, clientError("reading block", id, addr, err)
	}
	h := first.GetHeader()
	if h == nil || h.GetSize() < 0 || h.GetSize() > MaxBlockSize {
		return nil, nil, fmt.Errorf("reading block %s from %s: the stream does not start with a valid header", id, addr)
	}
	data := make([]byte, 0, h.GetSize())
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, clientError("reading block", id, addr, err)
		}
		if int64(len(data)+len(msg.GetData())) > h.GetSize() {
			return nil, nil, fmt.Errorf("reading block %s from %s: more than the %d bytes of its header", id, addr, h.GetSize())
		}
		data = append(data, msg.GetData()...)
	}
	if int64(len(data)) != h.GetSize() {
		return nil, nil, fmt.Errorf("reading block %s from %s: %d of %d bytes", id, addr, len(data), h.GetSize())
	}
	if sum := crc32.Checksum(data, castagnoli); sum != h.GetCrc32C() {
		return nil, nil, fmt.Errorf("reading block %s from %s: crc32c %08x, expected %08x", id, addr, sum, h.GetCrc32C())
	}
	return data, h, nil
}

// WriteBlock sends a whole block to the worker at addr. The header's size and CRC-32C are
// filled in from data.
func (p *Peers) WriteBlock(ctx context.Context, addr string, h *workerpb.WriteBlockHeader, data []byte) (*workerpb.BlockHeader, error) {
	stub, err := p.stub(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := stub.WriteBlock(ctx)
	if err != nil {
		return nil, clientError("writing block", h.GetBlockId(), addr, err)
	}
	hdr := &workerpb.WriteBlockHeader{
		BlockId: h.GetBlockId(), Size: int64(len(data)), Crc32C: crc32.Checksum(data, castagnoli),
		Origin: h.GetOrigin(),
	}
	send := func(m *workerpb.WriteBlockRequest) error {
		// io.EOF means the server has answered already; CloseAndRecv gets the answer.
		if err := stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
			return clientError("writing block", h.GetBlockId(), addr, err)
		}
		return nil
	}
	if err := send(&workerpb.WriteBlockRequest{Part: &workerpb.WriteBlockRequest_Header{Header: hdr}}); err != nil {
		return nil, err
	}
	for off := 0; off < len(data); off += ChunkSize {
		chunk := data[off:min(off+ChunkSize, len(data))]
		if err := send(&workerpb.WriteBlockRequest{Part: &workerpb.WriteBlockRequest_Data{Data: chunk}}); err != nil {
			return nil, err
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, clientError("writing block", h.GetBlockId(), addr, err)
	}
	return resp.GetBlock(), nil
}

func clientError(what, id, addr string, err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%s %s from %s: %w", what, id, addr, ErrNotFound)
	}
	return fmt.Errorf("%s %s on %s: %w", what, id, addr, err)
}
