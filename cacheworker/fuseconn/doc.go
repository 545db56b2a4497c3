// Package fuseconn serves FUSE connections in a way another process can take over: the
// connection layer under the worker's file systems, the read-only input mounts (fusefs) and
// the writable output mounts (outputfs).
//
// A connection is served here rather than by go-fuse's fuse.Server because a server must be
// able to take over a connection another process set up: go-fuse's server insists on
// answering the kernel's INIT itself, which the kernel sends once per connection. Requests are
// decoded and answered by go-fuse's ProtocolServer over a file system of the caller's
// (fuse.RawFileSystem); Mount keeps the INIT the kernel sent, and Adopt, in the process taking
// over, replays it through its own ProtocolServer, so that both agree on what was negotiated,
// and asks the kernel (FUSE_NOTIFY_RESEND, Linux 6.9) to send again the requests the earlier
// process read but never answered, those a killed process took with it. Suspend stops serving
// without ending the connection: requests being answered are answered, the reader stops at its
// next read, and nothing the kernel queued is lost.
//
// A FUSE mount stays up as long as some process holds its /dev/fuse descriptor; its requests
// wait in the kernel while none reads them. What a file system must hand over besides the
// connection (its tree, its open files) is its own business.
//
// Go's os.Open adds every file to an epoll set, and for a FUSE file the kernel asks the
// server whether it supports poll from inside epoll_ctl or epoll_wait. The connection's reader
// waits on that same epoll_wait in this process, so Mount makes the kernel learn that the file
// system does not support poll (DisableFilePolling) once it is served; the kernel remembers it
// for the connection, across handovers.
package fuseconn
