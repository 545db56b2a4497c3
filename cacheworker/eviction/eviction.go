package eviction

import (
	"container/heap"
	"fmt"
	"math"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// Policy ranks the blocks of one tier, coldest first.
type Policy interface {
	// Add starts tracking a block that has just arrived in the tier; arriving counts as a reference.
	// Adding a block that is already tracked counts as a Touch.
	Add(id string)
	// Touch records a reference to a tracked block; untracked blocks are ignored.
	Touch(id string)
	// Remove stops tracking a block; untracked blocks are ignored.
	Remove(id string)
	// SetPinned marks a block as never to be chosen by Victim (or lifts the mark). It keeps
	// collecting references while pinned, so that it ranks correctly once unpinned.
	SetPinned(id string, pinned bool)
	// Victim returns the coldest tracked block that is not pinned and for which skip (if not
	// nil) returns false. It does not remove it: the caller removes it once it has really left.
	Victim(skip func(id string) bool) (string, bool)
	// Len is the number of tracked blocks, pinned ones included.
	Len() int
	// Pinned is the number of tracked blocks that are pinned.
	Pinned() int
}

// Kind names a policy.
type Kind string

// The policies of this package.
const (
	LRU  Kind = "LRU"
	LFU  Kind = "LFU"
	LRFU Kind = "LRFU"
	// MRD (Kariz) is DAG-aware: which Dataset gives up blocks is decided by the lineage graph,
	// the Dataset whose next read by a pipeline step is furthest away first (the tier store
	// does that, from each Dataset's next use); among its own blocks, it ranks as LRU does.
	MRD Kind = "MRD"
)

// Config chooses a policy.
type Config struct {
	// Kind is LRU, LFU or LRFU; empty means LRU, the CachePolicy default.
	Kind Kind
	// Lambda is LRFU's weight of recency against frequency, in [0, 1].
	Lambda float64
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	switch c.Kind {
	case "", LRU, LFU, MRD:
		if c.Lambda != 0 {
			return fmt.Errorf("eviction lambda %g only applies to policy %s, not %s", c.Lambda, LRFU, c.kind())
		}
		return nil
	case LRFU:
		if math.IsNaN(c.Lambda) || c.Lambda < 0 || c.Lambda > 1 {
			return fmt.Errorf("eviction lambda %g must be in [0, 1]: 0 behaves like LFU, 1 like LRU", c.Lambda)
		}
		return nil
	default:
		return fmt.Errorf("unknown eviction policy %q: use LRU, LFU, LRFU or MRD", c.Kind)
	}
}

func (c Config) kind() Kind {
	if c.Kind == "" {
		return LRU
	}
	return c.Kind
}

// New returns a fresh policy as c describes.
func New(c Config) (Policy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	switch c.kind() {
	case LFU:
		return NewLFU(), nil
	case LRFU:
		return NewLRFU(c.Lambda), nil
	default:
		// LRU, and MRD among one Dataset's own blocks.
		return NewLRU(), nil
	}
}

// ConfigFromSpec turns a CachePolicy's eviction spec into a Config.
func ConfigFromSpec(spec datav1alpha1.EvictionSpec) (Config, error) {
	c := Config{Kind: Kind(spec.Policy)}
	if spec.Lambda != nil {
		c.Lambda = *spec.Lambda
	} else if c.Kind == LRFU {
		// Halfway between LFU and LRU when the user picked LRFU without saying how to weigh.
		c.Lambda = 0.5
	}
	return c, c.Validate()
}

// NewLRU returns a policy that evicts the block referenced longest ago.
func NewLRU() Policy {
	return newRanked(func(e *entry, now uint64) {
		e.last = now
		e.key = float64(now)
	})
}

// NewLFU returns a policy that evicts the block referenced the fewest times, the one
// referenced longest ago among equals.
func NewLFU() Policy {
	return newRanked(func(e *entry, now uint64) {
		e.count++
		e.last = now
		e.key = float64(e.count)
	})
}

// NewLRFU returns a policy that evicts the block with the smallest combined recency and
// frequency (CRF): the sum over its references at times t of (1/2)^(lambda*(now-t)). lambda
// is clamped to [0, 1]: 0 makes every reference weigh 1 (LFU), 1 makes the latest reference
// outweigh all earlier ones together (LRU).
//
// The CRF of every block decays by the same factor as time passes, so the order of two blocks
// never changes between their references. The heap therefore keys each block by
// log2(CRF at its last reference) + lambda*last, which is log2 of its CRF now plus the same
// lambda*now for every block: a key that needs no update as the clock advances.
func NewLRFU(lambda float64) Policy {
	lambda = math.Min(math.Max(lambda, 0), 1)
	return newRanked(func(e *entry, now uint64) {
		if e.count == 0 {
			e.crf = 1
		} else {
			e.crf = 1 + e.crf*math.Exp2(-lambda*float64(now-e.last))
		}
		e.count++
		e.last = now
		e.key = math.Log2(e.crf) + lambda*float64(now)
	})
}

// entry is one tracked block.
type entry struct {
	id     string
	pinned bool
	pos    int // position in the heap; -1 while pinned
	count  uint64
	last   uint64
	crf    float64
	key    float64
}

// ranked is a min-heap of unpinned entries ordered by key, then by last reference; the
// policies differ only in how a reference updates an entry.
type ranked struct {
	now     uint64
	entries map[string]*entry
	heap    entryHeap
	touch   func(e *entry, now uint64)
}

func newRanked(touch func(e *entry, now uint64)) *ranked {
	return &ranked{entries: make(map[string]*entry), touch: touch}
}

func (r *ranked) Add(id string) {
	if _, ok := r.entries[id]; ok {
		r.Touch(id)
		return
	}
	r.now++
	e := &entry{id: id, pos: -1}
	r.touch(e, r.now)
	r.entries[id] = e
	heap.Push(&r.heap, e)
}

func (r *ranked) Touch(id string) {
	e, ok := r.entries[id]
	if !ok {
		return
	}
	r.now++
	r.touch(e, r.now)
	if e.pos >= 0 {
		heap.Fix(&r.heap, e.pos)
	}
}

func (r *ranked) Remove(id string) {
	e, ok := r.entries[id]
	if !ok {
		return
	}
	delete(r.entries, id)
	if e.pos >= 0 {
		heap.Remove(&r.heap, e.pos)
	}
}

func (r *ranked) SetPinned(id string, pinned bool) {
	e, ok := r.entries[id]
	if !ok || e.pinned == pinned {
		return
	}
	e.pinned = pinned
	// Pinned entries leave the heap, so Victim never has to walk past them.
	if pinned {
		heap.Remove(&r.heap, e.pos)
		e.pos = -1
	} else {
		heap.Push(&r.heap, e)
	}
}

func (r *ranked) Len() int { return len(r.entries) }

// Pinned counts the entries outside the heap, which holds every unpinned one.
func (r *ranked) Pinned() int { return len(r.entries) - len(r.heap) }

func (r *ranked) Victim(skip func(id string) bool) (string, bool) {
	h := r.heap
	if len(h) == 0 {
		return "", false
	}
	if skip == nil || !skip(h[0].id) {
		return h[0].id, true
	}
	// Walk the heap best-first: a frontier of heap positions ordered by their entries. The
	// first position not skipped is the coldest eligible entry, found in O(k log k) for k skips.
	f := frontier{h: h, pos: []int{0}}
	for f.Len() > 0 {
		p := heap.Pop(&f).(int)
		if !skip(h[p].id) {
			return h[p].id, true
		}
		for _, c := range []int{2*p + 1, 2*p + 2} {
			if c < len(h) {
				heap.Push(&f, c)
			}
		}
	}
	return "", false
}

// colder orders entries: smaller key first, then the one referenced longer ago. last is unique
// per policy because the clock ticks on every reference.
func colder(a, b *entry) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	return a.last < b.last
}

type entryHeap []*entry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return colder(h[i], h[j]) }
func (h entryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos = i
	h[j].pos = j
}

func (h *entryHeap) Push(x any) {
	e := x.(*entry)
	e.pos = len(*h)
	*h = append(*h, e)
}

func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.pos = -1
	return e
}

// frontier is a heap of positions in an entryHeap, ordered by the entries at those positions.
type frontier struct {
	h   entryHeap
	pos []int
}

func (f frontier) Len() int           { return len(f.pos) }
func (f frontier) Less(i, j int) bool { return colder(f.h[f.pos[i]], f.h[f.pos[j]]) }
func (f frontier) Swap(i, j int)      { f.pos[i], f.pos[j] = f.pos[j], f.pos[i] }
func (f *frontier) Push(x any)        { f.pos = append(f.pos, x.(int)) }
func (f *frontier) Pop() any {
	p := f.pos[len(f.pos)-1]
	f.pos = f.pos[:len(f.pos)-1]
	return p
}
