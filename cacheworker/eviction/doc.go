// Package eviction ranks the blocks of one tier so that the tier store knows which block to
// move down (or drop) first when the tier passes its high watermark.
//
// A Policy keeps its own logical clock that ticks once per reference (Add or Touch). Ranking by
// references rather than wall time is what the LRFU paper does, and it makes the limits exact:
// LRFU with lambda 0 orders blocks exactly like LFU and with lambda 1 exactly like LRU, no
// matter how fast or slow the accesses come. It also means no policy needs a clock injected.
//
// Policies are not safe for concurrent use; the tier store serialises calls under its lock.
package eviction
