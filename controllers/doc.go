// Package controllers holds the reconcilers of the Strata operator: one small controller per
// responsibility, each wired into the manager by cmd/operator.
//
// The TierPool reconciler computes a TierPool's status (selected nodes, capacity per tier,
// readiness) from the cluster's Nodes; deploying the worker DaemonSet is a later step.
package controllers
