package hub

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/nodes"
	"github.com/tether-edge/tether/hub/peers"
	"github.com/tether-edge/tether/tunnel"
)

// Hubs that share a PostgreSQL store know each other through hub/peers:
// each records its presence (addresses, the nodes whose tunnels it
// holds), serves the fleet's tunnel addresses to its edges, vouches for
// its nodes' liveness to the others and opens streams to its nodes for
// them. A hub on SQLite is alone and records nothing.

// openPeers makes the hub's directory of the hubs sharing its store, when
// the store is shared (PostgreSQL); nil otherwise.
func (r *run) openPeers() error {
	if !isPostgresDatastore(r.cfg.Datastore) {
		return nil
	}
	id, err := loadOrCreateHubID(filepath.Join(r.cfg.DataDir, "hub-id"))
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := r.authority.IssueClientCert("system:tether-hub:"+id, []string{peers.HubGroup}, 365*24*time.Hour)
	if err != nil {
		return fmt.Errorf("issue the hub's client certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("load the hub's client certificate: %w", err)
	}
	apiAddr := r.reachable(r.ln.Addr().String())
	edgeAddr := apiAddr
	if r.cfg.TunnelListen != "" {
		edgeAddr = r.reachable(r.cfg.TunnelListen)
	}
	r.peers, err = peers.New(peers.Config{
		Storage:     r.objs,
		ID:          id,
		EdgeAddress: edgeAddr,
		APIAddress:  apiAddr,
		Held:        r.leases.Held,
		OnVouched:   r.leases.Vouch,
		Dial:        &peers.Dialer{Roots: r.authority.CAPool(), Certificate: cert},
		Logger:      r.cfg.Logger.With("component", "peers"),
	})
	return err
}

// reachable turns a listen address into one others can dial: an
// unspecified host becomes the advertised address.
func (r *run) reachable(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = r.advertise
	}
	return net.JoinHostPort(host, port)
}

// extensions returns tether's own endpoints: the node join exchanges and,
// with peers, the fleet's addresses for edges and the hub-to-hub streams.
func (r *run) extensions(nodeCfg nodes.Config) map[string]http.Handler {
	ext := maps.Clone(nodes.NewJoiner(nodeCfg).Handlers())
	if r.peers != nil {
		ext[peers.HubsPath] = r.peers.HubsHandler()
		ext[peers.DialPath] = peers.DialHandler(func(ctx context.Context, node, target string) (net.Conn, error) {
			c, err := r.edges.Dial(ctx, node, target)
			if errors.Is(err, tunnel.ErrNoSession) {
				return nil, peers.ErrNotHeld
			}
			return c, err
		})
	}
	return ext
}

// dialTarget opens a stream to target on node: through its tunnel when
// this hub holds it, else through the hub that does.
func (r *run) dialTarget(ctx context.Context, node, target string) (net.Conn, error) {
	c, err := r.edges.Dial(ctx, node, target)
	if !errors.Is(err, tunnel.ErrNoSession) || r.peers == nil {
		if errors.Is(err, tunnel.ErrNoSession) {
			return nil, apiserver.ErrNodeNotConnected
		}
		return c, err
	}
	c, err = r.peers.Dial(ctx, node, target)
	if errors.Is(err, peers.ErrNotHeld) {
		return nil, apiserver.ErrNodeNotConnected
	}
	return c, err
}

// dialNode opens a stream to a node agent's own server.
func (r *run) dialNode(ctx context.Context, node string) (net.Conn, error) {
	return r.dialTarget(ctx, node, tunnel.TargetNode)
}

// dialPod opens a stream that node's agent connects to addr, one of the
// node's pods' IP:port.
func (r *run) dialPod(ctx context.Context, node, addr string) (net.Conn, error) {
	return r.dialTarget(ctx, node, "tcp:"+addr)
}

// loadOrCreateHubID returns the hub's id, kept in its data directory so
// that a restarted hub renews the same presence.
func loadOrCreateHubID(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	}
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate hub id: %w", err)
	}
	id := hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write hub id: %w", err)
	}
	return id, nil
}
