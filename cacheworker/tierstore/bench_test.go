package tierstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/strata-cache/strata/cacheworker/eviction"
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

// BenchmarkAPipelineThatRereadsItsInput is DAG-aware eviction (MRD, Kariz), side by side: each
// stage of a pipeline reads the output of the stage before and writes its own, and a last stage
// reads the pipeline's input again with the last output (an evaluation, a join). The memory
// tier holds three Datasets. With the tier's LRU alone, the outputs each stage writes push the
// input out long before its second read; with MRD, fed each Dataset's next use as the operator
// computes it from the Lineages, the outputs no stage reads again leave first and the input
// stays. It reports the share of the pipeline's reads served from memory (hit-%); a miss reads
// the block from the under-store again.
//
//	go test ./cacheworker/tierstore/ -run '^$' -bench APipelineThatRereadsItsInput -benchtime 10x
func BenchmarkAPipelineThatRereadsItsInput(b *testing.B) {
	const (
		blockSize = 64 << 10
		blocks    = 20 // per Dataset
		stages    = 6
	)
	for _, bc := range []struct {
		name string
		mrd  bool
	}{{"tier LRU alone", false}, {"MRD", true}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			dir := b.TempDir()
			s, err := Open(ctx, Config{
				Tiers:     []Tier{{Name: "mem", Dirs: []string{dir + "/mem"}, Quota: 3 * blocks * blockSize, High: 0.95, Low: 0.9}},
				IndexDir:  dir + "/index",
				DatasetOf: func(origin []byte) string { return string(origin) },
			})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			data := bytes.Repeat([]byte{7}, blockSize)
			put := func(dataset string, i int) {
				if _, err := s.Put(ctx, fmt.Sprintf("%s-%d", dataset, i), bytes.NewReader(data), blockSize,
					PutOptions{Clean: true, Origin: []byte(dataset)}); err != nil && !errors.Is(err, ErrExists) {
					b.Fatal(err)
				}
			}
			var hits, reads int
			read := func(dataset string) {
				for i := range blocks {
					reads++
					_, _, err := s.Get(ctx, fmt.Sprintf("%s-%d", dataset, i))
					switch {
					case err == nil:
						hits++
					case errors.Is(err, ErrNotFound):
						put(dataset, i) // a miss: read from the under-store again
					default:
						b.Fatal(err)
					}
				}
			}
			b.ResetTimer()
			for run := range b.N {
				name := func(stage int) string { return fmt.Sprintf("run%d-out%d", run, stage) } // out0 is the input
				for i := range blocks {
					put(name(0), i)
				}
				for stage := 1; stage <= stages+1; stage++ {
					if bc.mrd {
						// What the operator computes: the stage running now reads its input (0),
						// the next stage the output being written (1), the last stage the input
						// again; the outputs read already, nothing.
						rules := map[string]DatasetRules{}
						for out := 0; out < stage; out++ {
							next := NoNextUse
							if out == stage-1 {
								next = 0
							}
							rules[name(out)] = DatasetRules{Eviction: eviction.Config{Kind: eviction.MRD}, NextUse: next}
						}
						rules[name(0)] = DatasetRules{Eviction: eviction.Config{Kind: eviction.MRD}, NextUse: stages + 1 - stage}
						rules[name(stage)] = DatasetRules{Eviction: eviction.Config{Kind: eviction.MRD}, NextUse: 1}
						if err := s.SetDatasetRules(ctx, rules); err != nil {
							b.Fatal(err)
						}
					}
					read(name(stage - 1))
					if stage <= stages {
						for i := range blocks {
							put(name(stage), i)
						}
					} else {
						read(name(0))
					}
				}
			}
			b.ReportMetric(100*float64(hits)/float64(reads), "hit-%")
		})
	}
}
