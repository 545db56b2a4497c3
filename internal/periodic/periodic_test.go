package periodic

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
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

// TestWatchFileAppliesEachNewContentOnce checks that a file is applied at once, again only
// when it changes, that a refused content is not retried until it changes, and that a missing
// file reads as empty.
func TestWatchFileAppliesEachNewContentOnce(t *testing.T) {
	p := filepath.Join(t.TempDir(), "settings.json")
	if err := os.WriteFile(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applied := make(chan string, 10)
	go WatchFile(ctx, p, 5*time.Millisecond, logr.Discard(), func(raw []byte) error {
		applied <- string(raw)
		if string(raw) == "bad" {
			return errors.New("refused")
		}
		return nil
	})
	next := func(want string) {
		t.Helper()
		select {
		case got := <-applied:
			if got != want {
				t.Fatalf("applied %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q was never applied", want)
		}
	}
	next("one")
	for _, content := range []string{"bad", "two"} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		next(content)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	next("")
	NewWithT(t).Consistently(applied).WithTimeout(50*time.Millisecond).ShouldNot(Receive(),
		"ten more reads of the same (missing) file apply nothing")
}
