// Package bench measures the master the way DFS-Perf's metadata workload does: operations
// per second for create, exists, rename, delete and list, issued by concurrent clients through
// the client package against a three-replica cluster over gRPC and Raft on loopback TCP; plus
// failover time (leader killed to first acknowledged write), the cost of a file in the state
// machine, and a simulated fleet of workers heartbeating (fleet_test.go: the fleet runs in a
// child process, this test binary again, so that the benchmark's process is the replicas').
// It holds only benchmarks; see bench_test.go and fleet_test.go for flags and commands.
package bench
