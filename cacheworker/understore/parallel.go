package understore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sync/errgroup"
)

// Defaults of ParallelOptions.
const (
	DefaultChunkSize   = 8 << 20
	DefaultConcurrency = 4
)

// RangeReader is what ParallelReadAt needs of a store: Store's ReadVersionAt.
type RangeReader interface {
	ReadVersionAt(ctx context.Context, path, etag string, p []byte, off int64) (int, error)
}

// ParallelOptions tune ParallelReadAt.
type ParallelOptions struct {
	// ChunkSize is the size of each ranged read; 0 means DefaultChunkSize.
	ChunkSize int64
	// Concurrency is how many ranged reads run at once; 0 means DefaultConcurrency.
	Concurrency int
}

// ParallelReadAt reads len(p) bytes at off of version etag of an object like r.ReadVersionAt,
// as up to Concurrency ranged reads of ChunkSize bytes at a time. Object stores serve one stream
// at a fraction of what a node's network can take, so a cold block arrives sooner in parallel
// pieces; each piece is read only from version etag, so the pieces are of one version. It
// returns fewer bytes than len(p) only at the end of the object, with io.EOF.
func ParallelReadAt(ctx context.Context, r RangeReader, path, etag string, p []byte, off int64, o ParallelOptions) (int, error) {
	if o.ChunkSize <= 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if int64(len(p)) <= o.ChunkSize || o.Concurrency == 1 {
		return r.ReadVersionAt(ctx, path, etag, p, off)
	}
	type chunk struct {
		start, end int64 // in p
		n          int
		eof        bool
	}
	var chunks []*chunk
	for s := int64(0); s < int64(len(p)); s += o.ChunkSize {
		chunks = append(chunks, &chunk{start: s, end: min(s+o.ChunkSize, int64(len(p)))})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Concurrency)
	for _, c := range chunks {
		g.Go(func() error {
			n, err := r.ReadVersionAt(gctx, path, etag, p[c.start:c.end], off+c.start)
			c.n = n
			switch {
			case errors.Is(err, io.EOF):
				c.eof = true
			case err != nil:
				return err
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	// The object ends in the first short chunk; any chunk after it must be empty, or the
	// object changed size while it was read.
	total := 0
	for i, c := range chunks {
		total += c.n
		if int64(c.n) < c.end-c.start {
			for _, later := range chunks[i+1:] {
				if later.n > 0 {
					return 0, fmt.Errorf("reading %s in parallel: the object ended at %d but more bytes followed at %d; it changed while being read",
						path, off+int64(total), off+later.start)
				}
			}
			return total, io.EOF
		}
	}
	return total, nil
}
