package checkpoint

import (
	"bytes"
	"context"
	"io"
	"testing"
)

// countingWaiter records what a limitedReader asks of its limiter.
type countingWaiter struct{ asked, calls, largest int }

func (w *countingWaiter) WaitN(_ context.Context, n int) error {
	w.asked += n
	w.calls++
	w.largest = max(w.largest, n)
	return nil
}

// TestALimitedReaderAsksTheLimiterForEveryByte: the bandwidth cap holds only if every byte sent
// waits for the limiter, in steps no larger than its burst.
func TestALimitedReaderAsksTheLimiterForEveryByte(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 3*chunk+17)
	w := &countingWaiter{}
	got, err := io.ReadAll(&limitedReader{ctx: context.Background(), r: bytes.NewReader(data), limiter: w})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the bytes read are not those written")
	}
	if w.asked != len(data) || w.largest > chunk {
		t.Fatalf("the limiter was asked for %d bytes (largest step %d), want %d in steps of at most %d", w.asked, w.largest, len(data), chunk)
	}
}
