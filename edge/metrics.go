package edge

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the agent's own counters; the tunnel and API counters are
// read where they are kept.
type metrics struct {
	registrations    atomic.Int64
	nodeStatusWrites atomic.Int64
	podStatusWrites  atomic.Int64
	connects         atomic.Int64
	disconnects      atomic.Int64
	connected        atomic.Bool
	// siteEndpointsLeftOut: endpoints of dead site peers left out now.
	siteEndpointsLeftOut atomic.Int64
	// Usage reports (usagepush.go).
	usagePushes, usagePushedBytes, usagePushFailures, usageReadFailures atomic.Int64
}

// metricsHandler returns the node server's /metrics: the Go runtime's and
// the process's metrics, and the agent's own (agentCollector).
func (a *Agent) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), agentCollector{a})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// agentCollector exports the agent's counters and gauges, read once per
// scrape: the tunnel, the API requests, status writes, the site's gossip,
// the API relay, usage pushes, and those of the NetworkPolicy enforcer
// and the eBPF dataplane when the node runs them. It describes nothing
// ahead (an unchecked collector): what it exports depends on what the
// node runs.
type agentCollector struct{ a *Agent }

func (agentCollector) Describe(chan<- *prometheus.Desc) {}

func (c agentCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	s := a.Stats()
	connected := 0.0
	if s.Connected {
		connected = 1
	}
	out := sampleWriter{ch}
	out.gauge("tether_edge_tunnel_connected", "Whether the tunnel to the hub is up.", connected)
	out.counter("tether_edge_tunnel_connects_total", "Tunnel connections established.", float64(s.Connects))
	out.counter("tether_edge_tunnel_disconnects_total", "Tunnel connections lost.", float64(s.Disconnects))
	out.counter("tether_edge_tunnel_sent_bytes_total", "Bytes the tunnel sent on the wire.", float64(s.TunnelBytesSent))
	out.counter("tether_edge_tunnel_received_bytes_total", "Bytes the tunnel received on the wire.", float64(s.TunnelBytesReceived))
	for kind, v := range map[string]int64{"list": s.Lists, "watch": s.Watches, "get": s.Gets, "write": s.Writes} {
		out.counter("tether_edge_api_requests_total", "Requests to the hub's API by kind.", float64(v), "kind", kind)
	}
	out.counter("tether_edge_api_request_failures_total", "Requests to the hub's API that failed or got a 5xx answer.", float64(s.RequestFailures))
	out.counter("tether_edge_node_status_writes_total", "Node status patches written.", float64(s.NodeStatusWrites))
	out.counter("tether_edge_pod_status_writes_total", "Pod status patches written.", float64(s.PodStatusWrites))
	out.gauge("tether_edge_pods", "Pods bound to this node that the agent runs.", float64(s.Pods))
	out.gauge("tether_edge_watched_objects", "ConfigMaps and Secrets watched for the node's pods.", float64(s.WatchedObjects))
	out.gauge("tether_edge_site_endpoints_left_out", "Endpoints left out of Services because the site's gossip sees their node dead.", float64(s.SiteEndpointsLeftOut))
	out.gauge("tether_edge_api_relay_connections", "Pod connections to the hub's API the relay pipes now.", float64(s.APIRelayActive))
	out.counter("tether_edge_api_relay_connections_total", "Pod connections to the hub's API the relay piped.", float64(s.APIRelayConnections))
	out.counter("tether_edge_api_relay_rejected_total", "Connections the API relay refused: over its bound, or not TLS.", float64(s.APIRelayRejected))
	out.counter("tether_edge_api_relay_failures_total", "Connections the API relay found no tunnel stream for.", float64(s.APIRelayFailures))
	out.gauge("tether_gossip_members", "Site members this node's gossip sees alive or suspect, itself included.", float64(s.GossipMembers))
	const dropped = "Site gossip messages dropped: no installed key opens them, or they announce a node that is not the site's."
	out.counter("tether_gossip_dropped_total", dropped, float64(s.GossipDroppedKey), "reason", "key")
	out.counter("tether_gossip_dropped_total", dropped, float64(s.GossipDroppedNonMember), "reason", "non_member")
	out.counter("tether_edge_usage_pushes_total", "Usage samples pushed to the hub.", float64(s.UsagePushes))
	out.counter("tether_edge_usage_pushed_bytes_total", "Bytes of usage samples pushed to the hub, before the tunnel's framing.", float64(s.UsagePushedBytes))
	out.counter("tether_edge_usage_push_failures_total", "Usage samples that could not be encoded or pushed.", float64(a.metrics.usagePushFailures.Load()))
	out.counter("tether_edge_usage_read_failures_total", "Readings of the runtime's usage that failed.", float64(a.metrics.usageReadFailures.Load()))
	out.gauge("tether_edge_certificate_expiry_timestamp_seconds", "When the node certificate expires (Unix time).", float64(s.CertificateExpiry.Unix()))
	a.collectImageShare(out)
	a.netpol.collect(out)
	a.collectDataplane(out)
}

// sampleWriter sends constant samples to a collector's channel.
type sampleWriter struct{ ch chan<- prometheus.Metric }

// counter sends one sample of a counter; labels are name, value pairs.
func (w sampleWriter) counter(name, help string, v float64, labels ...string) {
	w.send(name, help, prometheus.CounterValue, v, labels)
}

// gauge sends one sample of a gauge; labels are name, value pairs.
func (w sampleWriter) gauge(name, help string, v float64, labels ...string) {
	w.send(name, help, prometheus.GaugeValue, v, labels)
}

func (w sampleWriter) send(name, help string, kind prometheus.ValueType, v float64, labels []string) {
	names := make([]string, 0, len(labels)/2)
	values := make([]string, 0, len(labels)/2)
	for i := 0; i+1 < len(labels); i += 2 {
		names, values = append(names, labels[i]), append(values, labels[i+1])
	}
	w.ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, names, nil), kind, v, values...)
}
