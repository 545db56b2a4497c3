package throttle

import (
	"bytes"
	"context"
	"io"
	"testing"
)

// countingWaiter records what a Reader asks of its limiter.
type countingWaiter struct{ asked, calls, largest int }

func (w *countingWaiter) WaitN(_ context.Context, n int) error {
	w.asked += n
	w.calls++
	w.largest = max(w.largest, n)
	return nil
}

// TestAReaderAsksTheLimiterForEveryByte: the bandwidth cap holds only if every byte sent waits
// for the limiter, in steps no larger than its burst.
func TestAReaderAsksTheLimiterForEveryByte(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 3*Chunk+17)
	w := &countingWaiter{}
	got, err := io.ReadAll(&Reader{Ctx: context.Background(), R: bytes.NewReader(data), Limiter: w})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the bytes read are not those written")
	}
	if w.asked != len(data) || w.largest > Chunk {
		t.Fatalf("the limiter was asked for %d bytes (largest step %d), want %d in steps of at most %d", w.asked, w.largest, len(data), Chunk)
	}
}
