// Package throttle keeps a stream of bytes under a bandwidth cap: the background copies of the
// worker (checkpoints to the under-store, replicas to other workers) go no faster than their
// CachePolicy allows, so that pods' reads keep the network and the disks.
package throttle

import (
	"context"
	"io"
)

// Chunk is the most bytes a Reader reads at once, and so the burst its limiter must allow.
const Chunk = 256 << 10

// Waiter is the part of a rate.Limiter a Reader uses.
type Waiter interface {
	WaitN(ctx context.Context, n int) error
}

// Reader reads R, waiting on Limiter for every byte, in steps of at most Chunk.
type Reader struct {
	Ctx     context.Context
	R       io.Reader
	Limiter Waiter
}

func (l *Reader) Read(p []byte) (int, error) {
	if len(p) > Chunk {
		p = p[:Chunk]
	}
	n, err := l.R.Read(p)
	if n > 0 {
		if werr := l.Limiter.WaitN(l.Ctx, n); werr != nil {
			return n, werr
		}
	}
	return n, err
}
