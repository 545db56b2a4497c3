package daemon

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// StopGRPC lets the calls under way on s finish until ctx ends, then cuts them: a stopping
// daemon neither drops a stream in the middle needlessly nor waits for a stuck client forever.
func StopGRPC(ctx context.Context, s *grpc.Server) {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.Stop()
		<-done
	}
}

// Limits of every gRPC server: a client may hold so many streams on one connection, send
// messages so large, and ping so often; a connection idle for long is closed, and a dead one
// is found by the server's own pings. Without them one client could hold a server's memory
// and goroutines without bound.
const (
	MaxConcurrentStreams = 256
	MaxRecvMsgSize       = 8 << 20
	keepaliveMinTime     = 10 * time.Second
	keepaliveTime        = time.Minute
	keepaliveTimeout     = 20 * time.Second
	maxConnectionIdle    = 15 * time.Minute
	handshakeTimeout     = 10 * time.Second
)

// ServerLimits are the options that bound what clients may ask of a gRPC server.
func ServerLimits() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: maxConnectionIdle, Time: keepaliveTime, Timeout: keepaliveTimeout}),
		// A connection holds its 32 KiB write buffer only while it sends, and reads frames
		// without one of its own (TLS below reads whole records, through tlsbatch's buffer,
		// which it too holds only while it has bytes): a master keeps a connection open to
		// every worker, idle between two heartbeats (docs/benchmarks.md, "A thousand workers
		// at the master").
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(0),
	}
}
