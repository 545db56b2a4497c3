// Package outputfs serves an output Dataset, one that a pipeline step writes, as a writable
// FUSE file system on the worker of the writer's node. What a step writes goes into that
// node's top tier, one copy, with no network write on the way: lineage (recomputation) and
// checkpoints make it durable, not replicas.
//
// # Files are written once
//
// A file is created, written (at any offsets, by any number of handles, while it is open for
// writing) and sealed when its writer closes it: the close that leaves no other handle open for
// writing. Until then its bytes live in staging files of the mount, one per block of the file
// (Config.StagingDir, which the worker puts on the top tier's file system, tmpfs for MEM), and
// only this node sees the file. Sealing makes it part of the Dataset, whole or not at all for
// other nodes:
//
//   - each block's staging file becomes a block named "<token>-<index>" (the token is the file
//     version's 128 random bits) in the tier store, unclean (its bytes exist nowhere else, so
//     the store never drops it without persisting it first): the store links the staging file
//     into the tier's folder (tierstore.Store.Adopt), so that sealing copies no byte and needs
//     no memory beyond the file's own (a store whose folder is on another file system copies
//     it); the staging files go once the seal succeeded;
//   - a file of at most 64 blocks (maxSealBlocks) is then published with all its blocks, this
//     worker as their location, in one master command (SealFile, the token as its client
//     token, so that a retry finds the file it made);
//   - a larger one is created first under a sealing folder of the Dataset (SealingDir), each
//     block committed as it is stored, and renamed to its path at the end.
//
// A sealed file is immutable: opening it for writing, truncating it or writing through a
// handle that outlived the seal fails with EPERM, and its write bits are cleared.
//
// # Attempts
//
// When Config.Callers says which pod and container created a file, the file is sealed as that
// pod's attempt (masterpb.File.attempt), and the master keeps it out of the Dataset until the
// operator settles the attempt: published when the pod succeeds, discarded when it fails. Other
// nodes never show an attempt's file. A pod killed mid-write leaves its open files sealed (its
// exit closed them); the Job's retry, another pod (or a restarted container), opening one of
// those paths to write is told the open is stale (ESTALE), as for a forgotten file below: the
// old node leaves the tree and the kernel creates the file anew, which the master lets replace
// the killed attempt's version. A published file is never replaced. A file of an attempt that
// was discarded fails to open with ENOENT. The seal runs
// in FLUSH (close(2)) when possible, so that close returns only once the file is in the Dataset
// and reports what went wrong (EEXIST when another node sealed the same path first, ENOSPC when
// the tier is full of data that is not checkpointed yet, EIO when the master cannot be
// reached). A failed seal leaves the file unsealed, its bytes staged, until it is written and
// closed again. RELEASE seals a file whose last writer went without a FLUSH.
//
// Blocks are named by the file's token, not its path, so that readers on any node find them
// from the master's record alone. Renaming a sealed file or a folder that holds one would leave
// the blocks' origins (the path they are reported under when a worker registers again) stale, so
// it fails with EXDEV, which makes mv(1) copy instead. Unsealed files and empty folders rename
// freely.
//
// # Reading
//
// A mount starts with the Dataset's sealed files as the master lists them, and looks up and
// lists folders at the master again, so that files other nodes seal later appear. Opening a
// sealed file asks the master whether it is still the Dataset's version (one lost and forgotten
// for a recomputation waits for the new one, below), unless the Dataset is complete: its files
// then change only once the operator opens it again, which the mount learns within a second, so
// that a later step's walk of it costs no round trip per file. Blocks are
// read from a local tier when one holds them (spliced from the blocks' files into the FUSE
// device, splice.go, so that the worker copies none of their bytes) and otherwise from the
// worker that does (Peers), or else from the file's checkpoint. A file none of these has was lost with its node: when the
// master says that something writes it again (the operator sets masterpb.DatasetRecovery for
// the outputs of Lineages, which recompute them), its reads, and opens once the master forgot
// it, wait for the new version, up to the wait the master gives (a CachePolicy's
// recovery.readWait), and fail with EIO when the recovery fails or the wait runs out (recovery.go);
// otherwise they fail with EIO at once. An unsealed file reads back from its staging files.
//
// # Complete Datasets
//
// Once the Dataset's writer has finished (the operator marks it complete at the master when the
// Lineage's Job succeeds), the mount takes no more changes: creating, removing or renaming
// fails with EROFS, and a file still open for writing is not published (its close is EROFS).
// A recomputation makes the master forget the Dataset, which opens it again, through the same
// mount: the next seal registers it anew.
//
// # Restarts
//
// A mount outlives the worker process that serves it, whether the process stops (an upgrade, a
// rollout) or is killed: writers go on writing through the descriptors they hold, readers go on
// reading, and the files written before are there. Requests wait in the kernel meanwhile.
//
// The mount is served over go-fuse's raw API on a connection of package fuseconn, which another
// process can take over (Handover, Suspend, Resume; the worker's mounter keeps the handover in
// the CSI node plugin's file descriptor store). Node ids are the tree's own, never reused, so
// that the kernel's ids name the same nodes in the next process. The tree is rebuilt from a
// journal (journal.go): every change the kernel is told of is appended to a memfd, handed over
// with the connection, before it is answered. Bytes are not journaled: a file being written
// keeps them in its staging files, which outlive the process in the top tier's folder, and its
// size and mtime are read from there. Handles carry nothing a new process needs but whether
// they may write (a bit of the handle's number); each reader's cached block is made afresh.
//
// A killed process may have read requests it never answered; the kernel sends them again
// (FUSE_NOTIFY_RESEND, Linux 6.9). Changes that must not be made twice (a create, a mkdir, a
// writer's open or release, a rename or removal) are journaled with the request's id, and a
// resent request found in the journal is answered without making its change again. A seal a
// killed process left half done is finished by the next close or release: blocks already
// stored are kept, and a file already published is only recorded.
//
// The journal is compacted as it grows (to the tree it describes, with the requests in
// flight), and the new one handed to whoever holds the handover before the old one is let go,
// so that its size follows the tree's, not the mount's history. What a takeover cannot keep: a
// kernel before 6.9 cannot send again the requests a killed process held, whose callers then
// wait until interrupted.
package outputfs
