// Package dataplane moves blocks between cache workers and their clients over gRPC: streamed
// reads of the blocks a worker holds (whole blocks checked against their CRC-32C as they are
// sent) and streamed writes that are checked against their header before the tier store commits
// them. A worker serves only what is in its tiers; fetching from the under-store is the caller's
// business, so that a miss never makes two workers fetch one block.
//
// Peers is the client side: one connection per peer address, kept for reuse.
package dataplane
