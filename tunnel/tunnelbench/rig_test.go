package tunnelbench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-edge/tether/testbench"
	"github.com/tether-edge/tether/tunnel"
)

var full = flag.Bool("tunnelbench.full", false, "run the long versions of the tunnel benchmarks")

const (
	site       = "edge"
	node       = "edge-n1"
	tunnelPort = "7443" // QUIC on UDP, the fallback on TCP, as on the hub's API port
	h2Port     = "7444" // the HTTP/2 peer
	tlsPort    = "7445" // the plain TCP+TLS peer
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("tunnel benchmarks need root to build the testbench lab's network namespaces")
	}
}

// pki issues throwaway ECDSA certificates.
type pki struct {
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	ser  atomic.Int64
}

func newPKI(t *testing.T) *pki {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{ca: ca, key: key, pool: x509.NewCertPool()}
	p.ser.Store(1)
	p.pool.AddCert(ca)
	return p
}

func (p *pki) issue(t *testing.T, cn string, server bool) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.ser.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"hub"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// rig is a lab with one NAT'd edge node and a hub running the tunnel
// server, the HTTP/2 peer and the TCP+TLS peer on the hub host.
type rig struct {
	t       *testing.T
	lab     *testbench.Lab
	pki     *pki
	hubCert tls.Certificate
	hubIP   string
	srv     *tunnel.Server
	bulk    atomic.Int64 // bytes received by the hub's /bulk handler and the TLS peer
	peer    atomic.Int64 // of which by the TLS peer
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newRig(t *testing.T, link testbench.LinkParams, scfg tunnel.ServerConfig) *rig {
	t.Helper()
	requireRoot(t)
	lab, err := testbench.Up(context.Background(), testbench.Config{
		Spec:       testbench.Spec{Sites: []testbench.SiteSpec{{Name: site, Nodes: 1, Link: link}}},
		Log:        quietLog(),
		PlainDisks: true,
	})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() { lab.Close() })
	r := &rig{t: t, lab: lab, pki: newPKI(t), hubIP: lab.Hub().Addr}
	r.hubCert = r.pki.issue(t, "hub", true)

	scfg.TLS = &tls.Config{Certificates: []tls.Certificate{r.hubCert}, ClientCAs: r.pki.pool}
	scfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	r.srv, err = tunnel.NewServer(scfg)
	if err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	var ln, h2ln, tlsln net.Listener
	err = lab.InHost("hub", func() error {
		var err error
		if pc, err = net.ListenPacket("udp4", r.hubIP+":"+tunnelPort); err != nil {
			return err
		}
		if ln, err = net.Listen("tcp4", r.hubIP+":"+tunnelPort); err != nil {
			return err
		}
		if h2ln, err = net.Listen("tcp4", r.hubIP+":"+h2Port); err != nil {
			return err
		}
		tlsln, err = net.Listen("tcp4", r.hubIP+":"+tlsPort)
		return err
	})
	if err != nil {
		t.Fatalf("listen on the hub: %v", err)
	}
	go r.srv.ServeQUIC(context.Background(), pc)
	// The fallback arrives on the API port through TLSNextProto.
	fb := &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{r.hubCert}, ClientCAs: r.pki.pool,
			ClientAuth: tls.VerifyClientCertIfGiven, NextProtos: []string{tunnel.ALPN}},
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){
			tunnel.ALPN: func(_ *http.Server, c *tls.Conn, _ http.Handler) { r.srv.ServeConn(c) },
		},
	}
	go fb.ServeTLS(ln, "", "")
	api := &http.Server{Handler: r.handlers()}
	go api.Serve(r.srv.Listener())
	h2 := newH2Server(r)
	go h2.ServeTLS(h2ln, "", "")
	go r.serveTLSPeer(tlsln)
	t.Cleanup(func() {
		r.srv.Close()
		fb.Close()
		api.Close()
		h2.Close()
		tlsln.Close()
	})
	return r
}

// handlers are the hub's API stand-ins, the same for the tunnel and the
// HTTP/2 peer.
func (r *rig) handlers() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ping", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "pong") })
	mux.HandleFunc("/bulk", func(w http.ResponseWriter, req *http.Request) {
		buf := make([]byte, 64<<10)
		for {
			n, err := req.Body.Read(buf)
			r.bulk.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/stall", func(w http.ResponseWriter, req *http.Request) {
		<-req.Context().Done() // never reads the body: the stream stalls
	})
	return mux
}

// serveTLSPeer is the TCP+TLS goodput peer: it counts what arrives.
func (r *rig) serveTLSPeer(ln net.Listener) {
	cfg := &tls.Config{Certificates: []tls.Certificate{r.hubCert}}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			tc := tls.Server(c, cfg)
			defer tc.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := tc.Read(buf)
				r.bulk.Add(int64(n))
				r.peer.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
	}
}

// inNode runs fn in the edge node's namespace.
func (r *rig) inNode(fn func() error) error { return r.lab.InHost(node, fn) }

func (r *rig) dialInNode(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := r.inNode(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// dialInNodeCC dials TCP from the edge node with the given congestion
// control, so the TCP peer can run the same algorithm as quic-go.
func (r *rig) dialInNodeCC(ctx context.Context, addr, cc string) (net.Conn, error) {
	var c net.Conn
	err := r.inNode(func() error {
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CONGESTION, cc)
			}); err != nil {
				return err
			}
			return serr
		}}
		var err error
		c, err = d.DialContext(ctx, "tcp4", addr)
		return err
	})
	return c, err
}

func (r *rig) clientTLS(name string) *tls.Config {
	cert := r.pki.issue(r.t, "system:node:"+name, false)
	return &tls.Config{RootCAs: r.pki.pool, ServerName: "hub",
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
}

// client starts a tunnel client on the edge node; all its sockets live in
// the node's namespace.
func (r *rig) client(name string, mutate func(*tunnel.ClientConfig)) *tunnel.Client {
	r.t.Helper()
	cfg := tunnel.ClientConfig{
		Addr:  r.hubIP + ":" + tunnelPort,
		TLS:   r.clientTLS(name),
		Hello: func() tunnel.Hello { return tunnel.Hello{Node: name, Version: "bench"} },
		ListenPacket: func() (net.PacketConn, error) {
			var pc net.PacketConn
			err := r.inNode(func() (err error) { pc, err = net.ListenPacket("udp4", ":0"); return })
			return pc, err
		},
		DialTCP: func(ctx context.Context, addr string) (net.Conn, error) { return r.dialInNode(ctx, "tcp4", addr) },
		DialTarget: func(ctx context.Context, target string) (net.Conn, error) {
			addr, ok := strings.CutPrefix(target, "tcp:")
			if !ok {
				return nil, fmt.Errorf("unsupported target %q", target)
			}
			return r.dialInNode(ctx, "tcp4", addr)
		},
		Logger: quietLog(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := tunnel.NewClient(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	r.t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := c.WaitConnected(wctx); err != nil {
		r.t.Fatalf("client %s: %v", name, err)
	}
	return c
}

// infinite yields zeros until stop is set.
type infinite struct{ stop *atomic.Bool }

func (z infinite) Read(p []byte) (int, error) {
	if z.stop.Load() {
		return 0, io.EOF
	}
	clear(p)
	return len(p), nil
}

func percentile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// tunnelUpload posts an endless body to the hub's /bulk through c for d
// (after sample's warm-up) and returns the goodput in Mbit/s and the
// parity c sent meanwhile.
func (r *rig) tunnelUpload(c *tunnel.Client, d time.Duration) (float64, tunnel.FECStats) {
	return r.tunnelUploadCtx(c, false, time.Second, d)
}

// bulkUpload is tunnelUpload on the bulk lane, after a warm-up of warm
// (one that covers BBR's startup at the link's round trip). The lane is
// opened for the run and closed after it, as a TCP peer's connection is.
func (r *rig) bulkUpload(c *tunnel.Client, warm, d time.Duration) float64 {
	rate, _ := r.tunnelUploadCtx(c, true, warm, d)
	deadline := time.Now().Add(10 * time.Second)
	for r.srv.Stats().BulkLanes > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return rate
}

func (r *rig) tunnelUploadCtx(c *tunnel.Client, bulk bool, warm, d time.Duration) (float64, tunnel.FECStats) {
	dial := c.DialContext
	if bulk {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return c.DialContext(tunnel.WithBulk(ctx), network, addr)
		}
	}
	tr := &http.Transport{DialContext: dial}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	f0 := c.Stats().FEC
	stop := new(atomic.Bool)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequest("POST", "http://hub/bulk", io.NopCloser(infinite{stop}))
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	rate := sampleAfter(r, warm, d)
	stop.Store(true)
	<-done
	settle(r)
	f := c.Stats().FEC
	return rate, tunnel.FECStats{ParityPackets: f.ParityPackets - f0.ParityPackets, Protected: f.Protected - f0.Protected}
}

// tlsUpload streams to the TCP+TLS peer from the edge node with congestion
// control cc for d and returns the goodput in Mbit/s.
func (r *rig) tlsUpload(cc string, d time.Duration) float64 {
	return r.tlsUploadAfter(cc, time.Second, d)
}

// tlsUploadAfter is tlsUpload after a warm-up of warm, which starts
// before the TCP handshake, as a tunnel upload's starts before its dial.
func (r *rig) tlsUploadAfter(cc string, warm, d time.Duration) float64 {
	t0 := time.Now()
	raw, err := r.dialInNodeCC(context.Background(), r.hubIP+":"+tlsPort, cc)
	if err != nil {
		r.t.Fatal(err)
	}
	tc := tls.Client(raw, &tls.Config{RootCAs: r.pki.pool, ServerName: "hub"})
	stop := new(atomic.Bool)
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(tc, infinite{stop})
	}()
	rate := sampleAfter(r, warm-time.Since(t0), d)
	stop.Store(true)
	// A reset, not a close: what the socket still holds must not reach
	// the hub during the next run.
	raw.(*net.TCPConn).SetLinger(0)
	tc.Close()
	<-done
	settle(r)
	return rate
}
