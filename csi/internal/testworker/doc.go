// Package testworker is a cache worker's Mounter service for tests of the CSI node plugin: a
// real gRPC server on the Unix socket <dir>/<pool>/mount.sock, where the node plugin dials it,
// that "mounts" a Dataset by creating a real directory (holding one file) under a temporary
// folder and returns its path. It keeps the Mounter's contract: mounting a mounted Dataset
// returns the same path, changing its source or read-only flag is FailedPrecondition, and
// unmounting what is not mounted succeeds. It records the calls it served.
package testworker
