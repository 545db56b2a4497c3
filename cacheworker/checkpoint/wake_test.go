package checkpoint

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A published file wakes the background loop, whose round looks at every block the store
// holds, only when its Dataset is checkpointed: sealing many small files of a Dataset that is
// not would otherwise cost a round each.
func TestOnlyAFileOfACheckpointedDatasetWakesTheLoop(t *testing.T) {
	settings := settingsOf(t, Dataset{Name: "ns/kept/u1", Root: "/strata/ns/kept", Strategy: "Edge", Target: Target{URI: "s3://bucket/kept"}})
	for _, tc := range []struct {
		name, dataset string
		wake          bool
	}{
		{"a file of a Dataset without checkpoint settings", "ns/scratch/u2", false},
		{"a file of a checkpointed Dataset", "ns/kept/u1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{})
			c.Apply(settings)
			<-c.wake // what Apply asked
			key := fileKey("/x/part-0", "t1")
			c.retries[key] = retry{failures: 1} // the loop saw its blocks before it was published
			c.Published(context.Background(), SealedFile{Dataset: tc.dataset, Path: "/x/part-0", Token: "t1", Size: 1, Blocks: []string{"t1-0"}}, "")
			if woken := len(c.wake) == 1; woken != tc.wake {
				t.Errorf("woke the loop: %v, want %v", woken, tc.wake)
			}
			if _, waits := c.retries[key]; tc.wake && waits {
				t.Error("a checkpointed file published still waits for its retry")
			}
		})
	}
}

// What the checkpointer knows of a file (its retries after failures, that the master no longer
// has it) goes once the file is no longer one to checkpoint: deleted, checkpointed, or of a
// Dataset no longer checkpointed. Kept, it would grow with every file that ever failed.
func TestWhatIsKnownOfFilesNoLongerHeldIsForgotten(t *testing.T) {
	c := New(Config{})
	c.Apply(settingsOf(t, Dataset{Name: "ns/x/u1", Root: "/strata/ns/x", Strategy: "Edge", Target: Target{URI: "s3://bucket/x"}}))
	ds := c.current().of("ns/x/u1")
	held := &heldFile{ds: ds, path: "/x/held", token: "t1"}
	deleted := &heldFile{ds: ds, path: "/x/deleted", token: "t2"}
	replaced := &heldFile{ds: ds, path: "/x/replaced", token: "t3"}
	c.settle(held, errors.New("the under-store is down"))
	c.settle(deleted, errors.New("the under-store is down"))
	c.settle(replaced, errGone)

	c.forgetUnheld([]*heldFile{held})

	if _, ok := c.retries[held.key()]; !ok || len(c.retries) != 1 {
		t.Errorf("retries kept: %v, want only %s's", c.retries, held.path)
	}
	if len(c.gone) != 0 {
		t.Errorf("files known gone kept: %v, want none", c.gone)
	}
}

// A failure is held against the target it was tried with: a file that failed under a target
// since replaced is due at once, whether it failed before the new settings came or after.
func TestANewTargetMakesTheFailedFilesDue(t *testing.T) {
	old := Dataset{Name: "ns/x/u1", Root: "/strata/ns/x", Strategy: "Edge", Target: Target{URI: "s3://bucket/x", Endpoint: "http://down:9000"}}
	fixed := old
	fixed.Target.Endpoint = "http://up:9000"
	other := Dataset{Name: "ns/y/u1", Root: "/strata/ns/y", Strategy: "Edge", Target: Target{URI: "s3://bucket/y", Endpoint: "http://down:9000"}}
	now := time.Unix(1000, 0)
	c := New(Config{Now: func() time.Time { return now }})
	c.Apply(settingsOf(t, old, other))
	before := &heldFile{ds: c.current().of(old.Name), path: "/x/before", token: "t1"}
	after := &heldFile{ds: c.current().of(old.Name), path: "/x/after", token: "t2"}
	unchanged := &heldFile{ds: c.current().of(other.Name), path: "/y/f", token: "t3"}
	c.settle(before, errors.New("the under-store is down"))
	c.settle(unchanged, errors.New("the under-store is down"))

	c.Apply(settingsOf(t, fixed, other))
	c.settle(after, errors.New("the under-store is down")) // its try began under the old target

	for _, f := range []*heldFile{before, after} {
		if !c.retryDue(f, now) {
			t.Errorf("%s, failed under the old target, waits for its backoff", f.path)
		}
	}
	if c.retryDue(unchanged, now) {
		t.Errorf("%s, of a Dataset whose target did not change, is due before its backoff", unchanged.path)
	}
}
