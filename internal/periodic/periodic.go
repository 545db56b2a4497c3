// Package periodic runs background work at a fixed interval: the sweeps, checks and refills
// the worker, the master and the CSI plugin each keep doing while they run.
package periodic

import (
	"context"
	"time"
)

// Every calls fn with the time of each tick, every interval (the first after one interval, not
// at once), until ctx ends. A call that takes longer than interval delays the next rather than
// overlapping it.
func Every(ctx context.Context, interval time.Duration, fn func(ctx context.Context, now time.Time)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			fn(ctx, now)
		}
	}
}
