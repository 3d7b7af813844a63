package apiserver

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// requestMetrics are kube-apiserver's request counter and latency
// histogram, by verb and resource (with its subresource), in the
// registry /metrics serves.
type requestMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newRequestMetrics(reg prometheus.Registerer) (*requestMetrics, error) {
	m := &requestMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "apiserver_request_total",
			Help: "Counter of API requests by verb, resource and HTTP response code.",
		}, []string{"verb", "resource", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "apiserver_request_duration_seconds",
			Help:    "Response latency distribution in seconds by verb and resource.",
			Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"verb", "resource"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe records one request; a zero duration records no latency
// (watches, whose duration is the client's choice).
func (m *requestMetrics) observe(verb, resource string, code int, d time.Duration) {
	m.requests.WithLabelValues(verb, resource, strconv.Itoa(code)).Inc()
	if d != 0 {
		m.latency.WithLabelValues(verb, resource).Observe(d.Seconds())
	}
}
