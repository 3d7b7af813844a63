package hub

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tether-edge/tether/tunnel"
)

// metricsRegistry returns the registry the hub's /metrics serves: the Go
// runtime's and the process's metrics, as every Kubernetes component
// exports them, the tunnel's, the node Lease keeper's, the status
// nudges', the leader elections', the site digests' and the resource
// metrics store's. The API server adds its request metrics.
func (r *run) metricsRegistry() (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	cs := []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newTunnelCollector(r.edges, r.relay),
		r.leaders.collector(),
	}
	cs = append(cs, r.leases.Collectors()...)
	cs = append(cs, r.beats.Collectors()...)
	cs = append(cs, r.nudges.Collectors()...)
	cs = append(cs, r.sites.Collectors()...)
	if r.usage != nil {
		cs = append(cs, r.usage.Collectors()...)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// tunnelCollector exports the tunnel server's counters and gauges, and the
// count of pod connections to the API relayed over it, from one read of
// the server's statistics per scrape.
type tunnelCollector struct {
	edges   *tunnel.Server
	relay   *streamDemux
	metrics []tunnelMetric
}

type tunnelMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(tunnel.ServerStats) float64
}

func newTunnelCollector(edges *tunnel.Server, relay *streamDemux) *tunnelCollector {
	c := &tunnelCollector{edges: edges, relay: relay}
	add := func(name string, kind prometheus.ValueType, help string, value func(tunnel.ServerStats) float64) {
		c.metrics = append(c.metrics, tunnelMetric{prometheus.NewDesc(name, help, nil, nil), kind, value})
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	add("tether_tunnel_sessions", gauge, "Edge tunnel sessions open now.",
		func(s tunnel.ServerStats) float64 { return float64(s.Sessions) })
	add("tether_tunnel_fallback_sessions", gauge, "Edge tunnel sessions open now over TCP+TLS instead of QUIC.",
		func(s tunnel.ServerStats) float64 { return float64(s.FallbackSessions) })
	add("tether_tunnel_handshakes_total", counter, "Edge tunnel handshakes accepted.",
		func(s tunnel.ServerStats) float64 { return float64(s.Handshakes) })
	add("tether_tunnel_handshakes_peak_per_second", gauge, "Most edge tunnel handshakes admitted within one second since the hub started.",
		func(s tunnel.ServerStats) float64 { return float64(s.PeakHandshakesPerSecond) })
	add("tether_tunnel_handshakes_refused_total", counter, "Edge tunnel handshakes refused (rate limit, identity).",
		func(s tunnel.ServerStats) float64 { return float64(s.HandshakesRefused) })
	add("tether_tunnel_streams_opened_total", counter, "Streams edges opened to the hub.",
		func(s tunnel.ServerStats) float64 { return float64(s.StreamsOpened) })
	add("tether_tunnel_dials_total", counter, "Streams the hub opened to edges.",
		func(s tunnel.ServerStats) float64 { return float64(s.Dials) })
	add("tether_tunnel_bulk_lanes", gauge, "Bulk lanes (TCP+TLS with BBR beside an edge's tunnel) open now.",
		func(s tunnel.ServerStats) float64 { return float64(s.BulkLanes) })
	add("tether_tunnel_bulk_streams_total", counter, "Streams that travelled on bulk lanes.",
		func(s tunnel.ServerStats) float64 { return float64(s.BulkStreams) })
	add("tether_tunnel_bulk_default_congestion_total", counter, "Bulk lanes whose hub end kept the kernel's congestion control because BBR could not be set.",
		func(s tunnel.ServerStats) float64 { return float64(s.BulkDefaultCongestion) })
	add("tether_tunnel_relayed_api_connections_total", counter, "Connections of pods to the API that edges relayed over the tunnel.",
		func(tunnel.ServerStats) float64 { return float64(relay.relayedTotal.Load()) })
	return c
}

func (c *tunnelCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

func (c *tunnelCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.edges.Stats()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(st))
	}
}

// collector returns the leader_election_master_status gauges upstream's
// components export: 1 while this hub holds the component's Lease.
func (s *leaderStatus) collector() prometheus.Collector {
	return &leaderCollector{s: s, desc: prometheus.NewDesc("leader_election_master_status",
		"Whether this hub leads the component: 1 while it holds the component's Lease, else 0.", []string{"name"}, nil)}
}

type leaderCollector struct {
	s    *leaderStatus
	desc *prometheus.Desc
}

func (c *leaderCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *leaderCollector) Collect(ch chan<- prometheus.Metric) {
	for name, leads := range map[string]bool{ControllerManagerLease: c.s.controllers.Load(), SchedulerLease: c.s.scheduler.Load()} {
		v := 0.0
		if leads {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, name)
	}
}
