package locations

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/periodic"
	"github.com/strata-cache/strata/master/masterpb"
)

// DatasetReader is the part of the master client the sweeper uses.
type DatasetReader interface {
	GetDataset(ctx context.Context, req *masterpb.GetDatasetRequest) (*masterpb.Dataset, error)
	GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error)
}

// SweptStore is the tier store, as the sweeper uses it.
type SweptStore interface {
	Blocks() []tierstore.BlockInfo
	Delete(ctx context.Context, id string) error
}

// Sweeper removes the blocks of deleted Datasets that the tier store would otherwise keep for
// ever: unclean blocks (written outputs, with no copy elsewhere) are never evicted without being
// persisted, so when their Dataset is deleted (a Dataset, or the claim of a provisioned volume)
// nothing else would free them. Clean blocks of deleted Datasets are left to eviction.
type Sweeper struct {
	Master DatasetReader
	Store  SweptStore
	// Grace is how old a block must be before it is swept, so that a block being written, whose
	// Dataset a worker registers as it reports it, is never taken for an orphan.
	Grace time.Duration
	Log   logr.Logger
	Now   func() time.Time
}

// Sweep removes every unclean block, older than Grace, that the master says is an orphan (a
// linearizable read: never a stale answer): its Dataset does not exist, or its file was written
// again since under another token (an output recomputed after a loss names its blocks by the
// new file's token; see outputfs). It stops at the first other failure to reach the master,
// since it cannot tell then what is deleted. A block whose file is simply absent is kept: a
// block written through the data plane may wait for its report, and its file with it.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	deleted := map[string]bool{} // Dataset name → known deleted
	removed := 0
	var errs []error
	for _, b := range s.Store.Blocks() {
		if b.Clean || len(b.Origin) == 0 || now().Sub(b.Created) < s.Grace {
			continue
		}
		var origin workerpb.BlockOrigin
		if err := proto.Unmarshal(b.Origin, &origin); err != nil || origin.GetDataset() == "" {
			continue
		}
		name := origin.GetDataset()
		gone, known := deleted[name]
		if !known {
			_, err := s.Master.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: name})
			switch {
			case err == nil:
			case status.Code(err) == codes.NotFound:
				gone = true
			default:
				return removed, errors.Join(append(errs, fmt.Errorf("asking the master whether Dataset %s exists: %w", name, err))...)
			}
			deleted[name] = gone
		}
		if !gone && origin.GetFileToken() != "" {
			replaced, err := s.replaced(ctx, origin.GetFileToken(), origin.GetPath())
			if err != nil {
				return removed, errors.Join(append(errs, err)...)
			}
			if !replaced {
				continue
			}
		} else if !gone {
			continue
		}
		if err := s.Store.Delete(ctx, b.ID); err != nil && !errors.Is(err, tierstore.ErrNotFound) {
			errs = append(errs, fmt.Errorf("removing block %s of deleted Dataset %s: %w", b.ID, name, err))
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// replaced says whether the master's file at path is now another version than token's.
func (s *Sweeper) replaced(ctx context.Context, token, path string) (bool, error) {
	f, err := s.Master.GetFile(ctx, &masterpb.GetFileRequest{Path: path})
	switch {
	case status.Code(err) == codes.NotFound:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("asking the master for file %s: %w", path, err)
	}
	return f.GetClientToken() != token, nil
}

// Run sweeps every interval until ctx ends.
func (s *Sweeper) Run(ctx context.Context, interval time.Duration) {
	periodic.Every(ctx, interval, func(ctx context.Context, _ time.Time) {
		n, err := s.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			s.Log.Error(err, "sweeping the blocks of deleted Datasets; trying again later", "removed", n)
		} else if n > 0 {
			s.Log.Info("removed the blocks of deleted Datasets", "blocks", n)
		}
	})
}
