// Package mastertest runs master clusters inside one test process: real Raft peers over
// raft.InmemTransport (which can cut a peer off) or loopback TCP, real Badger directories under
// the test's temporary directory, and optionally real gRPC servers on 127.0.0.1. Tests and
// benchmarks use it to kill, partition, restart and wipe replicas.
package mastertest
