// Package store runs one master replica: hashicorp/raft with its log, stable store and
// snapshots on disk (BadgerDB for the log and stable store, files for snapshots) and the
// state machine of package fsm.
//
// Writes go through Apply, on the leader only; elsewhere they fail with a *NotLeaderError that
// names the leader's gRPC address, so the layer above can redirect. VerifyRead makes local
// reads linearizable on the leader. Join adds servers idempotently. Multi-step operations
// (deleting a dataset, declaring a worker lost) are sequences of commands, each one Badger
// transaction.
package store
