package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/periodic"
)

// BlockStore is the part of the tier store Repin works on.
type BlockStore interface {
	Blocks() []tierstore.BlockInfo
	Pin(ctx context.Context, id string, pinned bool) error
}

// RuleStore is the tier store an Applier gives the Datasets' rules to.
type RuleStore interface {
	BlockStore
	SetDatasetRules(ctx context.Context, rules map[string]tierstore.DatasetRules) error
}

// Repin makes the pin of every block of a Dataset that the store holds what set says, and
// returns how many blocks it pinned and unpinned. Blocks without an origin (not a Dataset's)
// are left as they are. A block gone meanwhile is skipped; other failures are joined.
func Repin(ctx context.Context, store BlockStore, set *Set) (pinned, unpinned int, _ error) {
	var errs []error
	for _, b := range store.Blocks() {
		if len(b.Origin) == 0 {
			continue
		}
		var origin workerpb.BlockOrigin
		if err := proto.Unmarshal(b.Origin, &origin); err != nil {
			errs = append(errs, fmt.Errorf("block %s: decoding its origin: %w", b.ID, err))
			continue
		}
		file := strings.TrimPrefix(strings.TrimPrefix(origin.GetPath(), origin.GetRoot()), "/")
		want := set.Pinned(origin.GetDataset(), file, origin.GetIndex(), origin.GetFileBlocks())
		if want == b.Pinned {
			continue
		}
		if err := store.Pin(ctx, b.ID, want); err != nil {
			if !errors.Is(err, tierstore.ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		if want {
			pinned++
		} else {
			unpinned++
		}
	}
	return pinned, unpinned, errors.Join(errs...)
}

// Applier keeps the current policies of a worker: the set new blocks are stored by, the pins of
// the blocks the store holds, and the store's rules for each Dataset.
type Applier struct {
	Store RuleStore
	Log   logr.Logger
	// Applied counts the policy files applied; nil counts nothing.
	Applied prometheus.Counter

	current atomic.Pointer[Set]
}

// Pinned says whether block index of file (of blocks blocks, 0 if not known) of the Dataset
// named dataset at the master is to be stored pinned, by the policies applied last.
func (a *Applier) Pinned(dataset, file string, index, blocks int64) bool {
	return a.current.Load().Pinned(dataset, file, index, blocks)
}

// Current is the set of policies applied last (nil before the first).
func (a *Applier) Current() *Set { return a.current.Load() }

// KeepsReadCopies says whether a node that reads a block of the output named dataset from
// another node keeps it, as a replica: its policy replicates it selectively.
func (a *Applier) KeepsReadCopies(dataset string) bool {
	r, ok := a.current.Load().Replication(dataset)
	return ok && r.Selective
}

// Run watches the policies file at p (see Watch) and applies each new set: pinned or unpinned
// blocks follow at once. Every resweep it repins again, for the blocks stored while a change
// was applied under the set that went before. It returns when ctx ends.
func (a *Applier) Run(ctx context.Context, p string, interval, resweep time.Duration) {
	go periodic.Every(ctx, resweep, func(ctx context.Context, _ time.Time) { a.repin(ctx, "resweep") })
	Watch(ctx, p, interval, a.Log, func(set *Set) {
		if err := a.Store.SetDatasetRules(ctx, set.Rules()); err != nil {
			a.Log.Error(err, "Applying the Datasets' eviction, watermark and promotion rules did not finish; their shares are enforced at the next writes")
		}
		a.current.Store(set)
		if a.Applied != nil {
			a.Applied.Inc()
		}
		a.repin(ctx, "policies changed")
	})
}

func (a *Applier) repin(ctx context.Context, why string) {
	set := a.current.Load()
	if set == nil {
		// No policies read yet: the pins the index kept from before stay as they are.
		return
	}
	pinned, unpinned, err := Repin(ctx, a.Store, set)
	if err != nil {
		a.Log.Error(err, "Some blocks could not be pinned or unpinned; the next sweep tries again", "why", why)
	}
	if pinned+unpinned > 0 || why != "resweep" {
		a.Log.Info("Applied the Datasets' CachePolicies", "why", why, "datasets", set.Datasets(), "pinned", pinned, "unpinned", unpinned)
	}
}
