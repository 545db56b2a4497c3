// Package fsm is the master's Raft state machine: the metadata (datasets, files, blocks and
// their locations, workers, peers) kept in BadgerDB and changed only by applying Raft log
// entries.
//
// Apply is deterministic: it takes every timestamp from the command envelope, iterates keys in
// Badger's sorted order, and stores each entry's effects together with the entry's index in one
// transaction, so replaying entries after a restart changes nothing. An entry that cannot be
// decoded stops the process: a replica that skipped it would diverge from the others.
//
// Snapshot opens a read-only transaction at the applied index and Persist streams exactly that
// view; Restore drops everything and loads the stream.
package fsm
