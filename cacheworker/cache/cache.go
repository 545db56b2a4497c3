package cache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// ErrOutOfRange is returned for a block index at or past the end of its file.
var ErrOutOfRange = errors.New("block index past the end of the file")

// ErrClosed is returned once the cache is closed.
var ErrClosed = errors.New("cache closed")

// BlockStore is the local tiers, as the cache uses them.
type BlockStore interface {
	Get(ctx context.Context, id string) ([]byte, tierstore.BlockInfo, error)
	Info(id string) (tierstore.BlockInfo, error)
	Put(ctx context.Context, id string, r io.Reader, size int64, opts tierstore.PutOptions) (tierstore.BlockInfo, error)
	Stats() []tierstore.TierStats
}

// Source is the under-store, as the cache uses it.
type Source = understore.RangeReader

// PeerReader reads a whole block from another worker that holds it.
type PeerReader interface {
	ReadBlock(ctx context.Context, id string) ([]byte, error)
}

// Config configures a Cache.
type Config struct {
	// Store is the node's tier store.
	Store BlockStore
	// Source is the under-store the files are read from.
	Source Source
	// SourceID names the source in block ids, so that the same path in two Datasets never
	// shares blocks: the Dataset's UID, or its source URL and version.
	SourceID string
	// BlockSize is the TierPool's block size: block i of a file is its bytes [i*BlockSize, (i+1)*BlockSize).
	BlockSize int64
	// Fetch tunes the parallel ranged reads of a missing block; the zero value means the
	// understore defaults.
	Fetch understore.ParallelOptions
	// Peers, when set, is asked for a missing block before the under-store: another worker of
	// the cluster may hold it, and a copy over the pod network is cheaper than the under-store.
	// Any failure falls back to the under-store.
	Peers PeerReader
	// Dataset and Root name the source's files in the master's namespace: file f is Root + "/" + f
	// in the master's dataset Dataset. With Root set, every stored block carries that origin and
	// is passed to Stored, which reports it to the master.
	Dataset, Root string
	Stored        func(ctx context.Context, info tierstore.BlockInfo)
	// Pinned, when set, says whether block index of a file of blocks blocks (0: not known) is
	// stored pinned (never evicted): the Dataset's CachePolicy pins the paths it names, and a
	// prefetch pins the share of each file it loaded.
	Pinned func(file string, index, blocks int64) bool
	// Metrics receives the cache's counts; nil keeps them unregistered.
	Metrics *Metrics
	// Log receives what the cache cannot do but works around.
	Log logr.Logger
}

// Cache reads blocks of one under-store through the node's tiers.
type Cache struct {
	cfg    Config
	m      *Metrics
	log    logr.Logger
	flight *flight
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ctx    context.Context
	// prefetching holds a token for each prefetch under way (see Prefetch).
	prefetching chan struct{}
}

// maxPrefetches bounds the prefetches of a Cache under way at once: one block ahead of a
// sequential reader keeps the under-store busy while the reader copies the block before it,
// and more would take memory and bandwidth from reads that are waited for.
const maxPrefetches = 2

// New returns a cache. Close it to stop the fetches it has under way.
func New(cfg Config) (*Cache, error) {
	switch {
	case cfg.Store == nil || cfg.Source == nil:
		return nil, errors.New("a cache needs a block store and a source")
	case cfg.SourceID == "":
		return nil, errors.New("a cache needs a source id to name its blocks")
	case cfg.BlockSize <= 0:
		return nil, fmt.Errorf("block size must be positive, got %d", cfg.BlockSize)
	}
	m := cfg.Metrics
	if m == nil {
		var err error
		if m, err = NewMetrics(prometheus.NewRegistry(), cfg.Store); err != nil {
			return nil, err
		}
	}
	log := cfg.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cache{cfg: cfg, m: m, log: log, cancel: cancel, ctx: ctx, prefetching: make(chan struct{}, maxPrefetches)}
	c.flight = newFlight(ctx, &c.wg)
	return c, nil
}

// Close cancels the fetches under way and waits for them to end.
func (c *Cache) Close() {
	c.cancel()
	c.flight.close()
}

// BlockID is the id of block index of version etag of file in the source named sourceID: a
// hash of the names, so that any path yields a short id that is safe as a file name, and the
// index. Blocks of two versions of a file never share an id, so a block read from one version is
// never served as part of another. (An empty etag names the blocks as they were named before
// ids had versions.)
func BlockID(sourceID, file, etag string, index int64) string {
	name := sourceID + "\x00" + file
	if etag != "" {
		name += "\x00" + etag
	}
	h := sha256.Sum256([]byte(name))
	return hex.EncodeToString(h[:16]) + "-" + strconv.FormatInt(index, 10)
}

// ReadBlock returns block index of version etag of file, whose size is as the listing gave it
// (negative if unknown): from a local tier if it is there, otherwise read from that version in
// the under-store (in parallel ranges), stored in the top tier and returned. Concurrent misses
// on one block fetch it once. The last block of a file is shorter than BlockSize; a block past
// the end fails with ErrOutOfRange; a file that is not version etag any more fails with
// understore.ErrChanged. The returned slice is shared with the other readers of the block and
// with the write of it into the tier: the caller must not modify it.
func (c *Cache) ReadBlock(ctx context.Context, file, etag string, size, index int64) ([]byte, error) {
	if index < 0 {
		return nil, fmt.Errorf("block %d of %s: %w", index, file, ErrOutOfRange)
	}
	if c.ctx.Err() != nil {
		return nil, ErrClosed
	}
	id := BlockID(c.cfg.SourceID, file, etag, index)
	data, info, err := c.cfg.Store.Get(ctx, id)
	switch {
	case err == nil:
		c.m.hits.WithLabelValues(info.Tier).Inc()
		return data, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("reading block %d of %s: %w", index, file, ctx.Err())
	case errors.Is(err, tierstore.ErrClosed):
		return nil, fmt.Errorf("reading block %d of %s: %w", index, file, err)
	case !errors.Is(err, tierstore.ErrNotFound):
		// A corrupt copy has been removed by the store; a local I/O error should not stop a
		// reader either. The under-store still has the block.
		c.log.Error(err, "local copy unusable, reading from the under-store", "file", file, "block", index)
	}
	c.m.misses.Inc()
	data, err = c.flight.do(ctx, id, func(fctx context.Context) ([]byte, func(context.Context), error) {
		return c.fetch(fctx, id, file, etag, size, index)
	})
	if err != nil {
		return nil, fmt.Errorf("reading block %d of %s: %w", index, file, err)
	}
	return data, nil
}

// Prefetch starts reading block index of version etag of file (size bytes as listed, negative
// if unknown) into the top tier in the background, unless a local tier holds it already: a
// sequential reader that gets to it finds it there, or joins the fetch under way instead of
// starting one. A prefetch is a hint: when maxPrefetches run already, or the block is past
// the end of the file, nothing happens; a failure is only counted.
func (c *Cache) Prefetch(file, etag string, size, index int64) {
	if index < 0 || size >= 0 && index*c.cfg.BlockSize >= size || c.ctx.Err() != nil {
		return
	}
	if _, err := c.cfg.Store.Info(BlockID(c.cfg.SourceID, file, etag, index)); err == nil {
		return
	}
	select {
	case c.prefetching <- struct{}{}:
	default:
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-c.prefetching }()
		c.m.prefetches.Inc()
		if _, err := c.ReadBlock(c.ctx, file, etag, size, index); err != nil && c.ctx.Err() == nil {
			c.m.prefetchErrors.Inc()
			c.log.V(1).Info("prefetching a block failed; a reader that gets to it reads it then", "file", file, "block", index, "error", err.Error())
		}
	}()
}

// fetch reads a block from the under-store and returns it with the function that stores it.
func (c *Cache) fetch(ctx context.Context, id, file, etag string, size, index int64) ([]byte, func(context.Context), error) {
	// The flight before this one may have stored the block a moment ago.
	if data, _, err := c.cfg.Store.Get(ctx, id); err == nil {
		return data, nil, nil
	}
	// A block of a file of known size is read to its length and no further: a small file's
	// block is a small buffer and one request, not BlockSize bytes allocated and cleared and
	// ranges asked for past the end of the object.
	length := c.cfg.BlockSize
	if size >= 0 {
		if length = min(c.cfg.BlockSize, size-index*c.cfg.BlockSize); length <= 0 {
			return nil, nil, ErrOutOfRange
		}
	}
	if c.cfg.Peers != nil {
		data, err := c.cfg.Peers.ReadBlock(ctx, id)
		switch {
		case err == nil && len(data) > 0 && (int64(len(data)) == length || size < 0 && int64(len(data)) <= length):
			c.m.peerFetches.Inc()
			c.m.peerBytes.Add(float64(len(data)))
			return data, c.storer(id, file, etag, size, index, data), nil
		case err == nil:
			c.log.Error(nil, "a peer sent a block of the wrong size; reading the under-store", "file", file, "block", index, "bytes", len(data))
		case ctx.Err() != nil:
			return nil, nil, err
		default:
			c.log.V(1).Info("no peer served the block; reading the under-store", "file", file, "block", index, "reason", err.Error())
		}
	}
	buf := make([]byte, length)
	n, err := understore.ParallelReadAt(ctx, c.cfg.Source, file, etag, buf, index*c.cfg.BlockSize, c.cfg.Fetch)
	if err != nil && !errors.Is(err, io.EOF) {
		c.m.fetchErrors.Inc()
		return nil, nil, err
	}
	if n == 0 {
		return nil, nil, ErrOutOfRange
	}
	if size >= 0 && int64(n) < length {
		c.m.fetchErrors.Inc()
		return nil, nil, fmt.Errorf("%s ends at %d, not at the %d bytes it was listed with: %w", file, index*c.cfg.BlockSize+int64(n), size, understore.ErrChanged)
	}
	data := buf[:n]
	c.m.fetches.Inc()
	c.m.fetchedBytes.Add(float64(n))
	return data, c.storer(id, file, etag, size, index, data), nil
}

// storer returns the function that stores a fetched block of a file of size bytes (negative:
// not known) in the top tier and reports it.
func (c *Cache) storer(id, file, etag string, size, index int64, data []byte) func(context.Context) {
	var blocks int64
	if size >= 0 {
		blocks = (size + c.cfg.BlockSize - 1) / c.cfg.BlockSize
	}
	return func(ctx context.Context) {
		// Clean: the under-store has it, so the last tier may drop it without persisting it.
		opts := tierstore.PutOptions{Clean: true, Pinned: c.cfg.Pinned != nil && c.cfg.Pinned(file, index, blocks)}
		if c.cfg.Root != "" {
			origin, err := proto.Marshal(&workerpb.BlockOrigin{
				Path: path.Join(c.cfg.Root, file), Dataset: c.cfg.Dataset, Root: c.cfg.Root, Index: index, Offset: index * c.cfg.BlockSize,
				SourceVersion: etag, FileBlocks: blocks,
			})
			if err != nil {
				c.log.Error(err, "encoding a block's origin", "file", file, "block", index)
			}
			opts.Origin = origin
		}
		info, err := c.cfg.Store.Put(ctx, id, bytes.NewReader(data), int64(len(data)), opts)
		if err != nil {
			if !errors.Is(err, tierstore.ErrExists) {
				c.m.storeFailures.Inc()
				c.log.Info("served a block without caching it", "file", file, "block", index, "reason", err.Error())
			}
			return
		}
		if c.cfg.Stored != nil && len(info.Origin) > 0 {
			c.cfg.Stored(ctx, info)
		}
	}
}
