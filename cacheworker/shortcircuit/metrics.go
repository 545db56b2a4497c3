package shortcircuit

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of an open, the values of the result label.
const (
	resultOK       = "ok"
	resultNotFound = "not_found"
	resultError    = "error"
)

// Metrics are the short-circuit server's metrics.
type Metrics struct {
	opens *prometheus.CounterVec
}

// NewMetrics registers the short-circuit metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	if err := reg.Register(m.opens); err != nil {
		return nil, fmt.Errorf("registering short-circuit metrics: %w", err)
	}
	return m, nil
}

// newMetrics builds the metrics without registering them; a server given no Metrics uses
// such unscraped ones, so that it never has to check for nil.
func newMetrics() *Metrics {
	m := &Metrics{
		opens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "strata", Subsystem: "worker", Name: "short_circuit_opens_total",
			Help: "Block descriptors requested over the short-circuit socket, by result: ok, not_found, or error (invalid requests, failed opens and failed sends).",
		}, []string{"result"}),
	}
	// Every result shows 0 from the start rather than appearing on its first occurrence, so
	// that rates and alerts on errors work before the first error.
	for _, r := range []string{resultOK, resultNotFound, resultError} {
		m.opens.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) observe(result string) { m.opens.WithLabelValues(result).Inc() }
