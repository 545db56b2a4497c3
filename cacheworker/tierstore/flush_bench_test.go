package tierstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/strata-cache/strata/cacheworker/tierstore/tierstoretest"
)

// BenchmarkAFlushOnABusyNode is the access statistics' flush, which the store runs every
// minute, on a node caching 10,000 or 50,000 blocks of which 100 were read since the last flush.
// The reads are not timed.
//
//	go test ./cacheworker/tierstore/ -run '^$' -bench AFlushOnABusyNode -benchtime 200x
func BenchmarkAFlushOnABusyNode(b *testing.B) {
	const read = 100
	for _, cached := range []int{10_000, 50_000} {
		b.Run(fmt.Sprintf("%d blocks", cached), func(b *testing.B) {
			ctx := context.Background()
			store := tierstoretest.BusyNode(b, cached, 0)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				for j := range read {
					if _, _, err := store.Get(ctx, fmt.Sprintf("src-%06d", (i*read+j)*7919%cached)); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				if err := store.FlushStats(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/flush")
		})
	}
}
