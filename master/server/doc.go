// Package server is the master's gRPC API over a store.Store.
//
// Writes are proposed on the leader. A follower does not forward them: it answers
// FAILED_PRECONDITION with reason NOT_LEADER and the leader's address, which the client package
// follows (see master/DESIGN.md for why redirect rather than forward). Reads are linearizable
// on the leader (store.VerifyRead) unless the request sets stale_ok, which any replica serves
// from its own state.
package server
