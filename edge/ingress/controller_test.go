package ingress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// backendServer answers with its name, the Host header and
// X-Forwarded-For, and echoes lines after an "Upgrade: echo" request, as a
// WebSocket server would after its handshake.
func backendServer(t *testing.T, name string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			rw.Flush()
			for {
				line, err := rw.ReadString('\n')
				if err != nil {
					return
				}
				fmt.Fprintf(rw, "%s:%s", name, line)
				rw.Flush()
			}
		}
		fmt.Fprintf(w, "%s host=%s xff=%s path=%s", name, r.Host, r.Header.Get("X-Forwarded-For"), r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fixture is a running controller whose backends are httptest servers
// standing for the Services svc-1 to svc-4 of testState.
type fixture struct {
	c          *Controller
	http, tlsA string
}

func startController(t *testing.T, cfg Config) *fixture {
	t.Helper()
	targets := map[string]string{}
	for i := 1; i <= 4; i++ {
		targets[fmt.Sprintf("10.96.0.%d:80", i)] = backendServer(t, fmt.Sprintf("svc-%d", i)).Listener.Addr().String()
	}
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		real, ok := targets[addr]
		if !ok {
			return nil, fmt.Errorf("no backend at %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, real)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := testState()
	for _, svc := range s.services {
		c.UpsertService(svc)
	}
	for _, ss := range s.slices {
		for _, es := range ss {
			c.UpsertEndpointSlice(es)
		}
	}
	for _, cl := range s.classes {
		c.UpsertIngressClass(cl)
	}
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Serve(ctx, httpLn, httpsLn); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &fixture{c: c, http: httpLn.Addr().String(), tlsA: httpsLn.Addr().String()}
}

func get(t *testing.T, client *http.Client, url, host string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s (host %s): %v", url, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProxy(t *testing.T) {
	f := startController(t, Config{})
	prefix := networkingv1.PathTypePrefix
	f.c.UpsertIngress(ingress("web", "tether", 0, networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{
		rule("a.example.com", path("/", prefix, "svc-1"), path("/b", prefix, "svc-2"), path("/down", prefix, "svc-5")),
	}}))
	f.c.Rebuild()
	c := &http.Client{}
	base := "http://" + f.http
	for _, tt := range []struct {
		host, path string
		code       int
		body       string
	}{
		{"a.example.com", "/x", 200, "svc-1 host=a.example.com xff=127.0.0.1 path=/x"},
		{"a.example.com:80", "/b/c", 200, "svc-2 host=a.example.com:80 xff=127.0.0.1 path=/b/c"},
		{"a.example.com", "/down", 503, "503 service unavailable\n"},
		{"b.example.com", "/", 404, "404 page not found\n"},
	} {
		code, body := get(t, c, base+tt.path, tt.host)
		if code != tt.code || body != tt.body {
			t.Errorf("%s%s: %d %q, want %d %q", tt.host, tt.path, code, body, tt.code, tt.body)
		}
	}
}

// testCA makes a CA and, signed by it, the kubernetes.io/tls Secret of a
// certificate for hosts.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) secret(t *testing.T, name string, hosts ...string) *corev1.Secret {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name), ResourceVersion: "1"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
		}}
}

// TestTLS serves certificates from Secrets by SNI, over HTTP/2, with the
// first TLS entry's for names no entry covers, and tells which Secrets it
// needs.
func TestTLS(t *testing.T) {
	var wanted atomic.Pointer[[]types.NamespacedName]
	f := startController(t, Config{OnSecrets: func(refs []types.NamespacedName) { wanted.Store(&refs) }})
	ca := newCA(t)
	prefix := networkingv1.PathTypePrefix
	f.c.UpsertIngress(ingress("secure", "tether", 0, networkingv1.IngressSpec{
		TLS: []networkingv1.IngressTLS{{Hosts: []string{"secure.example.com"}, SecretName: "secure-tls"}, {Hosts: []string{"*.wild.example.com"}, SecretName: "wild-tls"}},
		Rules: []networkingv1.IngressRule{
			rule("secure.example.com", path("/", prefix, "svc-1")),
			rule("*.wild.example.com", path("/", prefix, "svc-2")),
		},
	}))
	f.c.Rebuild()
	if w := wanted.Load(); w == nil || len(*w) != 2 || (*w)[0].Name != "secure-tls" || (*w)[1].Name != "wild-tls" {
		t.Fatalf("secrets wanted: %v", w)
	}
	// Before the Secrets arrive: the self-signed default.
	conn, err := tls.Dial("tcp", f.tlsA, &tls.Config{ServerName: "secure.example.com", InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if cn := conn.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "tether ingress default certificate" {
		t.Errorf("certificate before the Secret: %q", cn)
	}
	conn.Close()

	f.c.UpsertSecret(ca.secret(t, "secure-tls", "secure.example.com"))
	f.c.UpsertSecret(ca.secret(t, "wild-tls", "*.wild.example.com"))
	f.c.Rebuild()
	for _, tt := range []struct{ name, body, cn string }{
		{"secure.example.com", "svc-1", "secure.example.com"},
		{"a.wild.example.com", "svc-2", "*.wild.example.com"},
	} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool, ServerName: tt.name}, ForceAttemptHTTP2: true}
		c := &http.Client{Transport: tr}
		req, _ := http.NewRequest(http.MethodGet, "https://"+f.tlsA+"/", nil)
		req.Host = tt.name
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasPrefix(string(b), tt.body+" host="+tt.name) || resp.Proto != "HTTP/2.0" || resp.TLS.PeerCertificates[0].Subject.CommonName != tt.cn {
			t.Errorf("%s: %s %q, certificate %q", tt.name, resp.Proto, b, resp.TLS.PeerCertificates[0].Subject.CommonName)
		}
		tr.CloseIdleConnections()
	}
	// An unknown name gets the first TLS entry's certificate.
	conn, err = tls.Dial("tcp", f.tlsA, &tls.Config{ServerName: "unknown.example.net", RootCAs: ca.pool, InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if cn := conn.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "secure.example.com" {
		t.Errorf("certificate of an unknown name: %q", cn)
	}
	conn.Close()
}

// TestReload edits an Ingress while a keep-alive connection and an
// upgraded connection are open: the next request on the keep-alive
// connection goes to the new backend within a second, and the upgraded
// connection keeps talking to the old one.
func TestReload(t *testing.T) {
	f := startController(t, Config{})
	prefix := networkingv1.PathTypePrefix
	spec := func(svc string) networkingv1.IngressSpec {
		return networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule("app.example.com", path("/", prefix, svc))}}
	}
	f.c.UpsertIngress(ingress("app", "tether", 0, spec("svc-1")))
	f.c.Rebuild()

	var dials atomic.Int32
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	url := "http://" + f.http + "/"
	if _, body := get(t, c, url, "app.example.com"); !strings.HasPrefix(body, "svc-1 ") {
		t.Fatalf("before the edit: %q", body)
	}

	// An upgraded connection to svc-1.
	up, err := net.Dial("tcp", f.http)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	fmt.Fprintf(up, "GET /ws HTTP/1.1\r\nHost: app.example.com\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(up)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	echo := func(msg string) string {
		fmt.Fprintf(up, "%s\n", msg)
		up.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("echo: %v", err)
		}
		return strings.TrimSpace(line)
	}
	if got := echo("hello"); got != "svc-1:hello" {
		t.Fatalf("echo before the edit: %q", got)
	}

	// An in-flight request spanning the edit completes too.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if code, _ := get(t, &http.Client{}, url, "app.example.com"); code != 200 {
			t.Errorf("request during the edit: %d", code)
		}
	}()

	start := time.Now()
	edited := ingress("app", "tether", 0, spec("svc-2"))
	f.c.UpsertIngress(edited) // the run loop rebuilds
	for {
		_, body := get(t, c, url, "app.example.com")
		if strings.HasPrefix(body, "svc-2 ") {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("not re-routed within 1s: %q", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("re-routed after %v", time.Since(start))
	if n := dials.Load(); n != 1 {
		t.Errorf("the client dialled %d times: the keep-alive connection was dropped", n)
	}
	if got := echo("again"); got != "svc-1:again" {
		t.Errorf("echo after the edit: %q", got)
	}
	wg.Wait()
}

// TestStatus writes the node's address into the status of the Ingresses
// served, keeping other nodes' addresses, and takes it out again when the
// Ingress moves to another class.
func TestStatus(t *testing.T) {
	ing := ingress("web", "tether", 0, networkingv1.IngressSpec{DefaultBackend: ptr.To(be("svc-1"))})
	ing.Status.LoadBalancer.Ingress = []networkingv1.IngressLoadBalancerIngress{{IP: "192.0.2.9"}}
	client := fake.NewClientset(ing)
	f := startController(t, Config{Status: func(ns string) IngressClient { return client.NetworkingV1().Ingresses(ns) }, Addresses: []string{"192.0.2.1"}})
	f.c.UpsertIngress(ing)
	ips := func() string {
		got, err := client.NetworkingV1().Ingresses("default").Get(context.Background(), "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range got.Status.LoadBalancer.Ingress {
			out = append(out, e.IP)
		}
		return strings.Join(out, ",")
	}
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for ips() != want {
			if time.Now().After(deadline) {
				t.Fatalf("status %q, want %q", ips(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("192.0.2.9,192.0.2.1")
	cur, _ := client.NetworkingV1().Ingresses("default").Get(context.Background(), "web", metav1.GetOptions{})
	cur.Spec.IngressClassName = ptr.To("nginx")
	f.c.UpsertIngress(cur)
	waitFor("192.0.2.9")
}
