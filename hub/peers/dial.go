package peers

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/tether-edge/tether/hub/auth"
)

const (
	// DialPath is where a hub asks another for a stream to a node whose
	// tunnel that one holds (an HTTP/1.1 upgrade to UpgradeProtocol).
	DialPath = "/tether/hub/dial"
	// HubsPath serves edges the tunnel addresses of the live hubs.
	HubsPath = "/tether/hubs"
	// UpgradeProtocol names the upgrade of DialPath.
	UpgradeProtocol = "tether-hub-stream"
	// HubGroup is the group of the client certificates hubs present to
	// each other.
	HubGroup = "system:tether-hubs"
)

// ErrNotHeld is what Dial returns when no other live hub holds the node's
// tunnel.
var ErrNotHeld = errors.New("no hub holds the node's tunnel")

// Dialer opens connections to other hubs' APIs as this hub: TLS with the
// cluster CA as roots and a client certificate in HubGroup.
type Dialer struct {
	// Roots verifies the other hubs' serving certificates.
	Roots *x509.CertPool
	// Certificate is this hub's client certificate.
	Certificate tls.Certificate
	// Timeout bounds the connect, TLS handshake and upgrade; zero means
	// 10s.
	Timeout time.Duration
}

// Dial opens a stream to target (tunnel.TargetNode or "tcp:IP:PORT") on
// node, through the hub that holds the node's tunnel. ErrNotHeld when no
// other live hub claims it.
func (d *Directory) Dial(ctx context.Context, node, target string) (net.Conn, error) {
	addr, ok := d.holder(node)
	if !ok || d.cfg.Dial == nil {
		return nil, ErrNotHeld
	}
	return d.cfg.Dial.dial(ctx, addr, node, target)
}

func (dl *Dialer) dial(ctx context.Context, addr, node, target string) (net.Conn, error) {
	timeout := dl.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial hub %s: %w", addr, err)
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	td := &tls.Dialer{Config: &tls.Config{
		MinVersion:   tls.VersionTLS13,
		RootCAs:      dl.Roots,
		ServerName:   host,
		Certificates: []tls.Certificate{dl.Certificate},
		NextProtos:   []string{"http/1.1"},
	}}
	c, err := td.DialContext(hctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial hub %s: %w", addr, err)
	}
	if deadline, ok := hctx.Deadline(); ok {
		_ = c.SetDeadline(deadline)
	}
	q := url.Values{"node": {node}, "target": {target}}
	req, _ := http.NewRequestWithContext(hctx, http.MethodGet, "https://"+addr+DialPath+"?"+q.Encode(), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", UpgradeProtocol)
	if err := req.Write(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("ask hub %s for node %s: %w", addr, node, err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("ask hub %s for node %s: %w", addr, node, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		c.Close()
		if resp.StatusCode == http.StatusNotFound {
			return nil, ErrNotHeld
		}
		return nil, fmt.Errorf("ask hub %s for node %s: %s: %s", addr, node, resp.Status, b)
	}
	_ = c.SetDeadline(time.Time{})
	return &bufferedConn{Conn: c, r: br}, nil
}

// bufferedConn reads what the upgrade's reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the TLS connection, as HTTP servers expect.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// LocalDialer opens a stream to a target on a node whose tunnel this hub
// holds; it returns ErrNotHeld when it does not.
type LocalDialer func(ctx context.Context, node, target string) (net.Conn, error)

// DialHandler serves DialPath to other hubs: it opens the stream through
// local and pipes the upgraded connection to it. Only clients with a
// certificate in HubGroup are served.
func DialHandler(local LocalDialer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, ok := auth.UserFrom(r.Context())
		if !ok || !u.InGroup(HubGroup) || r.TLS == nil {
			http.Error(w, "only hubs may open hub streams", http.StatusForbidden)
			return
		}
		if r.Header.Get("Upgrade") != UpgradeProtocol {
			http.Error(w, "hub streams need an upgrade to "+UpgradeProtocol, http.StatusBadRequest)
			return
		}
		node, target := r.URL.Query().Get("node"), r.URL.Query().Get("target")
		if node == "" || target == "" {
			http.Error(w, "node and target are required", http.StatusBadRequest)
			return
		}
		up, err := local(r.Context(), node, target)
		if errors.Is(err, ErrNotHeld) {
			http.Error(w, fmt.Sprintf("node %q is not connected to this hub", node), http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, fmt.Sprintf("open a stream to node %q: %v", node, err), http.StatusBadGateway)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			up.Close()
			http.Error(w, "hub streams need HTTP/1.1", http.StatusBadRequest)
			return
		}
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + UpgradeProtocol + "\r\n\r\n")
		if err := brw.Flush(); err != nil {
			c.Close()
			up.Close()
			return
		}
		var down net.Conn = c
		if n := brw.Reader.Buffered(); n > 0 {
			down = &bufferedConn{Conn: c, r: brw.Reader}
		}
		pipe(down, up)
	})
}

// pipe copies both ways until both directions end.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// HubList is what HubsPath answers: the tunnel addresses of the live
// hubs.
type HubList struct {
	Hubs []HubAddress `json:"hubs"`
}

// HubAddress is one hub as edges see it.
type HubAddress struct {
	ID     string `json:"id"`
	Tunnel string `json:"tunnel"`
}

// HubsHandler serves HubsPath to authenticated clients (edges, over their
// tunnel).
func (d *Directory) HubsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := auth.UserFrom(r.Context()); !ok {
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodGet {
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		var list HubList
		for _, h := range d.Live() {
			list.Hubs = append(list.Hubs, HubAddress{ID: h.ID, Tunnel: h.EdgeAddress})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	})
}
