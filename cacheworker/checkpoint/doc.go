// Package checkpoint writes the output files a worker holds to their under-store, so that an
// output outlives the loss of its node without a recomputation (Tachyon §4, Edge checkpointing),
// and reads them back when their blocks are gone.
//
// # Where and how
//
// An output Dataset names its target in spec.checkpoint (an S3 bucket and prefix, and a Secret
// of its namespace); its CachePolicy's spec.checkpoint says how. The operator serves both, with
// the Secret's keys read at each request, as one settings document per TierPool (File) to that
// pool's workers alone, over mutual TLS; the worker asks every few seconds and applies what
// changed (Apply). No Secret holds the keys of several namespaces. A file is written under its path
// in the Dataset: the file a/b.parquet of a Dataset checkpointed to s3://bucket/prefix becomes
// s3://bucket/prefix/a/b.parquet, a copy any S3 client can read.
//
// Each file of an output lives on one node, the writer's, whose worker sealed it into blocks of
// its top tier. That worker checkpoints it: it holds every byte, so a checkpoint moves each byte
// once, from memory to the under-store, and never over the pod network first. Replicas
// (package replication) put copies of its blocks on other nodes: a node that holds copies of
// only some of them leaves the file to one that holds it whole, and marks its copies clean once
// the master records the checkpoint.
//
// # In the background
//
// Run looks at the output files the tier store holds whose blocks are not clean (not
// checkpointed) and writes one file at a time, within the Dataset's bandwidth cap, as many as
// its plan picks from one look (a look lists the blocks not yet clean, which the tier store
// keeps apart from the cached copies a node mostly holds) for up to a second before it looks
// again:
//
//   - strategy Edge: per CachePolicy, a lineage.Planner picks the oldest leaf of the lineage
//     graph (a file of a Dataset no Lineage has read yet: the newest data, whose loss would cost
//     the longest chain of recomputations) or, for the policy's share 1-c of the time, the most
//     read hot file (read more than hotReads times). Files of a consumed Dataset that are not hot
//     are never written: the leaves computed from them are, which bounds any recomputation.
//   - strategy Interval: each file at the first tick of the interval after it was written,
//     oldest first, ticks counted from the Dataset's creation.
//   - strategy None, a Temporary Dataset, and files matching temporaryPathPatterns: never in the
//     background. A temporary file deleted before memory runs short never reaches the under-store.
//
// A file written is recorded at the master (CheckpointFile, with its version's token, so that
// a checkpoint of an older version is never recorded on a newer one, and the object's version
// as the under-store gave it), and then its blocks are
// marked clean in the tier store: from then on they may leave memory without another copy. A
// write that fails (the under-store unreachable, the credentials refused) is logged and counted,
// and the file is tried again after a backoff of 5 s doubling up to 5 min; meanwhile the next
// file goes.
//
// # Versions in the bucket
//
// A path is written again when its output is recomputed (the old version forgotten at the
// master first) or retried by another attempt, and the old version's upload may still be under
// way, or about to start, on another node. The token check at the master keeps it from being
// recorded; what keeps it out of the bucket is the order of the looks: a checkpoint looks at
// the object (its ETag, or none), then at the master's record, and writes conditionally on what
// it saw (S3's If-Match and If-None-Match, checked by the server when the object lands). (It
// asks the master once before the look too, so that a file not to be written, an attempt's or
// a forgotten one, costs the under-store no request.) A newer version's upload that lands after the look makes the old one fail with
// understore.ErrChanged; one that landed before it belongs to a version published before the
// look at the master, which then says the old version is gone. A write that another lands
// before looks again (up to three times). A write through, of a file not published yet, writes
// over what it sees, conditionally too. A read back reads only the object's version the master
// recorded: an object replaced since (by hand, or by a second writer of a new path whose seal
// then failed) is refused, and the record cleared, so that the file counts as lost and is
// recomputed rather than read with another file's bytes. An S3 store that ignores the
// conditional headers gets the old behaviour, and the read back still refuses what it replaced.
//
// # At once
//
//   - Persist is the tier store's persist callback: before the store drops the only copy of a
//     block (its last tier is full of uncheckpointed output), the whole file goes to the
//     under-store, without the bandwidth cap, whatever the strategy, temporary or not. A block
//     of a Dataset with no target stays, and a tier full of such blocks refuses writes (ENOSPC
//     to the writer's close), so nothing is ever dropped that exists nowhere else.
//   - WriteThrough is called by an output mount before it publishes a sealed file: a file above
//     the Dataset's syncWriteThreshold is written before the writer's close returns, and a
//     failure fails the close, as a synchronous write would.
//
// # Reading back
//
// ReadBack reads a block of a file from its checkpoint when no worker holds it (its node was
// lost, or memory dropped it once it was checkpointed), if the master records a checkpoint of
// that version of the file; it keeps the block, clean, in the tier store for the next reads.
// An output whose lost files all have checkpoints is not lost: the master counts only files
// with neither a live copy nor a checkpoint as lost (DatasetUsage.lost_files), and only those
// make the operator recompute.
package checkpoint
