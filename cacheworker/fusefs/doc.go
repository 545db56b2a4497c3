// Package fusefs serves one Dataset as a read-only FUSE file system: the folder tree of its
// under-store objects, whose reads go through the worker's block cache. Requests are decoded
// by go-fuse's protocol server and answered by a raw file system of our own (rawfs.go), over a
// connection of package fuseconn, which another process can take over (see "Handing over").
//
// # The tree
//
// The objects are listed at mount (Store.List("")), and again at each Refresh, and their keys split on "/" into
// folders; a key ending in "/" is a folder marker, so empty folders show. Sizes and mtimes
// come from the listing (a folder's mtime is the newest of its content), modes are 0444 for
// files and 0555 for folders, owned by root, so that pods running as any user can read and
// none can write. Every node is numbered at mount, depth first in name order, and its number
// is both its inode number and its FUSE node id; nodes are never forgotten (a refresh numbers
// its new nodes after the last). Keys that cannot be
// paths ("a//b", "..", longer than NAME_MAX) are left out and logged, and so is an object
// whose key is also a folder of other objects ("a" next to "a/b"), which S3 allows and a
// file system cannot show. The rules are package objtree's, which the operator applies to its
// own listing of the source: the Dataset's status counts the files the tree shows and names
// what it leaves out (status.leftOut), with a Warning event.
//
// # Versions
//
// Each file is the version of its object the listing named (its ETag: S3's, or a file's size
// and modification time), and only that version is read: block ids name it (cache.BlockID),
// and a block not cached is fetched with the store's conditional read (understore's
// ReadVersionAt: If-Match for S3 and claim servers, a check of the open file for paths). So no
// read mixes bytes of two versions. A file whose object was replaced in the under-store after the
// listing reads on from the blocks of its version that are cached anywhere in the cluster, and
// a block that is not fails with EIO and a log line naming the object and the version listed;
// a block shorter than the listing said fails the same way rather than returning short data. A
// refresh, or a mount made later, lists again and reads the new version whole.
//
// # Refreshing
//
// Refresh (sync.go) lists again and compares with the tree by key, kind, size, ETag and
// modification time. Unchanged files and folders keep their nodes; new ones get new node ids;
// a removed file is retired, and so is a changed one, whose new version gets a node of its
// own: a node never changes, so a file opened before the refresh reads on the version it
// opened (whole, or EIO where a block of it is no longer to be had), never a mix of two. The
// kernel is told what changed, after the tree is swapped: FUSE_NOTIFY_INVAL_ENTRY for every
// name that appeared, vanished or leads to a new node (dropping negative entries too), and
// FUSE_NOTIFY_INVAL_INODE for every folder whose listing or time changed (dropping its cached
// listing and attributes). So the long timeouts below stay right. A listing that fails changes
// nothing. Retired nodes stay in the node list for the ids the kernel may hold; a mount that
// lives through many refreshes grows by one node per new or changed object.
//
// # Reads
//
// A read of [off, off+n) is cut into blocks of the cache's block size. Each block comes from
// the local tier's file when Config.Local is set and a tier holds it (pread, no copy of the
// whole block), and otherwise through BlockReader.ReadBlock: the read-through cache, which
// reads the local tiers, then a peer, then the under-store, and stores what it fetched. An
// open file keeps the block it used last, so that a sequential reader, whose requests are
// far smaller than a block, opens or fetches each block once; and one that moves on to the
// next block (or starts at the first) has the block after prefetched (Prefetcher), so that
// its fetch overlaps the reads of this one. Reads past the end are short.
// A read whose every block a local tier holds is answered by splicing (ReadRanges, and
// fuseconn's splice.go): the kernel moves references to the blocks' pages into a pipe and
// copies them once into the request, where a pread and a reply copy them twice through the
// worker. Mounts ask for reads of at most fuseconn.MaxReadRequest, a page short of 1 MiB, so
// that an answer fits a pipe of the size any process may make; reads of a mount an older
// worker made (1 MiB), and reads of blocks not local, are answered by Read.
// Failures are EIO (ENOENT for an object gone from the under-store, EINTR for an interrupted
// reader), logged once per file and block.
//
// # Kernel caching
//
// The tree changes only by refreshes, which tell the kernel, so the kernel may trust names,
// attributes and missing names for a long time (24 hours) without asking, and opens return
// FOPEN_KEEP_CACHE so that the file's pages stay in the page cache from one open to the next:
// re-reads by any pod of the node never reach the worker. A node's bytes never change (a new
// version is a new node), so its pages never need dropping.
//
// # Passthrough
//
// With FUSE passthrough (Linux 6.9 and later) the kernel reads an open file straight from a
// backing file the server registered for it, without a round trip to the server. It applies
// only to a file whose whole content is one block held in a local tier: the kernel takes one
// backing file per inode (FUSE_DEV_IOC_BACKING_OPEN gives an id, FOPEN_PASSTHROUGH with that
// id answers the open) and maps file offsets to the same offsets of that file; it has no
// way to map ranges of one file onto several files. A file of several blocks is therefore
// always served by the worker. Passing those through would need either a layout that keeps
// every file of a Dataset whole in one tier file (a block size at least the file's size, or
// a file-per-object tier format), or a kernel that maps ranges of a FUSE file to ranges of
// several backing files, which Linux's passthrough (one backing file per inode) does not do.
//
// For one-block files whose block is local, opens are passed through (see rawFS in
// passthrough.go for how opens in the two modes are kept apart, which the kernel requires).
// Then reads bypass the worker entirely: the block is counted as accessed once per open for
// eviction, not per read, and reads are not in the FUSE metrics. The registered file keeps
// the block's bytes alive if the tier evicts or moves it meanwhile (an open file outlives its
// unlink), until the last passthrough open of the file closes. A file whose block is not
// local yet is opened in cached mode; its read fetches the block, and later opens (once the
// cached ones have closed) are passed through.
//
// # Handing over
//
// A FUSE mount stays up as long as some process holds its /dev/fuse descriptor; its requests
// wait in the kernel while none reads them. Handover gives a process what another needs to go
// on serving the mount: the connection, the state (mount point, node list, and the INIT
// request the kernel sent at mount, made anew after a refresh) and the table of open files
// (opens.go, grown by refreshes that add nodes), all as files that
// can cross a Unix socket and outlive their maker. Resume, in the other process, rebuilds the
// node list, so that the kernel's node ids name the same files; replays the INIT through its
// own protocol server, so that both agree on what was negotiated; and asks the kernel
// (FUSE_NOTIFY_RESEND, Linux 6.9) to send again the requests the earlier process read but
// never answered, those a killed process took with it. Handles need nothing handed over: a
// read with a handle this process never made opens one, and a handle's number says whether
// the open was passed through, so its RELEASE is counted right. Suspend stops serving without
// ending the mount: requests being answered are answered, the reader stops at its next read,
// and nothing the kernel queued is lost. The worker's mounter keeps the handover in the CSI
// node plugin's file descriptor store (internal/fdstore), so that pods' mounts outlive worker
// restarts and upgrades; see cacheworker/mounter.
//
// Go's os.Open adds every file to an epoll set, and for a FUSE file the kernel asks the
// server whether it supports poll from inside epoll_ctl or epoll_wait. The connection's
// reader waits on that same epoll_wait in this process, so Mount first makes the kernel learn
// that the file system does not support poll (fuseconn.DisableFilePolling); the kernel remembers it
// for the connection, across handovers.
//
// # Mounting and unmounting
//
// Mount uses mount(2) directly (the worker runs privileged, CAP_SYS_ADMIN), with "ro",
// allow_other and default_permissions. Unmount unmounts the folder and
// waits for the kernel to end the file system; if a pod's bind mount of it remains, the
// folder is unmounted but the file system is served until that goes (ErrStillMounted), so a
// pod never sees its files vanish.
package fusefs
