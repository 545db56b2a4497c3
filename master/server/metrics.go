package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Metrics measures the latency of the master's RPCs by method and status code.
type Metrics struct {
	latency *prometheus.HistogramVec
}

// NewMetrics registers the RPC metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "strata_master_rpc_duration_seconds",
		Help: "Latency of master RPCs, by method and gRPC status code.",
		// From 100µs (a local read) to 10s (a write waiting out an election).
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
	}, []string{"method", "code"})}
	if err := reg.Register(m.latency); err != nil {
		return nil, err
	}
	return m, nil
}

// UnaryInterceptor records every unary RPC.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.latency.WithLabelValues(info.FullMethod, status.Code(err).String()).Observe(time.Since(start).Seconds())
		return resp, err
	}
}
