package apiserver

import (
	"fmt"
	"io"
	"sort"
	"sync"
	"time"
)

// latencyBuckets are the upper bounds, in seconds, of the request latency
// histogram.
var latencyBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

type metricKey struct {
	verb, resource string
	code           int
}

type latencyKey struct{ verb, resource string }

type histogram struct {
	counts []uint64
	sum    float64
	count  uint64
}

// metrics counts requests and their latency and writes them in the
// Prometheus text exposition format.
type metrics struct {
	mu       sync.Mutex
	requests map[metricKey]uint64
	latency  map[latencyKey]*histogram
}

func newMetrics() *metrics {
	return &metrics{requests: map[metricKey]uint64{}, latency: map[latencyKey]*histogram{}}
}

// observe records one request; a zero duration records no latency (watches).
func (m *metrics) observe(verb, resource string, code int, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[metricKey{verb, resource, code}]++
	if d == 0 {
		return
	}
	lk := latencyKey{verb, resource}
	h := m.latency[lk]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(latencyBuckets))}
		m.latency[lk] = h
	}
	sec := d.Seconds()
	for i, b := range latencyBuckets {
		if sec <= b {
			h.counts[i]++
		}
	}
	h.sum += sec
	h.count++
}

func (m *metrics) write(w io.Writer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintln(w, "# HELP apiserver_request_total Counter of API requests by verb, resource and HTTP response code.")
	fmt.Fprintln(w, "# TYPE apiserver_request_total counter")
	keys := make([]metricKey, 0, len(m.requests))
	for k := range m.requests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.verb != b.verb {
			return a.verb < b.verb
		}
		if a.resource != b.resource {
			return a.resource < b.resource
		}
		return a.code < b.code
	})
	for _, k := range keys {
		fmt.Fprintf(w, "apiserver_request_total{code=\"%d\",resource=%q,verb=%q} %d\n", k.code, k.resource, k.verb, m.requests[k])
	}
	fmt.Fprintln(w, "# HELP apiserver_request_duration_seconds Response latency distribution in seconds by verb and resource.")
	fmt.Fprintln(w, "# TYPE apiserver_request_duration_seconds histogram")
	lks := make([]latencyKey, 0, len(m.latency))
	for k := range m.latency {
		lks = append(lks, k)
	}
	sort.Slice(lks, func(i, j int) bool {
		if lks[i].verb != lks[j].verb {
			return lks[i].verb < lks[j].verb
		}
		return lks[i].resource < lks[j].resource
	})
	for _, k := range lks {
		h := m.latency[k]
		for i, b := range latencyBuckets {
			fmt.Fprintf(w, "apiserver_request_duration_seconds_bucket{resource=%q,verb=%q,le=\"%g\"} %d\n", k.resource, k.verb, b, h.counts[i])
		}
		fmt.Fprintf(w, "apiserver_request_duration_seconds_bucket{resource=%q,verb=%q,le=\"+Inf\"} %d\n", k.resource, k.verb, h.count)
		fmt.Fprintf(w, "apiserver_request_duration_seconds_sum{resource=%q,verb=%q} %g\n", k.resource, k.verb, h.sum)
		fmt.Fprintf(w, "apiserver_request_duration_seconds_count{resource=%q,verb=%q} %d\n", k.resource, k.verb, h.count)
	}
}
