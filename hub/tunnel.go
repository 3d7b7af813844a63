package hub

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
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
