package aggregator

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/pki"
)

// loopDialer reaches every Service at one address.
type loopDialer struct {
	addr string
	got  []string
}

func (d *loopDialer) DialService(ctx context.Context, ns, name string, port int32) (net.Conn, error) {
	d.got = append(d.got, ns+"/"+name)
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", d.addr)
}

// extensionServer is an httptest TLS server that requires a client
// certificate from fp's CA and echoes the front-proxy headers.
func extensionServer(t *testing.T, fp *pki.FrontProxy) *httptest.Server {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(fp.CAPEM)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != pki.FrontProxyClientName {
			http.Error(w, "no front-proxy certificate", http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"path": r.URL.Path, "user": r.Header.Get("X-Remote-User"), "groups": r.Header.Values("X-Remote-Group"),
			"extra": r.Header.Get("X-Remote-Extra-Acme.io%2fteam"), "authorization": r.Header.Get("Authorization"),
			"impersonate": r.Header.Get("Impersonate-User"),
		})
	}))
	srv.TLS = &tls.Config{ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, Certificates: []tls.Certificate{servingCert(t, "api.echo.svc")}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func testAggregator(t *testing.T) (*Aggregator, *pki.FrontProxy) {
	t.Helper()
	a, err := pki.LoadOrCreate(pki.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	fp, err := a.FrontProxy()
	if err != nil {
		t.Fatal(err)
	}
	return must(New(Config{FrontProxy: fp, Kinds: Kinds})), fp
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func remoteAPIService(caPEM []byte, available bool) *apiregistrationv1.APIService {
	port := int32(443)
	s := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: "v1alpha1.echo.example.com"},
		Spec: apiregistrationv1.APIServiceSpec{Group: "echo.example.com", Version: "v1alpha1", CABundle: caPEM,
			Service:              &apiregistrationv1.ServiceReference{Namespace: "echo", Name: "api", Port: &port},
			GroupPriorityMinimum: 1000, VersionPriority: 15},
	}
	if available {
		s.Status.Conditions = []apiregistrationv1.APIServiceCondition{{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionTrue}}
	}
	return s
}

func serverCAPEM(srv *httptest.Server) []byte {
	var b strings.Builder
	_ = pemEncode(&b, srv.Certificate().Raw)
	return []byte(b.String())
}

// servingCert returns a self-signed serving certificate for name.
func servingCert(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestProxySendsIdentityWithFrontProxyCertificate(t *testing.T) {
	agg, fp := testAggregator(t)
	srv := extensionServer(t, fp)
	d := &loopDialer{addr: srv.Listener.Addr().String()}
	agg.cfg.Dialer = d
	agg.observe("v1alpha1.echo.example.com", remoteAPIService(serverCAPEM(srv), true))

	h := agg.ProxyFor("echo.example.com", "v1alpha1")
	if h == nil {
		t.Fatal("no proxy for a service-backed APIService")
	}
	if agg.ProxyFor("apps", "v1") != nil {
		t.Fatal("proxy for a group/version nobody registered")
	}
	req := httptest.NewRequest(http.MethodGet, "/apis/echo.example.com/v1alpha1/namespaces/default/echoes/x", nil)
	req.Header.Set("Authorization", "Bearer secret")
	req.Header.Set("Impersonate-User", "root")
	req.Header.Set("X-Remote-User", "forged")
	u := &auth.User{Name: "alice", Groups: []string{"dev", "system:authenticated"}, Extra: map[string][]string{"acme.io/team": {"blue"}}}
	req = req.WithContext(auth.WithUser(req.Context(), u))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var got struct {
		Path, User, Extra, Authorization, Impersonate string
		Groups                                        []string
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Path != "/apis/echo.example.com/v1alpha1/namespaces/default/echoes/x" || got.User != "alice" ||
		strings.Join(got.Groups, ",") != "dev,system:authenticated" || got.Extra != "blue" {
		t.Fatalf("backend saw %+v", got)
	}
	if got.Authorization != "" || got.Impersonate != "" {
		t.Fatalf("caller's credentials reached the backend: %+v", got)
	}
	if len(d.got) == 0 || d.got[0] != "echo/api" {
		t.Fatalf("dialed %v", d.got)
	}
}

func TestProxyRefusesUnverifiedServer(t *testing.T) {
	agg, fp := testAggregator(t)
	srv := extensionServer(t, fp)
	other := httptest.NewTLSServer(http.NotFoundHandler())
	defer other.Close()
	agg.cfg.Dialer = &loopDialer{addr: srv.Listener.Addr().String()}
	// caBundle of another server: verification fails, 503.
	agg.observe("v1alpha1.echo.example.com", remoteAPIService(serverCAPEM(other), true))
	rec := httptest.NewRecorder()
	agg.ProxyFor("echo.example.com", "v1alpha1").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/apis/echo.example.com/v1alpha1/echoes", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "error trying to reach service") {
		t.Fatalf("unverified server: %d %s", rec.Code, rec.Body)
	}
	// insecureSkipTLSVerify instead: served.
	s := remoteAPIService(nil, true)
	s.Spec.InsecureSkipTLSVerify = true
	agg.observe(s.Name, s)
	rec = httptest.NewRecorder()
	agg.ProxyFor("echo.example.com", "v1alpha1").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/apis/echo.example.com/v1alpha1/echoes", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("insecureSkipTLSVerify: %d %s", rec.Code, rec.Body)
	}
	// Not Available: 503 as upstream.
	agg.observe(s.Name, remoteAPIService(serverCAPEM(srv), false))
	rec = httptest.NewRecorder()
	agg.ProxyFor("echo.example.com", "v1alpha1").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/apis/echo.example.com/v1alpha1/echoes", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("unavailable: %d %s", rec.Code, rec.Body)
	}
}

func TestProbeAndDiscoveryMerge(t *testing.T) {
	agg, fp := testAggregator(t)
	srv := extensionServer(t, fp)
	agg.cfg.Dialer = &loopDialer{addr: srv.Listener.Addr().String()}
	s := remoteAPIService(serverCAPEM(srv), true)
	agg.observe(s.Name, s)
	doc, err := agg.services[s.Name].backend.probeDiscovery(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), `"user":"system:kube-aggregator"`) {
		t.Fatalf("probe identity: %s", doc)
	}
	agg.services[s.Name].discovery = []byte(`{"kind":"APIResourceList","groupVersion":"echo.example.com/v1alpha1","resources":[{"name":"echoes","singularName":"echo","namespaced":true,"kind":"Echo","verbs":["get","list"]},{"name":"echoes/status","namespaced":true,"kind":"Echo","verbs":["get"]}]}`)

	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept"), "apidiscovery") {
			w.Header().Set("Content-Type", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
			_, _ = io.WriteString(w, `{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{"name":"apps"},"versions":[]}]}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}],"preferredVersion":{"groupVersion":"apps/v1","version":"v1"}}]}`)
	})
	h := agg.Discovery(inner)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/apis", nil))
	var legacy metav1.APIGroupList
	_ = json.Unmarshal(rec.Body.Bytes(), &legacy)
	if len(legacy.Groups) != 2 || legacy.Groups[1].Name != "echo.example.com" || legacy.Groups[1].PreferredVersion.Version != "v1alpha1" {
		t.Fatalf("legacy /apis: %s", rec.Body)
	}
	etag := rec.Header().Get("ETag")

	req := httptest.NewRequest(http.MethodGet, "/apis", nil)
	req.Header.Set("Accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if !strings.Contains(rec.Body.String(), `"name":"echo.example.com"`) || !strings.Contains(rec.Body.String(), `"subresource":"status"`) ||
		!strings.Contains(rec.Header().Get("Content-Type"), "v=v2") {
		t.Fatalf("aggregated /apis: %s", rec.Body)
	}

	req = httptest.NewRequest(http.MethodGet, "/apis", nil)
	req.Header.Set("If-None-Match", etag)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotModified {
		t.Fatalf("If-None-Match: %d", rec.Code)
	}

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/apis/echo.example.com", nil))
	if !strings.Contains(rec.Body.String(), `"kind":"APIGroup"`) || !strings.Contains(rec.Body.String(), "echo.example.com/v1alpha1") {
		t.Fatalf("/apis/<group>: %s", rec.Body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/apis/echo.example.com/v1alpha1", nil))
	if !strings.Contains(rec.Body.String(), `"path":"/apis/echo.example.com/v1alpha1"`) {
		t.Fatalf("/apis/<group>/<version> not proxied: %s", rec.Body)
	}
}

func TestProxyPassesUpgrades(t *testing.T) {
	agg, fp := testAggregator(t)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(fp.CAPEM)
	backendSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "tether-test" || r.Header.Get("X-Remote-User") != "alice" {
			http.Error(w, "want an upgrade from alice", http.StatusBadRequest)
			return
		}
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tether-test\r\n\r\n")
		_ = rw.Flush()
		line, _ := rw.ReadString('\n')
		_, _ = rw.WriteString("echo " + line)
		_ = rw.Flush()
	}))
	backendSrv.TLS = &tls.Config{ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, Certificates: []tls.Certificate{servingCert(t, "api.echo.svc")}}
	backendSrv.StartTLS()
	defer backendSrv.Close()
	agg.cfg.Dialer = &loopDialer{addr: backendSrv.Listener.Addr().String()}
	agg.observe("v1alpha1.echo.example.com", remoteAPIService(serverCAPEM(backendSrv), true))

	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(auth.WithUser(r.Context(), &auth.User{Name: "alice"}))
		agg.ProxyFor("echo.example.com", "v1alpha1").ServeHTTP(w, r)
	}))
	defer front.Close()
	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET /apis/echo.example.com/v1alpha1/namespaces/default/echoes/x/exec HTTP/1.1\r\nHost: hub\r\nConnection: Upgrade\r\nUpgrade: tether-test\r\n\r\n")
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 101") {
		t.Fatalf("upgrade answer: %v %q", err, buf[:n])
	}
	_, _ = io.WriteString(c, "ping\n")
	got := ""
	for !strings.Contains(got, "echo ping\n") {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("read after upgrade: %v (got %q)", err, got)
		}
		got += string(buf[:n])
	}
}
