// Package shortcircuit serves short-circuit local reads: a client on the same node as the cache
// worker asks for a cached block over a Unix socket and receives an open, read-only file
// descriptor of the block's file (SCM_RIGHTS), instead of the block's bytes. This is HDFS's
// short-circuit read, done with descriptor passing rather than shared paths.
//
// # Why
//
// Blocks are files on the worker's tiers (see cacheworker/DESIGN.md), so the cheapest way to
// read one is not to copy it through the worker at all. With the descriptor the client reads
// the block straight from the page cache or tmpfs: it can mmap it (no copy), pread the parts
// it needs, or hand it to sendfile or splice. The worker does one open and one sendmsg per
// block, however large the block is, and none of its bytes cross the worker's heap.
//
// The client never needs access to the tier directories: the worker opens the file and the
// kernel hands over the open file, so the tiers stay private to the worker and the block ids
// never become paths on the client's side.
//
// An open file outlives its unlink. If the block is later moved to another tier, evicted or
// deleted, the client's descriptor keeps reading the same bytes until the client closes it;
// the space is freed then. A client that holds descriptors for long therefore holds space the
// worker's quotas no longer count, which is why it should close them once it has read.
//
// # Integrity
//
// The reader has nothing more to check: the store verified the block's CRC-32C when it was
// written, whenever it was copied between tiers, and when the worker started, and blocks are
// immutable. The response carries the checksum (CRC-32C, Castagnoli polynomial), so a client
// that wants end-to-end verification can compute it over the bytes it read and compare.
//
// # Protocol
//
// One connection carries any number of requests, one at a time. A request is a single line of
// JSON, at most 1 KiB with its newline:
//
//	{"v":1,"block":"<id>"}
//
// The response is a single line of JSON. On success it is sent in the same sendmsg as exactly
// one descriptor:
//
//	{"v":1,"size":4194304,"crc32c":3735928559,"tier":"mem"}
//
// and on failure it carries no descriptor:
//
//	{"v":1,"error":"reading block x: block not found","code":"not_found"}
//
// where code is not_found, invalid (a bad block id or request) or internal. A request that
// cannot be decoded, is too long or names another protocol version gets an invalid response
// and the connection is closed; a well-formed request for an invalid or absent block leaves
// the connection open. The worker closes connections that stay idle, and those whose requests
// or responses stall, after timeouts (see WithIdleTimeout and WithIOTimeout); the Client dials
// again when it finds its connection closed.
//
// # Access control
//
// Anyone who can connect to the socket can read every cached block, so access control is the
// socket file itself: internal/unixsock creates it with mode 0660 in a directory of mode 0750,
// and the socket lives in a host directory that only the node's Strata components mount. The
// worker reads each peer's credentials (SO_PEERCRED) when it connects and logs its pid and uid
// with every request at verbosity 1, so reads can be traced to a process.
//
// Opens are counted in strata_worker_short_circuit_opens_total{result="ok|not_found|error"}.
package shortcircuit
