// Package controllers holds the reconcilers of the Strata operator: one small controller per
// responsibility, each wired into the manager by cmd/operator.
//
// The worker reconciler deploys, per TierPool, a DaemonSet of cache workers and the ConfigMap
// with the pool's tiers; the TierPool reconciler computes a TierPool's status (selected nodes,
// ready workers, capacity per tier, readiness) from the cluster's Nodes and that DaemonSet.
//
// The Dataset reconciler checks what a Dataset names, gives it a PersistentVolume and a claim
// of its name, and reports what the workers hold of it. The provisioner gives a claim of a
// Strata StorageClass an output volume, and deletes the volume with the claim when its policy
// says so.
//
// # Lineages
//
// The Lineage reconciler runs a pipeline. It checks a Lineage against its namespace (inputs
// that exist, outputs that name it, no cycle through other Lineages) and runs its Job from the
// template, once, when every input is available: a Dataset read from a source once Ready, an
// output of another Lineage once that Lineage's Job wrote it. So applying the steps of a
// pipeline in any order runs them in dependency order. A Job that fails is reported, not
// retried.
//
// It then follows the outputs at the master: InMemory while every block has a live copy, Lost
// when a block has none (its node is gone), Checkpointed when the files are in the
// under-store; and the depth of uncheckpointed lineage ending at each Lineage (status and the
// strata_operator_lineage_uncheckpointed_depth gauge). A lost output is recomputed
// (lineage_recompute.go): once its inputs are available again (asked of the master and of the
// parent's recomputation Jobs, not of the parent's status, which may lag a loss), so that a
// chain recovers parents first, a Job from the template is created suspended, the master
// forgets the outputs, and the Job runs and writes them again, at the lowest PriorityClass, raised to the highest priority of the pods that mount the lost data by
// recreating the Job while its pod waits for a node (Tachyon's priority inheritance), at most
// spec.maxRecomputations times.
package controllers
