package hub

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"

	"github.com/tether-edge/tether/hub/metrics"
	"github.com/tether-edge/tether/hub/nodes"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/tunnel"
)

// newTunnelServer builds the server end of the edge tunnels: node
// certificates only, heartbeats and connection changes fed to the Lease
// keeper, site digests to sites, resource usage to the metrics store
// (when there is one).
func newTunnelServer(cfg Config, authority *pki.Authority, leases *nodes.Leases, sites *nodes.Sites, usage *metrics.Store, log *slog.Logger) (*tunnel.Server, error) {
	resetKey, err := loadOrCreateResetKey(filepath.Join(cfg.DataDir, "pki", "tunnel-reset.key"))
	if err != nil {
		return nil, err
	}
	var onPush func(*tunnel.Session, []byte)
	if usage != nil {
		onPush = usage.Push
	}
	return tunnel.NewServer(tunnel.ServerConfig{
		TLS:                 authority.ServerTLSConfig(),
		StatelessResetKey:   resetKey,
		HandshakesPerSecond: cfg.TunnelHandshakeRate,
		HandshakeBurst:      cfg.TunnelHandshakeBurst,
		IdleTimeout:         cfg.TunnelIdleTimeout,
		Identify: func(cs tls.ConnectionState) (string, error) {
			if len(cs.PeerCertificates) == 0 {
				return "", errors.New("no client certificate")
			}
			return nodes.Identify(cs.PeerCertificates[0])
		},
		OnConnect:    func(s *tunnel.Session) { leases.Connected(s.Node()) },
		OnDisconnect: func(s *tunnel.Session, _ error) { leases.Disconnected(s.Node()) },
		OnHeartbeat:  func(s *tunnel.Session) { leases.Heartbeat(s.Node()) },
		OnReport:     func(s *tunnel.Session, p []byte) { sites.Report(s.Node(), p) },
		OnPush:       onPush,
		Logger:       log,
	})
}

// tunnelMetrics writes the tunnel server's counters, and those of the
// site digests it carries, for /metrics.
func tunnelMetrics(edges *tunnel.Server, relay *streamDemux, sites *nodes.Sites) func(io.Writer) {
	return func(w io.Writer) {
		st := edges.Stats()
		for _, m := range []struct {
			name, typ, help string
			v               int64
		}{
			{"tether_tunnel_sessions", "gauge", "Edge tunnel sessions open now.", int64(st.Sessions)},
			{"tether_tunnel_fallback_sessions", "gauge", "Edge tunnel sessions open now over TCP+TLS instead of QUIC.", int64(st.FallbackSessions)},
			{"tether_tunnel_handshakes_total", "counter", "Edge tunnel handshakes accepted.", int64(st.Handshakes)},
			{"tether_tunnel_handshakes_peak_per_second", "gauge", "Most edge tunnel handshakes admitted within one second since the hub started.", int64(st.PeakHandshakesPerSecond)},
			{"tether_tunnel_handshakes_refused_total", "counter", "Edge tunnel handshakes refused (rate limit, identity).", int64(st.HandshakesRefused)},
			{"tether_tunnel_streams_opened_total", "counter", "Streams edges opened to the hub.", int64(st.StreamsOpened)},
			{"tether_tunnel_dials_total", "counter", "Streams the hub opened to edges.", int64(st.Dials)},
			{"tether_tunnel_bulk_lanes", "gauge", "Bulk lanes (TCP+TLS with BBR beside an edge's tunnel) open now.", int64(st.BulkLanes)},
			{"tether_tunnel_bulk_streams_total", "counter", "Streams that travelled on bulk lanes.", int64(st.BulkStreams)},
			{"tether_tunnel_bulk_default_congestion_total", "counter", "Bulk lanes whose hub end kept the kernel's congestion control because BBR could not be set.", int64(st.BulkDefaultCongestion)},
			{"tether_tunnel_relayed_api_connections_total", "counter", "Connections of pods to the API that edges relayed over the tunnel.", relay.relayedTotal.Load()},
		} {
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", m.name, m.help, m.name, m.typ, m.name, m.v)
		}
		sites.WriteMetrics(w)
	}
}

// nudgeNode asks a node's agent, through its tunnel, to write its node
// status again (POST /status/resend on its node server).
func nudgeNode(edges *tunnel.Server) func(ctx context.Context, node string) error {
	return func(ctx context.Context, node string) error {
		c, err := edges.Dial(ctx, node, tunnel.TargetNode)
		if err != nil {
			return err
		}
		defer c.Close()
		if d, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(d)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+node+"/status/resend", nil)
		if err != nil {
			return err
		}
		if err := req.Write(c); err != nil {
			return fmt.Errorf("send status resend request: %w", err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			return fmt.Errorf("read status resend response: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("status resend: agent answered %s", resp.Status)
		}
		return nil
	}
}

// loadOrCreateResetKey returns the key QUIC derives stateless resets from.
// It outlives the process so that a restarted hub answers packets of
// connections its previous run held with a reset the edge recognises: the
// edge then reconnects at once instead of waiting out its idle timeout.
func loadOrCreateResetKey(path string) (*[32]byte, error) {
	var key [32]byte
	if b, err := os.ReadFile(path); err == nil && len(b) == len(key) {
		copy(key[:], b)
		return &key, nil
	}
	if _, err := rand.Read(key[:]); err != nil {
		return nil, fmt.Errorf("generate tunnel reset key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("write tunnel reset key: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, key[:], 0o600); err != nil {
		return nil, fmt.Errorf("write tunnel reset key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("write tunnel reset key: %w", err)
	}
	return &key, nil
}

// extraMetrics writes the counters of the tunnel server, the node Lease
// keeper and the metrics store for /metrics.
func (r *run) extraMetrics() func(io.Writer) {
	tm := tunnelMetrics(r.edges, r.relay, r.sites)
	return func(w io.Writer) {
		tm(w)
		r.leases.WriteMetrics(w)
		r.nudges.WriteMetrics(w)
		r.leaders.WriteMetrics(w)
		if r.usage != nil {
			r.usage.WriteMetrics(w)
		}
	}
}

// metricsKinds returns the kinds of the resource metrics API, unless cfg
// turns it off.
func metricsKinds(cfg Config) []*registry.Kind {
	if cfg.DisableMetricsAPI {
		return nil
	}
	return metrics.Kinds()
}

// serveMetrics returns api with the resource metrics API served from the
// usage edges push, when it is on.
func (r *run) serveMetrics(api storage.API) storage.API {
	if r.usage == nil {
		return api
	}
	return r.usage.Serve(api)
}
