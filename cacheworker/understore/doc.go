// Package understore reads (and, for checkpoints, writes) the data a Dataset is cached from:
// S3-compatible object stores (through minio-go), a local or NFS path confined under the
// roots an administrator allowed, claims of a Dataset's namespace (pvc://) through the claim
// server the operator runs next to them (ClaimStore, NewClaimServer), and HTTP(S) servers,
// read-only. They share one interface,
// Store, so that more kinds can be added, and one error type, *Error, whose Kind is a
// sentinel callers test with errors.Is: ErrNotFound, ErrAccessDenied, ErrMissingCredentials,
// ErrUnreachable, ErrOutsideRoots, ErrInvalidPath, ErrReadOnly.
//
// ParallelReadAt splits a large ranged read into chunks fetched concurrently, which is how
// cold blocks are read from stores whose single streams are slower than the network.
package understore
