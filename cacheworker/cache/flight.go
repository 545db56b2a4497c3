package cache

import (
	"context"
	"sync"
)

// flight makes concurrent misses on one block fetch it once. Unlike a plain singleflight, the
// fetch does not run on the first caller's context: it runs on the cache's own, and is
// cancelled only when every caller waiting for it has given up (or the cache closes), so one
// impatient reader cannot fail the others.
type flight struct {
	ctx context.Context // the cache's lifetime
	wg  *sync.WaitGroup // fetch goroutines, waited for by Close

	mu    sync.Mutex
	calls map[string]*call
}

// call is one fetch and the callers waiting for it. Every caller gets the same slice, which
// the store may still be reading: nobody writes to a fetched block (Cache.ReadBlock says so),
// and a copy per caller cost as much CPU as storing the block (an 8 MiB copy for each reader
// of a cold block, and one for each prefetch, which only wants the block stored).
type call struct {
	done    chan struct{}
	data    []byte
	err     error
	waiters int
	cancel  context.CancelFunc
}

// fetchFunc fetches a block. If it returns a non-nil store, the flight hands data to the
// waiting callers first and then runs store (on the flight's context) before the key is free
// again: readers do not wait for the local write, and readers that arrive meanwhile still
// join this flight instead of fetching again.
type fetchFunc func(ctx context.Context) (data []byte, store func(ctx context.Context), err error)

func newFlight(ctx context.Context, wg *sync.WaitGroup) *flight {
	return &flight{ctx: ctx, wg: wg, calls: make(map[string]*call)}
}

// do returns fn's data for key, running fn at most once for all callers that arrive while it
// runs.
func (f *flight) do(ctx context.Context, key string, fn fetchFunc) ([]byte, error) {
	f.mu.Lock()
	c, ok := f.calls[key]
	if !ok {
		// Checked under mu, which close also takes after cancelling: no fetch is added to
		// wg once close has started waiting for it.
		if f.ctx.Err() != nil {
			f.mu.Unlock()
			return nil, ErrClosed
		}
		fctx, cancel := context.WithCancel(f.ctx)
		c = &call{done: make(chan struct{}), cancel: cancel}
		f.calls[key] = c
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer cancel()
			data, store, err := fn(fctx)
			c.data, c.err = data, err
			close(c.done)
			if store != nil {
				store(fctx)
			}
			f.mu.Lock()
			if f.calls[key] == c {
				delete(f.calls, key)
			}
			f.mu.Unlock()
		}()
	}
	c.waiters++
	f.mu.Unlock()

	select {
	case <-c.done:
		return c.result()
	case <-ctx.Done():
	}
	// Both may be ready; a result that is there is better than an error.
	select {
	case <-c.done:
		return c.result()
	default:
	}
	f.mu.Lock()
	c.waiters--
	if c.waiters == 0 {
		// Nobody wants it any more: stop the fetch, and let the next caller start afresh
		// rather than join a cancelled one.
		c.cancel()
		if f.calls[key] == c {
			delete(f.calls, key)
		}
	}
	f.mu.Unlock()
	return nil, ctx.Err()
}

// close waits for the fetches under way; the flight's context must be cancelled already.
func (f *flight) close() {
	f.mu.Lock()
	f.mu.Unlock() //nolint:staticcheck // an empty critical section: see do
	f.wg.Wait()
}

func (c *call) result() ([]byte, error) {
	if c.err != nil {
		return nil, c.err
	}
	return c.data, nil
}
