package edge_test

import (
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
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/ingress"
)

// freeLoopback returns a loopback address whose TCP port was free a
// moment ago.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// tlsSecret makes a CA and a kubernetes.io/tls Secret for host signed by
// it.
func tlsSecret(t *testing.T, name, host string) (*corev1.Secret, *x509.CertPool) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ingress test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{
		corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
	}}, pool
}

// TestIngressController runs a hub and an agent with --ingress: an
// Ingress routes two Services by path and by host, with TLS from a Secret
// and a defaultBackend; kubectl shows its class, hosts, address and
// ports; its status holds the node's address; and an agent restarted
// while the hub is down routes from its local state.
func TestIngressController(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()

	// Backends stand for the Services' cluster IPs: the node's Service
	// load balancing is not there without the eBPF dataplane.
	var mu sync.Mutex
	backends := map[string]string{} // ClusterIP:port -> httptest address
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		real, ok := backends[addr]
		mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("no backend at %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, real)
	}
	httpAddr, httpsAddr := freeLoopback(t), freeLoopback(t)
	cfg := edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-ing",
		NodeIP: netip.MustParseAddr("127.0.0.1"), WatchServices: true,
		Ingress: &ingress.Config{HTTPAddr: httpAddr, HTTPSAddr: httpsAddr, Dial: dial}}
	a := startAgent(t, cfg)
	node := waitNodeReady(t, e, "edge-ing")
	if node.Labels[ingress.NodeLabel] != "true" {
		t.Errorf("node labels %v", node.Labels)
	}

	if _, err := e.hub.RunInput(ctx, `apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: tether
  annotations:
    ingressclass.kubernetes.io/is-default-class: "true"
spec:
  controller: tether.io/ingress
`, nil, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web", "api", "fallback"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s %s", name, r.Host, r.URL.Path)
		}))
		t.Cleanup(srv.Close)
		svc, err := e.client.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		backends[svc.Spec.ClusterIP+":80"] = srv.Listener.Addr().String()
		mu.Unlock()
		if _, err := e.client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.10"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	secret, pool := tlsSecret(t, "web-tls", "web.example.com")
	if _, err := e.client.CoreV1().Secrets("default").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	prefix := networkingv1.PathTypePrefix
	backend := func(svc string) networkingv1.IngressBackend {
		return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svc, Port: networkingv1.ServiceBackendPort{Name: "http"}}}
	}
	paths := func(p ...string) *networkingv1.HTTPIngressRuleValue {
		v := &networkingv1.HTTPIngressRuleValue{}
		for i := 0; i < len(p); i += 2 {
			v.Paths = append(v.Paths, networkingv1.HTTPIngressPath{Path: p[i], PathType: &prefix, Backend: backend(p[i+1])})
		}
		return v
	}
	if _, err := e.client.NetworkingV1().Ingresses("default").Create(ctx, &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Name: "site"},
		Spec: networkingv1.IngressSpec{
			DefaultBackend: ptr(backend("fallback")),
			TLS:            []networkingv1.IngressTLS{{Hosts: []string{"web.example.com"}, SecretName: "web-tls"}},
			Rules: []networkingv1.IngressRule{
				{Host: "web.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: paths("/", "web", "/api", "api")}},
				{Host: "api.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: paths("/", "api")}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	httpc := &http.Client{Timeout: 5 * time.Second}
	get := func(host, path string) (string, error) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+httpAddr+path, nil)
		req.Host = host
		resp, err := httpc.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), nil
	}
	getTLS := func() (string, error) {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "web.example.com"}, ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, "https://"+httpsAddr+"/x", nil)
		req.Host = "web.example.com"
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%s %d %s", resp.Proto, resp.StatusCode, b), nil
	}
	checks := func(what string) {
		t.Helper()
		eventually(t, 20*time.Second, what+": routed by host and path", func() (bool, string) {
			got, err := get("web.example.com", "/index.html")
			return got == "200 web web.example.com /index.html", fmt.Sprint(got, err)
		})
		for _, tt := range []struct{ host, path, want string }{
			{"web.example.com", "/api/users", "200 api web.example.com /api/users"},
			{"api.example.com", "/v1", "200 api api.example.com /v1"},
			{"other.example.com", "/", "200 fallback other.example.com /"},
		} {
			if got, err := get(tt.host, tt.path); got != tt.want {
				t.Errorf("%s: %s%s: %q %v, want %q", what, tt.host, tt.path, got, err, tt.want)
			}
		}
		eventually(t, 20*time.Second, what+": TLS with the Secret's certificate", func() (bool, string) {
			got, err := getTLS()
			return got == "HTTP/2.0 200 web web.example.com /x", fmt.Sprint(got, err)
		})
	}
	checks("online")

	eventually(t, 20*time.Second, "status.loadBalancer holds the node's address", func() (bool, string) {
		ing, err := e.client.NetworkingV1().Ingresses("default").Get(ctx, "site", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		lb := ing.Status.LoadBalancer.Ingress
		return len(lb) == 1 && lb[0].IP == "127.0.0.1", fmt.Sprint(lb)
	})
	out := e.hub.MustRun("get", "ingress")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME CLASS HOSTS ADDRESS PORTS AGE" ||
		!regexp.MustCompile(`^site\s+tether\s+web.example.com,api.example.com\s+127.0.0.1\s+80, 443\s+\d+s$`).MatchString(lines[1]) {
		t.Errorf("kubectl get ingress:\n%s", out)
	}

	// Cut off from the hub and restarted, the node routes from its local
	// state.
	e.hub.Stop()
	a.stop(t)
	cfg.Token = ""
	startAgent(t, cfg)
	checks("offline")
}
