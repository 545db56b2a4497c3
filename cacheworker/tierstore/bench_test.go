package tierstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
)

// BenchmarkAScanAgainstAHotDataset is cache pollution, side by side: Dataset hot rereads a
// working set that fits the memory tier while Dataset scan streams through blocks read once.
// With the tier's LRU alone the scan pushes the working set out every round; with the scan held
// to a share of the tier by its CachePolicy's watermarks, the working set stays. It reports the
// share of hot's reads served from memory (hot-hit-%), and the time per block written or read.
//
//	go test ./cacheworker/tierstore/ -run '^$' -bench AScanAgainstAHotDataset -benchtime 20x
func BenchmarkAScanAgainstAHotDataset(b *testing.B) {
	const (
		blockSize  = 64 << 10
		quota      = 100 // blocks in the memory tier
		workingSet = 60  // hot's blocks, reread every round
		scanned    = 80  // scan's new blocks per round, read once
	)
	for _, bc := range []struct {
		name  string
		rules map[string]DatasetRules
	}{
		{"tier LRU alone", nil},
		{"scan held to 20% of the tier", map[string]DatasetRules{"scan": {High: 0.2, Low: 0.1}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			dir := b.TempDir()
			s, err := Open(ctx, Config{
				Tiers:     []Tier{{Name: "mem", Dirs: []string{dir + "/mem"}, Quota: quota * blockSize, High: 0.95, Low: 0.9}},
				IndexDir:  dir + "/index",
				DatasetOf: func(origin []byte) string { return string(origin) },
			})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			if err := s.SetDatasetRules(ctx, bc.rules); err != nil {
				b.Fatal(err)
			}
			data := bytes.Repeat([]byte{7}, blockSize)
			put := func(id, dataset string) {
				if _, err := s.Put(ctx, id, bytes.NewReader(data), blockSize, PutOptions{Clean: true, Origin: []byte(dataset)}); err != nil {
					b.Fatal(err)
				}
			}
			var hits, reads int
			next := 0
			b.ResetTimer()
			for range b.N {
				for i := range workingSet {
					id := fmt.Sprintf("hot-%d", i)
					reads++
					_, _, err := s.Get(ctx, id)
					switch {
					case err == nil:
						hits++
					case errors.Is(err, ErrNotFound):
						put(id, "hot") // a miss: read from the under-store again
					default:
						b.Fatal(err)
					}
				}
				for range scanned {
					put(fmt.Sprintf("scan-%d", next), "scan")
					next++
				}
			}
			b.ReportMetric(100*float64(hits)/float64(reads), "hot-hit-%")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(workingSet+scanned)), "ns/block")
		})
	}
}
