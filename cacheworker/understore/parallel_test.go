package understore

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// memReader is a RangeReader over a byte slice that records how many reads ran at once. If
// gate is set, the first gate reads wait until gate reads are in flight together, which
// proves the reads really overlap (a sequential reader would deadlock and time out).
type memReader struct {
	data    []byte
	failAt  int64 // a read at this offset fails; -1 for none
	gate    int
	arrived atomic.Int32
	open    chan struct{}
	once    sync.Once

	mu           sync.Mutex
	active, peak int
	calls        int
}

func newMemReader(data []byte, gate int) *memReader {
	return &memReader{data: data, failAt: -1, gate: gate, open: make(chan struct{})}
}

func (m *memReader) ReadVersionAt(ctx context.Context, _, _ string, p []byte, off int64) (int, error) {
	m.mu.Lock()
	m.active++
	m.calls++
	m.peak = max(m.peak, m.active)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.active--
		m.mu.Unlock()
	}()
	if m.gate > 0 {
		if int(m.arrived.Add(1)) >= m.gate {
			m.once.Do(func() { close(m.open) })
		}
		select {
		case <-m.open:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if off == m.failAt {
		return 0, errors.New("connection reset by peer")
	}
	if off >= int64(len(m.data)) {
		return 0, io.EOF
	}
	n := copy(p, m.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func TestParallelReadAt(t *testing.T) {
	data := make([]byte, 1000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	cases := map[string]struct {
		off      int64
		size     int
		failAt   int64
		wantN    int
		wantEOF  bool
		wantErr  string
		wantRead int // number of ranged reads
	}{
		"a read of whole chunks": {
			off: 0, size: 400, wantN: 400, wantRead: 4,
		},
		"a read not aligned to chunks": {
			off: 33, size: 250, wantN: 250, wantRead: 3,
		},
		"a read running past the end is short": {
			off: 850, size: 400, wantN: 150, wantEOF: true, wantRead: 4,
		},
		"a read starting past the end is empty": {
			off: 1200, size: 300, wantN: 0, wantEOF: true, wantRead: 3,
		},
		"a read no larger than a chunk is a single read": {
			off: 10, size: 100, wantN: 100, wantRead: 1,
		},
		"a failing chunk fails the read": {
			off: 0, size: 400, failAt: 200, wantErr: "connection reset by peer",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			r := newMemReader(data, 0)
			r.failAt = -1
			if tc.failAt != 0 {
				r.failAt = tc.failAt
			}
			buf := make([]byte, tc.size)
			n, err := ParallelReadAt(context.Background(), r, "obj", "", buf, tc.off, ParallelOptions{ChunkSize: 100, Concurrency: 3})
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			if tc.wantEOF {
				g.Expect(err).To(MatchError(io.EOF))
			} else {
				g.Expect(err).NotTo(HaveOccurred())
			}
			g.Expect(n).To(Equal(tc.wantN))
			if tc.wantN > 0 {
				g.Expect(buf[:n]).To(Equal(data[tc.off : tc.off+int64(n)]))
			}
			g.Expect(r.calls).To(Equal(tc.wantRead))
			g.Expect(r.peak).To(BeNumerically("<=", 3), "never more reads at once than asked for")
		})
	}
}

func TestParallelReadAtReallyOverlapsItsReads(t *testing.T) {
	g := NewWithT(t)
	data := make([]byte, 1000)
	r := newMemReader(data, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := ParallelReadAt(ctx, r, "obj", "", make([]byte, 1000), 0, ParallelOptions{ChunkSize: 100, Concurrency: 4})
	g.Expect(err).NotTo(HaveOccurred(), "four reads were in flight together")
	g.Expect(n).To(Equal(1000))
	g.Expect(r.peak).To(Equal(4))
}
