package daemon

import (
	"context"

	"google.golang.org/grpc"
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
