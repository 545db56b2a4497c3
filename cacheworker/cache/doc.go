// Package cache is the worker's read-through block cache: ReadBlock(file, index) serves a
// block from the node's tiers when it is there, and otherwise reads it from the under-store
// in parallel ranges, stores it in the top tier (marked clean, so the last tier may drop it
// without persisting it) and returns it. Concurrent misses on one block fetch it once.
//
// Metrics (hits by tier, misses, under-store fetches, and each tier's bytes, blocks,
// promotions, demotions and evictions) are registered on the registry the caller passes.
package cache
