package checkpoint

import (
	"context"
	"errors"
	"testing"
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
	held := &heldFile{path: "/x/held", token: "t1"}
	deleted := &heldFile{path: "/x/deleted", token: "t2"}
	replaced := &heldFile{path: "/x/replaced", token: "t3"}
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
