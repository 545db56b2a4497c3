package understore

import (
	"context"
	"io"
	"iter"
	"sync"
	"sync/atomic"
)

// Replaceable is a store that another can take the place of while it is in use: a mounted
// Dataset's source, whose credentials the user rotates in its Secret (or whose web identity
// token the operator renews). Each call goes to the store in place when it starts; a call under
// way finishes with the store it began with, and a store replaced is closed, if it holds
// resources (a file:// store, or a Union with one), once the last call that uses it is done.
type Replaceable struct {
	cur atomic.Pointer[storeBox]
}

// storeBox holds a Store (which atomic.Pointer cannot point to directly: an interface), with
// the calls that use it.
type storeBox struct {
	Store
	calls     atomic.Int64
	replaced  atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// close closes the store once, if it holds resources.
func (b *storeBox) close() error {
	b.closeOnce.Do(func() {
		if c, ok := b.Store.(io.Closer); ok {
			b.closeErr = c.Close()
		}
	})
	return b.closeErr
}

// done ends a call that used b; the last call on a replaced store closes it.
func (b *storeBox) done() {
	if b.calls.Add(-1) == 0 && b.replaced.Load() {
		_ = b.close() // out of use: a failure to close tells no caller anything
	}
}

var _ Store = (*Replaceable)(nil)

// NewReplaceable returns a Replaceable holding s.
func NewReplaceable(s Store) *Replaceable {
	r := &Replaceable{}
	r.cur.Store(&storeBox{Store: s})
	return r
}

// Replace puts s in the place of the store held. The store replaced is closed once the calls
// under way on it are done.
func (r *Replaceable) Replace(s Store) {
	old := r.cur.Swap(&storeBox{Store: s})
	old.replaced.Store(true)
	if old.calls.Load() == 0 {
		_ = old.close() // out of use: a failure to close tells no caller anything
	}
}

// Close closes the store held, if it has resources.
func (r *Replaceable) Close() error { return r.cur.Load().close() }

// use returns the store in place, counted as in use until done is called.
func (r *Replaceable) use() *storeBox {
	for {
		b := r.cur.Load()
		b.calls.Add(1)
		if r.cur.Load() == b {
			return b
		}
		b.done() // replaced meanwhile: take the new one
	}
}

// Stat implements Store.
func (r *Replaceable) Stat(ctx context.Context, p string) (ObjectInfo, error) {
	b := r.use()
	defer b.done()
	return b.Stat(ctx, p)
}

// List implements Store; the store listed stays open until the listing ends.
func (r *Replaceable) List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error] {
	return func(yield func(ObjectInfo, error) bool) {
		b := r.use()
		defer b.done()
		for info, err := range b.List(ctx, prefix) {
			if !yield(info, err) {
				return
			}
		}
	}
}

// ReadAt implements Store.
func (r *Replaceable) ReadAt(ctx context.Context, p string, buf []byte, off int64) (int, error) {
	b := r.use()
	defer b.done()
	return b.ReadAt(ctx, p, buf, off)
}

// ReadVersionAt implements Store.
func (r *Replaceable) ReadVersionAt(ctx context.Context, p, etag string, buf []byte, off int64) (int, error) {
	b := r.use()
	defer b.done()
	return b.ReadVersionAt(ctx, p, etag, buf, off)
}

// Open implements Store; the store stays open until the reader is closed.
func (r *Replaceable) Open(ctx context.Context, p string) (io.ReadCloser, error) {
	b := r.use()
	rc, err := b.Open(ctx, p)
	if err != nil {
		b.done()
		return nil, err
	}
	return &usedReader{ReadCloser: rc, box: b}, nil
}

// usedReader ends its store's use when it is closed.
type usedReader struct {
	io.ReadCloser
	box  *storeBox
	once sync.Once
}

func (u *usedReader) Close() error {
	err := u.ReadCloser.Close()
	u.once.Do(u.box.done)
	return err
}

// Write implements Store.
func (r *Replaceable) Write(ctx context.Context, p string, src io.Reader, size int64, pre Precondition) (string, error) {
	b := r.use()
	defer b.done()
	return b.Write(ctx, p, src, size, pre)
}

func (r *Replaceable) String() string { return r.cur.Load().String() }
