package tierstore

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
)

// unit is the block size of most tests; quotas are multiples of it so that watermark
// arithmetic reads as block counts.
const unit = 100

// content is the deterministic payload of a block, different for every id.
func content(id string, size int) []byte {
	h := fnv.New64a()
	h.Write([]byte(id))
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(size)))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

// tierSpec is a tier of a test store: a quota in units and watermarks; dirs is how many directories.
type tierSpec struct {
	name      string
	medium    datav1alpha1.Medium
	quota     int64
	high, low float64
	dirs      int
}

var (
	memTier  = tierSpec{name: "mem", medium: datav1alpha1.MediumMemory, quota: 10, high: 0.9, low: 0.5}
	nvmeTier = tierSpec{name: "nvme", medium: datav1alpha1.MediumNVMe, quota: 20, high: 0.9, low: 0.5}
	hddTier  = tierSpec{name: "hdd", medium: datav1alpha1.MediumHDD, quota: 5, high: 1, low: 0.6}
)

// testStore is a store in a temporary directory that can be restarted.
type testStore struct {
	*Store
	t    *testing.T
	root string
	cfg  Config
}

func newStore(t *testing.T, specs []tierSpec, tweak func(*Config)) *testStore {
	t.Helper()
	root := t.TempDir()
	cfg := Config{IndexDir: filepath.Join(root, "index"), Now: newFakeClock().Now, Eviction: eviction.Config{Kind: eviction.LRU}}
	for _, sp := range specs {
		tc := Tier{Name: sp.name, Medium: sp.medium, Quota: sp.quota * unit, High: sp.high, Low: sp.low}
		for i := range max(sp.dirs, 1) {
			tc.Dirs = append(tc.Dirs, filepath.Join(root, sp.name, string(rune('a'+i))))
		}
		cfg.Tiers = append(cfg.Tiers, tc)
	}
	if tweak != nil {
		tweak(&cfg)
	}
	ts := &testStore{t: t, root: root, cfg: cfg}
	ts.open()
	return ts
}

func (ts *testStore) open() {
	ts.t.Helper()
	s, err := Open(context.Background(), ts.cfg)
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.Store = s
	ts.t.Cleanup(func() { _ = s.Close() })
}

// restart closes the store and opens it again on the same directories.
func (ts *testStore) restart() {
	ts.t.Helper()
	if err := ts.Close(); err != nil {
		ts.t.Fatal(err)
	}
	ts.open()
}

func (ts *testStore) put(id string, opts PutOptions) {
	ts.t.Helper()
	ts.putSized(id, unit, opts)
}

func (ts *testStore) putSized(id string, size int, opts PutOptions) {
	ts.t.Helper()
	if _, err := ts.Put(context.Background(), id, bytes.NewReader(content(id, size)), int64(size), opts); err != nil {
		ts.t.Fatalf("putting %s: %v", id, err)
	}
}

func (ts *testStore) get(id string) []byte {
	ts.t.Helper()
	b, _, err := ts.Get(context.Background(), id)
	if err != nil {
		ts.t.Fatalf("getting %s: %v", id, err)
	}
	return b
}

// tierOf is the tier holding id, or "" if the store does not have it.
func (ts *testStore) tierOf(id string) string {
	info, err := ts.Info(id)
	if err != nil {
		return ""
	}
	return info.Tier
}

// layout maps every stored block to its tier.
func (ts *testStore) layout(ids ...string) map[string]string {
	out := make(map[string]string)
	for _, id := range ids {
		out[id] = ts.tierOf(id)
	}
	return out
}

func (ts *testStore) stats(name string) TierStats {
	for _, st := range ts.Stats() {
		if st.Name == name {
			return st
		}
	}
	ts.t.Fatalf("no tier %s", name)
	return TierStats{}
}

// flipByte corrupts one byte of a stored block's file behind the store's back.
func (ts *testStore) flipByte(id string) {
	ts.t.Helper()
	info, err := ts.Info(id)
	if err != nil {
		ts.t.Fatal(err)
	}
	p := filepath.Join(info.Dir, id)
	b, err := os.ReadFile(p)
	if err != nil {
		ts.t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(p, b, 0o640); err != nil {
		ts.t.Fatal(err)
	}
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}
