// Package controllers holds the reconcilers of the Strata operator: one small controller per
// responsibility, each wired into the manager by cmd/operator.
//
// The worker reconciler deploys, per TierPool, a DaemonSet of cache workers and the ConfigMap
// with the pool's tiers; the TierPool reconciler computes a TierPool's status (selected nodes,
// ready workers, capacity per tier, readiness) from the cluster's Nodes and that DaemonSet.
package controllers
