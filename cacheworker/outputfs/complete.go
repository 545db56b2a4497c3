package outputfs

import (
	"context"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/master/masterpb"
)

// completeRecheck is how long an answer of the master to "is the Dataset complete?" is trusted.
// Writers create files by the thousand; asking once a second costs the master little, and
// a writer that finished does not race the next one.
const completeRecheck = time.Second

// completion remembers whether the Dataset is complete at the master: its writer finished, so
// the mount takes no new files and changes none (masterpb.Dataset.complete).
type completion struct {
	mu        sync.Mutex
	checkedAt time.Time
	complete  bool
}

// writable is 0 while the Dataset takes changes and EROFS once it is complete. When the master
// cannot say, the change goes ahead: sealing asks the master again, and fails if it must.
func (o *output) writable(ctx context.Context) syscall.Errno {
	if o.isComplete(ctx, false) {
		return syscall.EROFS
	}
	return 0
}

// isComplete asks the master whether the Dataset is complete, at most once per completeRecheck
// unless fresh is set.
func (o *output) isComplete(ctx context.Context, fresh bool) bool {
	c := &o.completion
	c.mu.Lock()
	defer c.mu.Unlock()
	if !fresh && time.Since(c.checkedAt) < completeRecheck {
		return c.complete
	}
	mctx, cancel := o.masterContext(ctx)
	defer cancel()
	ds, err := o.cfg.Master.GetDataset(mctx, &masterpb.GetDatasetRequest{Name: o.cfg.Dataset, StaleOk: true})
	switch {
	case status.Code(err) == codes.NotFound:
		// Forgotten for a recomputation: the next seal registers it again, writable.
		c.complete = false
	case err != nil:
		o.log.V(1).Info("cannot ask the master whether the Dataset is complete", "error", err.Error())
		return c.complete
	default:
		c.complete = ds.GetComplete()
	}
	c.checkedAt = time.Now()
	return c.complete
}
