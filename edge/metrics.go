package edge

import (
	"fmt"
	"io"
	"sync/atomic"
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

// writeMetrics writes the agent's metrics in the Prometheus text format.
func (a *Agent) writeMetrics(w io.Writer) {
	s := a.Stats()
	connected := 0
	if s.Connected {
		connected = 1
	}
	type metric struct {
		name, kind, help string
		values           [][2]any // label set (or ""), value
	}
	ms := []metric{
		{"tether_edge_tunnel_connected", "gauge", "Whether the tunnel to the hub is up.", [][2]any{{"", connected}}},
		{"tether_edge_tunnel_connects_total", "counter", "Tunnel connections established.", [][2]any{{"", s.Connects}}},
		{"tether_edge_tunnel_disconnects_total", "counter", "Tunnel connections lost.", [][2]any{{"", s.Disconnects}}},
		{"tether_edge_tunnel_sent_bytes_total", "counter", "Bytes the tunnel sent on the wire.", [][2]any{{"", s.TunnelBytesSent}}},
		{"tether_edge_tunnel_received_bytes_total", "counter", "Bytes the tunnel received on the wire.", [][2]any{{"", s.TunnelBytesReceived}}},
		{"tether_edge_api_requests_total", "counter", "Requests to the hub's API by kind.", [][2]any{
			{`kind="list"`, s.Lists}, {`kind="watch"`, s.Watches}, {`kind="get"`, s.Gets}, {`kind="write"`, s.Writes}}},
		{"tether_edge_api_request_failures_total", "counter", "Requests to the hub's API that failed or got a 5xx answer.", [][2]any{{"", s.RequestFailures}}},
		{"tether_edge_node_status_writes_total", "counter", "Node status patches written.", [][2]any{{"", s.NodeStatusWrites}}},
		{"tether_edge_pod_status_writes_total", "counter", "Pod status patches written.", [][2]any{{"", s.PodStatusWrites}}},
		{"tether_edge_pods", "gauge", "Pods bound to this node that the agent runs.", [][2]any{{"", s.Pods}}},
		{"tether_edge_watched_objects", "gauge", "ConfigMaps and Secrets watched for the node's pods.", [][2]any{{"", s.WatchedObjects}}},
		{"tether_edge_site_endpoints_left_out", "gauge", "Endpoints left out of Services because the site's gossip sees their node dead.", [][2]any{{"", s.SiteEndpointsLeftOut}}},
		{"tether_edge_api_relay_connections", "gauge", "Pod connections to the hub's API the relay pipes now.", [][2]any{{"", s.APIRelayActive}}},
		{"tether_edge_api_relay_connections_total", "counter", "Pod connections to the hub's API the relay piped.", [][2]any{{"", s.APIRelayConnections}}},
		{"tether_edge_api_relay_rejected_total", "counter", "Connections the API relay refused: over its bound, or not TLS.", [][2]any{{"", s.APIRelayRejected}}},
		{"tether_edge_api_relay_failures_total", "counter", "Connections the API relay found no tunnel stream for.", [][2]any{{"", s.APIRelayFailures}}},
		{"tether_gossip_members", "gauge", "Site members this node's gossip sees alive or suspect, itself included.", [][2]any{{"", s.GossipMembers}}},
		{"tether_gossip_dropped_total", "counter", "Site gossip messages dropped: no installed key opens them, or they announce a node that is not the site's.", [][2]any{
			{`reason="key"`, s.GossipDroppedKey}, {`reason="non_member"`, s.GossipDroppedNonMember}}},
		{"tether_edge_usage_pushes_total", "counter", "Usage samples pushed to the hub.", [][2]any{{"", s.UsagePushes}}},
		{"tether_edge_usage_pushed_bytes_total", "counter", "Bytes of usage samples pushed to the hub, before the tunnel's framing.", [][2]any{{"", s.UsagePushedBytes}}},
		{"tether_edge_usage_push_failures_total", "counter", "Usage samples that could not be encoded or pushed.", [][2]any{{"", a.metrics.usagePushFailures.Load()}}},
		{"tether_edge_usage_read_failures_total", "counter", "Readings of the runtime's usage that failed.", [][2]any{{"", a.metrics.usageReadFailures.Load()}}},
		{"tether_edge_certificate_expiry_timestamp_seconds", "gauge", "When the node certificate expires (Unix time).", [][2]any{{"", s.CertificateExpiry.Unix()}}},
	}
	defer a.netpol.writeMetrics(w)
	defer a.writeDataplaneMetrics(w)
	for _, m := range ms {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.kind)
		for _, v := range m.values {
			if v[0] == "" {
				fmt.Fprintf(w, "%s %v\n", m.name, v[1])
			} else {
				fmt.Fprintf(w, "%s{%s} %v\n", m.name, v[0], v[1])
			}
		}
	}
}
