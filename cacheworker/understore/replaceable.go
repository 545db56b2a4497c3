package understore

import (
	"context"
	"io"
	"iter"
	"sync/atomic"
)

// Replaceable is a store that another can take the place of while it is in use: a mounted
// Dataset's source, whose credentials the user rotates in its Secret. Each call goes to the
// store in place when it starts; a call under way finishes with the store it began with.
type Replaceable struct {
	cur atomic.Pointer[storeBox]
}

// storeBox holds a Store, which atomic.Pointer cannot point to directly (an interface).
type storeBox struct{ Store }

var _ Store = (*Replaceable)(nil)

// NewReplaceable returns a Replaceable holding s.
func NewReplaceable(s Store) *Replaceable {
	r := &Replaceable{}
	r.cur.Store(&storeBox{s})
	return r
}

// Replace puts s in the place of the store held and returns that one, which calls under way may
// still be using: the caller closes it, if it has resources, once they are done.
func (r *Replaceable) Replace(s Store) Store {
	return r.cur.Swap(&storeBox{s}).Store
}

// Close closes the store held, if it has resources.
func (r *Replaceable) Close() error {
	if c, ok := r.current().(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func (r *Replaceable) current() Store { return r.cur.Load().Store }

// Stat implements Store.
func (r *Replaceable) Stat(ctx context.Context, p string) (ObjectInfo, error) {
	return r.current().Stat(ctx, p)
}

// List implements Store.
func (r *Replaceable) List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error] {
	return r.current().List(ctx, prefix)
}

// ReadAt implements Store.
func (r *Replaceable) ReadAt(ctx context.Context, p string, buf []byte, off int64) (int, error) {
	return r.current().ReadAt(ctx, p, buf, off)
}

// ReadVersionAt implements Store.
func (r *Replaceable) ReadVersionAt(ctx context.Context, p, etag string, buf []byte, off int64) (int, error) {
	return r.current().ReadVersionAt(ctx, p, etag, buf, off)
}

// Open implements Store.
func (r *Replaceable) Open(ctx context.Context, p string) (io.ReadCloser, error) {
	return r.current().Open(ctx, p)
}

// Write implements Store.
func (r *Replaceable) Write(ctx context.Context, p string, src io.Reader, size int64) error {
	return r.current().Write(ctx, p, src, size)
}

func (r *Replaceable) String() string { return r.current().String() }
