// Package endpoint turns the address of a gRPC endpoint, as the CSI world writes it
// (unix:///path/to/csi.sock, tcp://host:port), into a listener. A Unix socket left behind by a
// plugin that did not stop cleanly is removed first, so that a restarted plugin can listen
// again; a file in the way that is not a socket is never removed.
package endpoint
