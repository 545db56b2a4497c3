// Package liveness declares workers lost when they stop sending heartbeats. It runs on every
// replica but acts only on the leader, through Raft commands, so the verdict is replicated and
// survives failover; the operator adds its own verdicts (a Node gone NotReady) through the
// MarkWorkerLost RPC.
package liveness
