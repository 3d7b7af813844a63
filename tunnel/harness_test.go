package tunnel

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// testPKI is a throwaway CA with a hub certificate, as the hub's real CA
// would issue them.
type testPKI struct {
	ca    *x509.Certificate
	key   *ecdsa.PrivateKey
	pool  *x509.CertPool
	hub   tls.Certificate
	ser   int64
	serMu sync.Mutex
}

func newPKI(t testing.TB) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tether test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{ca: ca, key: key, pool: x509.NewCertPool(), ser: 1}
	p.pool.AddCert(ca)
	p.hub = p.issue(t, "hub", x509.ExtKeyUsageServerAuth)
	return p
}

func (p *testPKI) issue(t testing.TB, cn string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serMu.Lock()
	p.ser++
	ser := p.ser
	p.serMu.Unlock()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ser),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"hub"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (p *testPKI) node(t testing.TB, name string) tls.Certificate {
	return p.issue(t, "system:node:"+name, x509.ExtKeyUsageClientAuth)
}

func (p *testPKI) serverTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.hub}, ClientCAs: p.pool}
}

func (p *testPKI) clientTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		RootCAs:    p.pool,
		ServerName: "hub",
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &cert, nil
		},
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// testHub serves a Server on one port: QUIC on UDP, and the API port's TLS
// listener on TCP, where the fallback arrives through TLSNextProto exactly
// as on the real hub.
type testHub struct {
	srv   *Server
	addr  string
	pc    net.PacketConn
	https *http.Server
	api   *http.Server
	done  chan struct{}
}

// listenPair opens UDP and TCP on the same loopback port; port 0 picks one.
func listenPair(t testing.TB, port int) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 50 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			if port != 0 {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			t.Fatal(err)
		}
		p := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			pc.Close()
			if port != 0 {
				time.Sleep(20 * time.Millisecond)
			}
			continue
		}
		return pc, ln
	}
	t.Fatalf("no free udp+tcp port pair (port %d)", port)
	return nil, nil
}

// startHub starts a hub; api, when set, serves the tunnel's Listener.
func startHub(t testing.TB, p *testPKI, cfg ServerConfig, port int, api http.Handler) *testHub {
	t.Helper()
	return startHubWith(t, p, cfg, port, api, nil)
}

// startHubWith is startHub; when blackhole is non-nil, UDP datagrams are
// read and dropped until blackhole is closed, and only then served.
func startHubWith(t testing.TB, p *testPKI, cfg ServerConfig, port int, api http.Handler, blackhole chan struct{}) *testHub {
	t.Helper()
	if cfg.TLS == nil {
		cfg.TLS = p.serverTLS()
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pc, ln := listenPair(t, port)
	h := &testHub{srv: srv, addr: pc.LocalAddr().String(), pc: pc, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		if blackhole != nil {
			dropUntil(pc, blackhole)
		}
		// A hub stopped while blackholed is closed before it serves.
		if err := srv.ServeQUIC(context.Background(), pc); err != nil && !errors.Is(err, ErrServerClosed) {
			t.Errorf("ServeQUIC: %v", err)
		}
	}()
	tc := p.serverTLS()
	tc.NextProtos = []string{ALPN, "http/1.1"}
	tc.ClientAuth = tls.VerifyClientCertIfGiven
	h.https = &http.Server{
		TLSConfig: tc,
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){
			ALPN: func(_ *http.Server, c *tls.Conn, _ http.Handler) { srv.ServeConn(c) },
		},
		ErrorLog: slog.NewLogLogger(testLogger(t).Handler(), slog.LevelWarn),
	}
	go h.https.ServeTLS(ln, "", "")
	if api != nil {
		h.api = &http.Server{Handler: api}
		go h.api.Serve(srv.Listener())
	}
	t.Cleanup(h.stop)
	return h
}

func (h *testHub) stop() {
	h.srv.Close()
	h.https.Close()
	if h.api != nil {
		h.api.Close()
	}
	<-h.done
}

func (h *testHub) port() int { return h.pc.LocalAddr().(*net.UDPAddr).Port }

type testClient struct {
	*Client
	cancel context.CancelFunc
	done   chan struct{}
}

// startClient runs a client for node against addr until the test ends.
func startClient(t testing.TB, p *testPKI, addr, node string, mutate func(*ClientConfig)) *testClient {
	t.Helper()
	return startClientCert(t, p, addr, node, p.node(t, node), mutate)
}

func startClientCert(t testing.TB, p *testPKI, addr, node string, cert tls.Certificate, mutate func(*ClientConfig)) *testClient {
	t.Helper()
	cfg := ClientConfig{
		Addr:        addr,
		TLS:         p.clientTLS(cert),
		Hello:       func() Hello { return Hello{Node: node, Version: "test"} },
		BackoffBase: 100 * time.Millisecond,
		BackoffCap:  time.Second,
		Logger:      testLogger(t),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testClient{Client: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tc.done)
		c.Run(ctx)
	}()
	t.Cleanup(tc.stop)
	return tc
}

func (c *testClient) stop() {
	c.cancel()
	<-c.done
}

func waitConnected(t testing.TB, c *testClient, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		t.Fatalf("client did not connect: %v", err)
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// echoServer accepts TCP conns on loopback and echoes them.
func echoServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// transports runs f once per transport.
func transports(t *testing.T, f func(t *testing.T, forceTCP bool)) {
	for _, tcp := range []bool{false, true} {
		name := TransportQUIC
		if tcp {
			name = TransportTCP
		}
		t.Run(name, func(t *testing.T) { f(t, tcp) })
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// dropUntil reads and discards datagrams until stop is closed.
func dropUntil(pc net.PacketConn, stop chan struct{}) {
	buf := make([]byte, 2048)
	for {
		select {
		case <-stop:
			pc.SetReadDeadline(time.Time{})
			return
		default:
		}
		pc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		pc.ReadFrom(buf)
	}
}

// acceptUpload starts upload(c, data, reps) and accepts its stream at hub
// h; the stream is closed when the test ends.
func acceptUpload(t *testing.T, h *testHub, c *testClient, data []byte, reps int) (<-chan error, net.Conn) {
	t.Helper()
	werr := upload(c, data, reps)
	conn, err := h.srv.Listener().Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return werr, conn
}

// upload sends data through the tunnel from c to the hub's Listener,
// reps times over one stream, then half-closes it; the returned channel
// yields the edge side's error.
func upload(c *testClient, data []byte, reps int) <-chan error {
	werr := make(chan error, 1)
	go func() {
		conn, err := c.DialContext(context.Background(), "tcp", "hub")
		if err != nil {
			werr <- err
			return
		}
		defer conn.Close()
		for range reps {
			if _, err := conn.Write(data); err != nil {
				werr <- err
				return
			}
		}
		werr <- conn.(*streamConn).CloseWrite()
	}()
	return werr
}
