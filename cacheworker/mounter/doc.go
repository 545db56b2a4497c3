// Package mounter is the worker's Mounter service (workerpb.MounterServer): the CSI node
// plugin asks it, over a Unix socket on the node, to serve a Dataset, and bind-mounts the
// folder it answers with into the pod's volume. The FUSE file system lives in the worker, not
// in the plugin, so that restarting the plugin never breaks a pod's mount.
//
// MountDataset validates the request (a UID of letters, digits and '-', a DNS-label
// namespace and a DNS-subdomain name; a source and read-only for an input, no source for an
// output, which is writable), then, holding that UID's lock: answers with the
// existing mount if the Dataset is mounted with the same source (idempotent, as CSI requires;
// a different source is FAILED_PRECONDITION), or opens the under-store
// (understore.Open), makes the Dataset's read-through cache (its blocks named by the UID,
// reported to the master as /datasets/<namespace>/<name>/<uid>/<file> when Config.Stored is set)
// and mounts a fusefs file system at MountsDir/<uid>; an output gets an outputfs file system
// there instead, its files staged under Outputs.StagingDir/<uid>. Under-store failures say what to fix:
// missing credentials are INVALID_ARGUMENT, access denied and a missing bucket or path
// FAILED_PRECONDITION, an unreachable store UNAVAILABLE, each naming the store.
//
// Credentials are not part of what must match: a rotated Secret must not fail new pods of a
// Dataset whose mount works. New credentials take effect when the Dataset is mounted afresh.
//
// UnmountDataset unmounts the folder (retrying a while if busy, then FAILED_PRECONDITION),
// stops the cache and removes the folder; an unknown UID succeeds. If pods still mount the
// Dataset through their bind mounts, the folder is unmounted and the call succeeds, but the
// file system is served until the last of them goes.
//
// Calls for one UID take turns (a per-UID lock held for the whole call, which makes repeated
// and concurrent MountDataset calls idempotent); calls for different UIDs run in parallel,
// and no lock shared by all UIDs is held across I/O.
//
// With Config.Handovers (the CSI node plugin's file descriptor store), every mount's FUSE
// connection, inputs' and outputs' alike, is also held outside the worker, so the mounts pods hold outlive a worker
// restart: Close, at shutdown, stops serving them without unmounting, and Recover, at start,
// takes them over (see handover.go) and detaches whatever else an earlier worker left in
// MountsDir. Without it, Close unmounts everything and a worker restart breaks pods' mounts.
package mounter
