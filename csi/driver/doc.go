// Package driver implements the CSI services of Strata's driver csi.strata.dev: Identity,
// Controller (dynamic provisioning of output volumes, kept in a state file) and Node
// (publishing a Dataset into a pod: the node's cache worker serves the Dataset over FUSE and
// the node plugin bind-mounts it read-only onto the pod's target path). Every call is
// validated before it acts, idempotent, and safe to repeat after the plugin restarts, because
// what it did is persisted. See csi/DESIGN.md for the reasons and the security rules.
package driver
