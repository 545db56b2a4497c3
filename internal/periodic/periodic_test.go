package periodic

import (
	"context"
	"testing"
	"time"
)

// TestEveryTicksUntilTheContextEnds checks that fn is not called at once, is called on each
// tick, and that Every returns once ctx ends.
func TestEveryTicksUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan time.Time, 10)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		Every(ctx, 10*time.Millisecond, func(_ context.Context, now time.Time) {
			calls <- now
			if len(calls) == 3 {
				cancel()
			}
		})
		close(done)
	}()
	<-done
	if len(calls) != 3 {
		t.Fatalf("got %d calls, want 3 (the third cancelled)", len(calls))
	}
	if first := <-calls; !first.After(start) {
		t.Errorf("the first call came at %v, not after the first tick", first)
	}
}
