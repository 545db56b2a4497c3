// Package client talks to a master cluster. Given the addresses of some replicas, it finds the
// leader, follows NOT_LEADER redirects, and retries with backoff while an election is under way
// or a replica is down, within the caller's context deadline.
//
// Retried writes are at least once. CreateFile carries a client token, so a create retried after
// an ambiguous failure (the leader died after committing it) succeeds instead of reporting
// ALREADY_EXISTS; DeleteFile treats NOT_FOUND after an ambiguous attempt as done. Other writes
// may report the outcome of their own earlier attempt (a retried rename may find its source
// gone).
package client
