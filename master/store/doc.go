// Package store runs one master replica: hashicorp/raft with its log, stable store and
// snapshots on disk (hashicorp/raft-wal's segment files for the log and stable store, files for
// snapshots) and the state machine of package fsm. A log kept in BadgerDB by versions before
// the WAL is moved into it when the replica starts (raftlog.go).
//
// Writes go through Apply, on the leader only; elsewhere they fail with a *NotLeaderError that
// names the leader's gRPC address, so the layer above can redirect. VerifyRead makes local
// reads linearizable on the leader. Join adds servers idempotently. Multi-step operations
// (deleting a dataset, declaring a worker lost) are sequences of commands, each one Badger
// transaction.
package store
