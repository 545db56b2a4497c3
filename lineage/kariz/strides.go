package kariz

import (
	"math/bits"
	"slices"
)

// Strides chooses which of a file's n strides (blocks) to cache when only count of them fit:
// the first count of the strides in bit-reversed order (the van der Corput sequence). However
// the file is cut into partitions of consecutive strides, each partition gets its share of the
// chosen ones to within one stride per halving (a quarter of the strides is one in every four),
// so that no partition of a step reads all of its part from the under-store while another finds
// all of its part in memory (Kariz §4.2: a prefix cached would leave stragglers). Caching more
// keeps what was chosen for less: count+1 strides are the count strides and one more.
func Strides(n, count int) []int {
	if n <= 0 || count <= 0 {
		return nil
	}
	count = min(count, n)
	width := bits.Len(uint(n - 1))
	out := make([]int, 0, count)
	for i := 0; len(out) < count; i++ {
		// Walk 0, 1, 2, ... of the next power of two, reversed, skipping what is past n.
		j := int(bits.Reverse(uint(i)) >> (bits.UintSize - width))
		if width == 0 {
			j = 0
		}
		if j < n {
			out = append(out, j)
		}
	}
	return out
}

// Share is the blocks of a file of n blocks that hold percent of it (rounded up, at least
// one): Strides of that many, in increasing order. Outside 1–99 percent it is every block.
func Share(n, percent int) []int {
	if percent <= 0 || percent >= 100 {
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		return all
	}
	chosen := Strides(n, max(1, (n*percent+99)/100))
	slices.Sort(chosen)
	return chosen
}
