package dataplane

import (
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// Metrics count what the data plane serves.
type Metrics struct {
	requests *prometheus.CounterVec
	sent     prometheus.Counter
	received prometheus.Counter
}

// NewMetrics registers the data plane's metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newUnregisteredMetrics()
	for _, c := range []prometheus.Collector{m.requests, m.sent, m.received} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func newUnregisteredMetrics() *Metrics {
	return &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_worker_dataplane_requests_total",
			Help: "Data-plane calls served, by method and gRPC status code.",
		}, []string{"method", "code"}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_worker_dataplane_sent_bytes_total",
			Help: "Block bytes sent to peers and clients.",
		}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_worker_dataplane_received_bytes_total",
			Help: "Block bytes received and stored from peers and clients.",
		}),
	}
}

// done counts a finished call and returns its error unchanged.
func (m *Metrics) done(method string, err error) error {
	m.requests.WithLabelValues(method, status.Code(err).String()).Inc()
	return err
}
