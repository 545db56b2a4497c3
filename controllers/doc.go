// Package controllers holds the reconcilers of the Strata operator: one small controller per
// responsibility, each wired into the manager by cmd/operator.
//
// The worker reconciler deploys, per TierPool, a DaemonSet of cache workers and the ConfigMap
// with the pool's tiers; the TierPool reconciler computes a TierPool's status (selected nodes,
// ready workers, capacity per tier, readiness) from the cluster's Nodes and that DaemonSet.
//
// The Dataset reconciler checks what a Dataset names, gives it a PersistentVolume and a claim
// of its name, and reports what the workers hold of it. It syncs the workers' mounts of a
// Dataset with its source when spec.sync.interval has passed or the sync-requested annotation
// changed (dataset_sync.go, worker_sync.go: each worker of the pool is called over its data
// plane), and checks every minute that a source still answers: a Dataset served before stays
// Ready while its source is down, its SourceReachable condition saying since when (the workers
// mount it with the last good listing, see cacheworker/listings). The provisioner gives a claim of a
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
// It then follows the outputs at the master: InMemory while every file has a live copy,
// Checkpointing and Checkpointed as their files reach the under-store (the workers checkpoint
// them, see cacheworker/checkpoint), Lost when a file has neither a live copy nor a checkpoint
// (its node is gone); and the depth of uncheckpointed lineage ending at each Lineage (status and
// the strata_operator_lineage_uncheckpointed_depth gauge). A lost output is recomputed
// (lineage_recompute.go): once its inputs are available again (asked of the master and of the
// parent's recomputation Jobs, not of the parent's status, which may lag a loss), so that a
// chain recovers parents first, a Job from the template is created suspended, the master
// forgets the outputs, and the Job runs and writes them again, at the lowest PriorityClass,
// raised to the highest priority of the pods that mount the lost data, or lost data downstream
// of it that waits for it (transitively: a pod waiting for C raises the recomputation of every
// lost ancestor of C), by recreating the Job while its pod waits for a node (Tachyon's priority
// inheritance), at most spec.maxRecomputations times. For an Indexed Job whose Lineage maps
// completion indexes to partitions of its outputs (lineage_partitions.go), or is Narrow (index i
// writes output i from input i), only the indexes whose partitions hold lost files rerun, each
// as a Job of one completion that finds its index where an Indexed Job's pod does, and the
// master lets go of those partitions' files alone (the outputs opened again); a Narrow rerun
// waits only for the inputs of the outputs it writes.
// A recomputation that fails leaves what it was to write lost: it is tried again, within
// spec.maxRecomputations. One whose pod is disrupted (preempted by the scheduler for work of
// higher priority, evicted) ends at once (its pod failure policy) and comes back as a new one,
// at the inherited priority, once the master let go of what the killed pod sealed; it does not
// count against the limit. (A replacement pod in the same Job would find those files sealed.)
//
// # Checkpoints and MRD
//
// The worker reconciler also writes each pool's checkpoint settings into a Secret its workers
// mount (worker_checkpoints.go): every output with a spec.checkpoint, its target with the keys of
// its Secret, its CachePolicy's checkpoint settings, and whether a Lineage reads it already (no
// longer the edge of the lineage graph). The Dataset reconciler says in an output's
// CheckpointTargetReachable condition whether the bucket answers to the keys. For the Datasets
// of an MRD CachePolicy, the policies file carries each one's next use, in pipeline stages, from
// the Lineages of the namespace (lineage_stages.go).
package controllers
