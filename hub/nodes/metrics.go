package nodes

import "github.com/prometheus/client_golang/prometheus"

// countersBy returns one counter of name for each value of label, each
// read from its count at every scrape.
func countersBy[T int64 | uint64](name, help, label string, counts map[string]func() T) []prometheus.Collector {
	cs := make([]prometheus.Collector, 0, len(counts))
	for value, count := range counts {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: name, Help: help, ConstLabels: prometheus.Labels{label: value},
		}, func() float64 { return float64(count()) }))
	}
	return cs
}
