// Package blockindex is the worker's local record of the blocks it holds: for each block its
// tier, directory, size, checksum and access history, in a BadgerDB on the node. It also owns
// the on-disk layout of blocks (a block is the file <dir>/<id>; writes go through a
// ".tmp-" file first), so that Reconcile can bring the record and the disks back into
// agreement when a worker starts: entries whose files vanished are dropped, files nobody
// recorded (including the temporary files of torn writes) are removed, and every surviving
// block is read back and checked against its checksum before it is served again.
package blockindex
