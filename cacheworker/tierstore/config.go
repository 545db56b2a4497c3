package tierstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
)

// Defaults, in one place.
const (
	// DefaultHighWatermark and DefaultLowWatermark are the TierPool API's defaults.
	DefaultHighWatermark = 0.9
	DefaultLowWatermark  = 0.7
	// DefaultPromotionThreshold is the CachePolicy API's default accessThreshold.
	DefaultPromotionThreshold = 3
	// DefaultVerifyConcurrency is how many blocks are checksummed at once when the store starts.
	DefaultVerifyConcurrency = 4
	// DefaultFlushInterval is how often Run writes access statistics to the index.
	DefaultFlushInterval = time.Minute
)

// Tier is one level of storage, as a TierPool declares it.
type Tier struct {
	// Name of the tier, such as mem or nvme.
	Name string
	// Medium of the tier; MEM is volatile, so its blocks are not expected to survive a reboot.
	Medium datav1alpha1.Medium
	// Dirs are the tier's directories; blocks are spread over them, the emptiest first.
	Dirs []string
	// Quota is the most the tier may hold, in bytes.
	Quota int64
	// High and Low are the watermarks, as shares of Quota. Both zero means the defaults.
	High, Low float64
}

// TiersFromAPI converts a TierPool's tiers.
func TiersFromAPI(tiers []datav1alpha1.Tier) []Tier {
	out := make([]Tier, 0, len(tiers))
	for _, t := range tiers {
		out = append(out, Tier{
			Name:   t.Name,
			Medium: t.Medium,
			Dirs:   append([]string(nil), t.Paths...),
			Quota:  t.Quota.Value(),
			High:   t.Watermarks.High,
			Low:    t.Watermarks.Low,
		})
	}
	return out
}

// Config configures a Store.
type Config struct {
	// Tiers, fastest first.
	Tiers []Tier
	// IndexDir holds the block index. Put it on a non-volatile disk: an index on tmpfs forgets
	// the blocks of every tier at a reboot.
	IndexDir string
	// Eviction picks the order in which blocks leave a tier.
	Eviction eviction.Config
	// PromotionThreshold is how many reads a block in a lower tier needs before it is
	// queued to move up one tier; 0 means DefaultPromotionThreshold.
	PromotionThreshold int
	// DatasetOf names the Dataset a block belongs to, from its PutOptions.Origin, so that the
	// rules of its Dataset apply to it (SetDatasetRules). Nil puts every block in one unnamed
	// Dataset. It runs with the store's lock held and must not call the store.
	DatasetOf func(origin []byte) string
	// SafeToDrop says whether a block may leave the last tier without being persisted first
	// (it is checkpointed, replicated, or can be read again from the under-store). Nil means
	// the block's Clean flag decides.
	SafeToDrop func(BlockInfo) bool
	// Persist writes a block that is not safe to drop somewhere durable, such as a checkpoint
	// in the under-store, and returns only once it is. The reader fails with ErrCorrupt if
	// the block's bytes do not match its checksum, so a corrupt block is never persisted. Nil
	// means such blocks are never dropped. It runs while the store is making room, so it must
	// not write blocks to the store itself.
	Persist func(ctx context.Context, b BlockInfo, r io.Reader) error
	// OnRemove, when set, is told of every block that leaves the store (dropped from the last
	// tier, deleted, or found corrupt), so that the worker can tell the master it no longer holds
	// it. It runs with the store's lock held: it must return at once and not call the store.
	OnRemove func(BlockInfo)
	// VerifyConcurrency is how many blocks are checksummed at once when the store starts; 0
	// means DefaultVerifyConcurrency.
	VerifyConcurrency int
	// FlushInterval is how often Run writes access statistics to the index; 0 means DefaultFlushInterval.
	FlushInterval time.Duration
	// Now is the clock of access times; nil means time.Now.
	Now func() time.Time
	// Log receives what the store finds on start and what eviction could not do.
	Log logr.Logger
}

// withDefaults returns c with every unset field set to its default.
func (c Config) withDefaults() Config {
	c.Tiers = append([]Tier(nil), c.Tiers...)
	for i := range c.Tiers {
		t := &c.Tiers[i]
		if t.High == 0 && t.Low == 0 {
			t.High, t.Low = DefaultHighWatermark, DefaultLowWatermark
		}
		dirs := make([]string, len(t.Dirs))
		for j, d := range t.Dirs {
			dirs[j] = filepath.Clean(d)
		}
		t.Dirs = dirs
	}
	if c.PromotionThreshold == 0 {
		c.PromotionThreshold = DefaultPromotionThreshold
	}
	if c.SafeToDrop == nil {
		c.SafeToDrop = func(b BlockInfo) bool { return b.Clean }
	}
	if c.VerifyConcurrency == 0 {
		c.VerifyConcurrency = DefaultVerifyConcurrency
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log.GetSink() == nil {
		c.Log = logr.Discard()
	}
	return c
}

// validate reports every problem of a defaulted config at once.
func (c Config) validate() error {
	var errs []error
	if len(c.Tiers) == 0 {
		errs = append(errs, errors.New("at least one tier is needed"))
	}
	if c.IndexDir == "" || !filepath.IsAbs(c.IndexDir) {
		errs = append(errs, fmt.Errorf("index directory %q must be an absolute path", c.IndexDir))
	}
	names := make(map[string]bool)
	dirs := make(map[string]string)
	for i, t := range c.Tiers {
		switch {
		case t.Name == "":
			errs = append(errs, fmt.Errorf("tier %d has no name", i))
		case names[t.Name]:
			errs = append(errs, fmt.Errorf("tier name %s is used twice", t.Name))
		}
		names[t.Name] = true
		if len(t.Dirs) == 0 {
			errs = append(errs, fmt.Errorf("tier %s has no directories", t.Name))
		}
		for _, d := range t.Dirs {
			if !filepath.IsAbs(d) {
				errs = append(errs, fmt.Errorf("tier %s: directory %q must be an absolute path", t.Name, d))
			}
			if other, dup := dirs[d]; dup {
				errs = append(errs, fmt.Errorf("directory %s is in tier %s and tier %s", d, other, t.Name))
			}
			dirs[d] = t.Name
		}
		if t.Quota <= 0 {
			errs = append(errs, fmt.Errorf("tier %s: quota must be positive, got %d bytes", t.Name, t.Quota))
		}
		if !(t.High > 0 && t.High <= 1) || !(t.Low >= 0 && t.Low < t.High) {
			errs = append(errs, fmt.Errorf("tier %s: watermarks need 0 <= low < high <= 1, got low %g and high %g", t.Name, t.Low, t.High))
		}
	}
	if c.PromotionThreshold < 1 {
		errs = append(errs, fmt.Errorf("promotion threshold must be at least 1, got %d", c.PromotionThreshold))
	}
	if c.VerifyConcurrency < 1 {
		errs = append(errs, fmt.Errorf("verify concurrency must be at least 1, got %d", c.VerifyConcurrency))
	}
	if err := c.Eviction.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid tier store configuration: %w", err)
	}
	return nil
}
