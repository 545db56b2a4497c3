package driver

import (
	"context"
	"fmt"
	"path"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Metrics count the CSI calls by method and gRPC code, and time them by method.
type Metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics registers the driver's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "strata", Subsystem: "csi", Name: "calls_total",
			Help: "CSI (and plugin registration) calls served, by method and gRPC code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "strata", Subsystem: "csi", Name: "call_duration_seconds",
			Help:    "Time to answer a CSI call, by method.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"method"}),
	}
	for _, c := range []prometheus.Collector{m.calls, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering CSI metrics: %w", err)
		}
	}
	return m, nil
}

// volumeIDGetter is every CSI request that names a volume.
type volumeIDGetter interface{ GetVolumeId() string }

// UnaryInterceptor logs each call with its method, volume id and code (success at V(1),
// failures at info, since a CO retries them and the message says what to fix) and counts it.
// Requests are never logged whole: they carry secrets.
func (m *Metrics) UnaryInterceptor(log logr.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		elapsed := time.Since(start)
		method := path.Base(info.FullMethod)
		code := status.Code(err)
		m.calls.WithLabelValues(method, code.String()).Inc()
		m.duration.WithLabelValues(method).Observe(elapsed.Seconds())

		kv := []any{"method", method, "code", code.String(), "duration", elapsed}
		if r, ok := req.(volumeIDGetter); ok && r.GetVolumeId() != "" {
			kv = append(kv, "volumeID", r.GetVolumeId())
		}
		if err != nil {
			log.Info("call failed", append(kv, "error", status.Convert(err).Message())...)
		} else {
			log.V(1).Info("call served", kv...)
		}
		return resp, err
	}
}
