package understore

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	. "github.com/onsi/gomega"
)

// closingStore is a store with resources: it counts its Close calls, and its ReadAt waits for
// release when asked to (entered says it has begun).
type closingStore struct {
	Store
	closes  atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (c *closingStore) Close() error { c.closes.Add(1); return nil }

func (c *closingStore) ReadAt(ctx context.Context, p string, buf []byte, off int64) (int, error) {
	if c.release != nil {
		close(c.entered)
		<-c.release
	}
	return c.Store.ReadAt(ctx, p, buf, off)
}

func newClosingStore(t *testing.T, blocking bool) *closingStore {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("bytes"), 0o640))
	l, err := NewLocal(LocalConfig{Dir: dir, AllowedRoots: []string{dir}})
	must(t, err)
	t.Cleanup(func() { _ = l.Close() })
	c := &closingStore{Store: l}
	if blocking {
		c.entered, c.release = make(chan struct{}), make(chan struct{})
	}
	return c
}

func TestAReplacedStoreIsClosedOnceItsCallsAreDone(t *testing.T) {
	ctx := context.Background()

	t.Run("a store no call uses is closed at once", func(t *testing.T) {
		g := NewWithT(t)
		old := newClosingStore(t, false)
		r := NewReplaceable(old)
		r.Replace(newClosingStore(t, false))
		g.Expect(old.closes.Load()).To(BeEquivalentTo(1))
	})

	t.Run("a read under way finishes with the old store, which closes after it", func(t *testing.T) {
		g := NewWithT(t)
		old := newClosingStore(t, true)
		r := NewReplaceable(old)
		read := make(chan error, 1)
		go func() {
			_, err := r.ReadAt(ctx, "a.txt", make([]byte, 5), 0)
			read <- err
		}()
		<-old.entered
		next := newClosingStore(t, false)
		r.Replace(next)
		g.Expect(old.closes.Load()).To(BeZero(), "a read still uses it")
		close(old.release)
		g.Expect(<-read).To(Succeed())
		g.Expect(old.closes.Load()).To(BeEquivalentTo(1))
		n, err := r.ReadAt(ctx, "a.txt", make([]byte, 5), 0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n).To(Equal(5), "the next read goes to the new store")
		g.Expect(next.closes.Load()).To(BeZero())
	})

	t.Run("an open reader keeps its store until it is closed", func(t *testing.T) {
		g := NewWithT(t)
		old := newClosingStore(t, false)
		r := NewReplaceable(old)
		rc, err := r.Open(ctx, "a.txt")
		g.Expect(err).NotTo(HaveOccurred())
		r.Replace(newClosingStore(t, false))
		g.Expect(old.closes.Load()).To(BeZero())
		b, err := io.ReadAll(rc)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(b)).To(Equal("bytes"))
		g.Expect(rc.Close()).To(Succeed())
		_ = rc.Close() // the file says it is closed already; the use ends once all the same
		g.Expect(old.closes.Load()).To(BeEquivalentTo(1))
	})

	t.Run("a listing keeps its store until it ends", func(t *testing.T) {
		g := NewWithT(t)
		old := newClosingStore(t, false)
		r := NewReplaceable(old)
		var paths []string
		for info, err := range r.List(ctx, "") {
			g.Expect(err).NotTo(HaveOccurred())
			r.Replace(newClosingStore(t, false))
			g.Expect(old.closes.Load()).To(BeZero(), "the listing still uses it")
			paths = append(paths, info.Path)
		}
		g.Expect(paths).To(Equal([]string{"a.txt"}))
		g.Expect(old.closes.Load()).To(BeEquivalentTo(1))
	})

	t.Run("Close closes the store in place", func(t *testing.T) {
		g := NewWithT(t)
		s := newClosingStore(t, false)
		g.Expect(NewReplaceable(s).Close()).To(Succeed())
		g.Expect(s.closes.Load()).To(BeEquivalentTo(1))
		g.Expect(strings.Contains(NewReplaceable(s).String(), "file://")).To(BeTrue())
	})
}
