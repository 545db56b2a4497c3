// Package locations is the worker's view of where blocks are: it tells the master which blocks
// this worker holds (so that other workers can read them from here instead of the under-store)
// and asks it which workers hold a block this one is missing.
package locations

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/masterpb"
)

// ErrNoPeer is returned when no other live worker holds a block.
var ErrNoPeer = errors.New("no other worker holds the block")

// Master is the part of the master client this package uses.
type Master interface {
	RegisterDataset(ctx context.Context, req *masterpb.RegisterDatasetRequest) (*masterpb.Dataset, error)
	CreateFile(ctx context.Context, req *masterpb.CreateFileRequest) (*masterpb.File, error)
	GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error)
	CommitBlock(ctx context.Context, req *masterpb.CommitBlockRequest) (*masterpb.Block, error)
	RemoveBlockCopy(ctx context.Context, req *masterpb.RemoveBlockCopyRequest) (*masterpb.Block, error)
	GetBlockLocations(ctx context.Context, req *masterpb.GetBlockLocationsRequest) (*masterpb.GetBlockLocationsResponse, error)
	ListWorkers(ctx context.Context, req *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error)
}

// BlockReader reads a whole block from another worker's data plane.
type BlockReader interface {
	ReadBlock(ctx context.Context, addr, id string) ([]byte, *workerpb.BlockHeader, error)
}

// reportTimeout bounds one background report, so that a master that does not answer delays the
// reports behind it by at most this much.
const reportTimeout = 10 * time.Second

// queueLength is how many blocks may wait to be reported. A block that does not fit is reported
// at the worker's next registration; until then peers read it from the under-store.
const queueLength = 4096

// workersTTL is how long the map of worker ids to addresses is reused. A worker that moved
// costs one failed peer read until then, after which the under-store serves the block.
const workersTTL = 5 * time.Second

// Directory reports this worker's blocks to the master and finds other workers' blocks.
type Directory struct {
	master Master
	peers  BlockReader
	self   string
	log    logr.Logger
	now    func() time.Time

	queue chan change

	// files remembers the files created at the master, so that each costs one CreateFile.
	files sync.Map

	mu        sync.Mutex
	addrs     map[string]string // worker id → data-plane address
	addrsTime time.Time
}

// NewDirectory returns the directory of the worker whose master id is self.
func NewDirectory(master Master, peers BlockReader, self string, log logr.Logger) *Directory {
	return &Directory{master: master, peers: peers, self: self, log: log, now: time.Now,
		queue: make(chan change, queueLength)}
}

// change is a block this worker now holds, or (gone) no longer holds.
type change struct {
	info tierstore.BlockInfo
	gone bool
}

// Enqueue reports a block in the background (see Run): the read path that stored it never
// waits for the master.
func (d *Directory) Enqueue(_ context.Context, info tierstore.BlockInfo) {
	d.push(change{info: info})
}

// Forget tells the master, in the background, that this worker no longer holds a block it may
// have reported: readers stop asking for it, and usage stops counting it. It never blocks, so
// the tier store may call it while it holds its lock.
func (d *Directory) Forget(info tierstore.BlockInfo) {
	d.push(change{info: info, gone: true})
}

func (d *Directory) push(c change) {
	select {
	case d.queue <- c:
	default:
		// Dropped: a report is made again at the next registration; a stale copy costs one failed
		// peer read (the reader then goes to the under-store) and an overstated usage until then.
		d.log.Info("too many block changes waiting for the master; this one waits for the next registration",
			"block", c.info.ID, "gone", c.gone)
	}
}

// Run sends the queued changes to the master until ctx ends.
func (d *Directory) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-d.queue:
			rctx, cancel := context.WithTimeout(ctx, reportTimeout)
			var err error
			if c.gone {
				err = d.forget(rctx, c.info.ID)
			} else {
				err = d.Report(rctx, c.info)
			}
			if err != nil && ctx.Err() == nil {
				d.log.Error(err, "telling the master about a block; it stays stale there until the next registration", "gone", c.gone)
			}
			cancel()
		}
	}
}

// forget removes this worker's copy of block id at the master; a block the master does not know
// is forgotten already.
func (d *Directory) forget(ctx context.Context, id string) error {
	_, err := d.master.RemoveBlockCopy(ctx, &masterpb.RemoveBlockCopyRequest{BlockId: MasterBlockID(id), Worker: d.self})
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("forgetting this worker's copy of block %s at the master: %w", id, err)
	}
	return nil
}

// MasterBlockID is the master's id of a worker's block: the master numbers blocks, the worker
// names them by a hash of their source, file and index, so the number is derived from the name
// and every worker holding a copy reports the same one. Zero is reserved by the master.
func MasterBlockID(id string) uint64 {
	sum := sha256.Sum256([]byte(id))
	if n := binary.BigEndian.Uint64(sum[:8]); n != 0 {
		return n
	}
	return 1
}

// Report tells the master that this worker holds a block. Blocks without an origin (written by
// a client that did not say what they are part of) are local only and not reported.
func (d *Directory) Report(ctx context.Context, info tierstore.BlockInfo) error {
	if len(info.Origin) == 0 {
		return nil
	}
	var origin workerpb.BlockOrigin
	if err := proto.Unmarshal(info.Origin, &origin); err != nil {
		return fmt.Errorf("reporting block %s: its origin does not decode: %w", info.ID, err)
	}
	p := MasterPath(origin.GetPath(), origin.GetSourceVersion())
	if origin.GetFileToken() != "" {
		// A block of a written output (a replica, a copy a reader kept, one held across a
		// restart) is a copy of a published file's version: it is recorded only while the
		// master has that version. Creating the file here would publish a hollow file in the
		// place of one forgotten for a recomputation.
		f, err := d.master.GetFile(ctx, &masterpb.GetFileRequest{Path: p, StaleOk: true})
		switch {
		case status.Code(err) == codes.NotFound || err == nil && f.GetClientToken() != origin.GetFileToken():
			return nil // an earlier version's: the sweeper drops it
		case err != nil:
			return fmt.Errorf("reporting block %s: looking up %s: %w", info.ID, p, err)
		}
		return d.Commit(ctx, info, p, origin.GetOffset())
	}
	if err := d.ensureFile(ctx, p, &origin); err != nil {
		return fmt.Errorf("reporting block %s: %w", info.ID, err)
	}
	return d.Commit(ctx, info, p, origin.GetOffset())
}

// MasterPath is where the master records the blocks of version (an ETag) of the source file at
// path in the master's namespace: the file's path for outputs and for blocks cached before block
// ids had versions (version empty), and otherwise a file of that version beside it
// ("<path>@<hash of the version>"), since the master's files hold one block per offset and a
// source object's versions each have their own. Usage and locations under the Dataset's root
// count them all.
func MasterPath(path, version string) string {
	if version == "" {
		return path
	}
	sum := sha256.Sum256([]byte(version))
	return path + "@" + hex.EncodeToString(sum[:8])
}

// Commit tells the master that this worker holds block info, the part of the file at path
// (in the master's namespace) that starts at offset. The file must exist there.
func (d *Directory) Commit(ctx context.Context, info tierstore.BlockInfo, path string, offset int64) error {
	_, err := d.master.CommitBlock(ctx, d.CommitRequest(info, path, offset))
	if err != nil {
		return fmt.Errorf("reporting block %s of %s to the master: %w", info.ID, path, err)
	}
	return nil
}

// CommitRequest is the master's record of block info of the file path at offset, on this
// worker: what Commit sends.
func (d *Directory) CommitRequest(info tierstore.BlockInfo, path string, offset int64) *masterpb.CommitBlockRequest {
	return &masterpb.CommitBlockRequest{
		BlockId:  MasterBlockID(info.ID),
		Path:     path,
		Offset:   offset,
		Size:     info.Size,
		Checksum: strconv.FormatUint(uint64(info.Checksum), 16),
		Worker:   d.self,
		Tier:     info.Tier,
	}
}

// ReportAll reports every block in blocks, as after (re-)registering; it goes on past failures
// and returns them all.
func (d *Directory) ReportAll(ctx context.Context, blocks []tierstore.BlockInfo) (int, error) {
	var errs []error
	reported := 0
	for _, b := range blocks {
		if len(b.Origin) == 0 {
			continue
		}
		if err := d.Report(ctx, b); err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		reported++
	}
	return reported, errors.Join(errs...)
}

func (d *Directory) ensureFile(ctx context.Context, p string, origin *workerpb.BlockOrigin) error {
	if _, ok := d.files.Load(p); ok {
		return nil
	}
	create := func() error {
		_, err := d.master.CreateFile(ctx, &masterpb.CreateFileRequest{Path: p, Dataset: origin.GetDataset()})
		if status.Code(err) == codes.AlreadyExists {
			return nil
		}
		return err
	}
	err := create()
	if status.Code(err) == codes.NotFound && origin.GetDataset() != "" && origin.GetRoot() != "" {
		// The master does not know the dataset yet (the first block a worker caches may be
		// read before anyone registered it); registering is idempotent.
		if _, rerr := d.master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: origin.GetDataset(), Root: origin.GetRoot()}); rerr != nil {
			return fmt.Errorf("registering dataset %s at the master: %w", origin.GetDataset(), rerr)
		}
		err = create()
	}
	if err != nil {
		return fmt.Errorf("creating %s at the master: %w", p, err)
	}
	d.files.Store(p, struct{}{})
	return nil
}

// ReadBlock reads block id from another live worker that holds it, trying each in turn, and
// fails with ErrNoPeer when none has it (the caller then reads the under-store).
func (d *Directory) ReadBlock(ctx context.Context, id string) ([]byte, error) {
	resp, err := d.master.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{
		BlockIds: []uint64{MasterBlockID(id)}, StaleOk: true,
	})
	if status.Code(err) == codes.NotFound {
		return nil, ErrNoPeer
	}
	if err != nil {
		return nil, fmt.Errorf("looking up the copies of block %s: %w", id, err)
	}
	var holders []string
	var recorded string
	for _, b := range resp.GetBlocks() {
		recorded = b.GetChecksum()
		for _, l := range b.GetLocations() {
			if !l.GetLost() && l.GetWorker() != d.self {
				holders = append(holders, l.GetWorker())
			}
		}
	}
	if len(holders) == 0 {
		return nil, ErrNoPeer
	}
	addrs, err := d.addresses(ctx)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, w := range holders {
		addr, ok := addrs[w]
		if !ok {
			continue
		}
		data, _, err := d.peers.ReadBlock(ctx, addr, id)
		if err == nil {
			// The peer's own header vouches for nothing: the copy must be the block the master
			// recorded when it was committed, or a worker that lies would plant bytes here.
			if err = checkRecorded(id, data, recorded); err == nil {
				return data, nil
			}
			d.log.Error(err, "a peer sent a block that is not the one the master recorded; trying another copy", "worker", w, "addr", addr)
			errs = append(errs, fmt.Errorf("worker %s: %w", w, err))
			continue
		}
		if ctx.Err() != nil {
			return nil, err
		}
		// A copy that is gone or unreachable is not fatal: another holder or the under-store
		// still serves the reader.
		d.log.V(1).Info("peer read failed", "block", id, "worker", w, "addr", addr, "error", err.Error())
		if !errors.Is(err, dataplane.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return nil, errors.Join(append([]error{ErrNoPeer}, errs...)...)
}

// addresses maps the ids of live workers to their data-plane addresses, refreshed every
// workersTTL (a stale read of the master is fine: a wrong address costs one failed attempt).
func (d *Directory) addresses(ctx context.Context) (map[string]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.addrs != nil && d.now().Sub(d.addrsTime) < workersTTL {
		return d.addrs, nil
	}
	resp, err := d.master.ListWorkers(ctx, &masterpb.ListWorkersRequest{StaleOk: true})
	if err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	addrs := map[string]string{}
	for _, w := range resp.GetWorkers() {
		if w.GetState() == masterpb.WorkerState_WORKER_STATE_ALIVE && w.GetAddress() != "" {
			addrs[w.GetId()] = w.GetAddress()
		}
	}
	d.addrs, d.addrsTime = addrs, d.now()
	return addrs, nil
}

// ErrChecksumMismatch is returned for a copy from a peer that differs from the block the master
// recorded.
var ErrChecksumMismatch = errors.New("copy differs from the block the master recorded")

// checkRecorded compares data with the CRC-32C the master recorded for block id (hex, as
// CommitRequest writes it). A block the master records no checksum for is refused.
func checkRecorded(id string, data []byte, recorded string) error {
	want, err := strconv.ParseUint(recorded, 16, 32)
	if err != nil {
		return fmt.Errorf("block %s: %w: the master records no checksum (%q)", id, ErrChecksumMismatch, recorded)
	}
	if got := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)); got != uint32(want) {
		return fmt.Errorf("block %s: %w: crc32c %08x, recorded %08x", id, ErrChecksumMismatch, got, want)
	}
	return nil
}
