package testbench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-edge/tether/testbench/images"
)

const natIngressObjects = `
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: tether}
spec: {controller: tether.io/ingress}
---
apiVersion: v1
kind: Secret
metadata: {name: shop-tls}
type: kubernetes.io/tls
data: {tls.crt: %[1]s, tls.key: %[2]s}
%[3]s
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop}
spec:
  ingressClassName: tether
  defaultBackend: {service: {name: ing-b, port: {number: 80}}}
  tls: [{hosts: [shop.example.com], secretName: shop-tls}]
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /a, pathType: Prefix, backend: {service: {name: ing-a, port: {number: 80}}}}
      - {path: /b, pathType: Prefix, backend: {service: {name: ing-b, port: {name: http}}}}
  - host: a.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: ing-a, port: {number: 80}}}}
`

const natIngressApp = `---
apiVersion: apps/v1
kind: Deployment
metadata: {name: %[2]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[2]s}}
  template:
    metadata: {labels: {app: %[2]s}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: %[1]s
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: %[2]s}
spec:
  selector: {app: %[2]s}
  ports: [{name: http, port: 80, targetPort: 8080}]`

// natIngress: the node's built-in ingress controller (`tether edge
// --ingress`) serves, on the node's ports 80 and 443, one Ingress in front
// of two Deployments, to clients in the site router's namespace, that is
// from outside the node: by path and by host, over TLS with the
// certificate of a kubernetes.io/tls Secret chosen by SNI, and the
// defaultBackend for the rest. kubectl shows the Ingress with its class,
// hosts, the node's address and ports 80, 443. An edit of the Ingress
// re-routes within a second, on a keep-alive connection that stays open.
//
// The controller dials the Services' cluster IPs, which exist only in the
// eBPF dataplane's socket load balancing: the node has no route, iptables
// or nftables rule for them (natEgress checks the rules). On a real node
// the dataplane's cgroup is the root and holds the agent; in the lab it is
// the containers' cgroup, so the agent is moved into a cgroup below it;
// before the move, the Ingress's backends do not answer.
func natIngress(t *testing.T, l *Lab, h *labHub, n *ctrNode) {
	ca, crtPEM, keyPEM := ingressCerts(t, "shop.example.com")
	apps := fmt.Sprintf(natIngressApp, images.Echo, "ing-a") + "\n" + fmt.Sprintf(natIngressApp, images.Echo, "ing-b")
	// The later subtests count the default namespace's pods: take these
	// away again.
	t.Cleanup(func() {
		if out, err := h.run("delete", "--wait", "ingress/shop", "secret/shop-tls", "ingressclass/tether",
			"deploy/ing-a", "deploy/ing-b", "svc/ing-a", "svc/ing-b"); err != nil {
			t.Errorf("delete the ingress objects: %v\n%s", err, out)
		}
		eventually(t, 60*time.Second, "the pods of ing-a and ing-b gone", func() (bool, string) {
			out, err := h.run("get", "pods", "-l", "app in (ing-a,ing-b)", "-o", "name")
			return err == nil && strings.TrimSpace(out) == "", out
		})
	})
	h.applyManifest(t, fmt.Sprintf(natIngressObjects,
		base64.StdEncoding.EncodeToString(crtPEM), base64.StdEncoding.EncodeToString(keyPEM), apps))
	eventually(t, 90*time.Second, "ing-a and ing-b available", func() (bool, string) {
		a, _ := h.run("get", "deploy", "ing-a", "-o", "jsonpath={.status.availableReplicas}")
		b, _ := h.run("get", "deploy", "ing-b", "-o", "jsonpath={.status.availableReplicas}")
		return a == "1" && b == "1", "ing-a=" + a + " ing-b=" + b
	})
	node := l.Host(n.name).Addr
	var dials atomic.Int32
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dialInHost(l, n.zone+"-router", network, addr)
	}
	plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial, MaxConnsPerHost: 1, IdleConnTimeout: time.Minute}}
	secure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial, MaxConnsPerHost: 1,
		TLSClientConfig: &tls.Config{RootCAs: ca, ServerName: "shop.example.com"}}}
	get := func(c *http.Client, url, host string) (string, error) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return "", err
		}
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s (host %s): %s: %s", url, host, resp.Status, b)
		}
		return string(b), err
	}
	// answeredBy names the Deployment whose pod said hello.
	answeredBy := func(body string) string {
		for _, d := range []string{"ing-a", "ing-b"} {
			if strings.HasPrefix(body, "hello from "+d+"-") {
				return d
			}
		}
		return "?" + body
	}

	httpURL, httpsURL := "http://"+net.JoinHostPort(node, "80"), "https://"+net.JoinHostPort(node, "443")
	// Outside the dataplane's cgroup the agent cannot reach a cluster IP:
	// the Ingress is routed (no 404, no 503) but its backend never answers.
	quick := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialInHost(l, n.zone+"-router", network, addr)
	}}}
	eventually(t, 30*time.Second, "the Ingress routed, the cluster IPs out of the agent's reach", func() (bool, string) {
		body, err := get(quick, httpURL+"/a", "shop.example.com")
		if err == nil {
			t.Fatalf("answered through a cluster IP from outside the dataplane's cgroup: %q", body)
		}
		msg := err.Error()
		return strings.Contains(msg, "Client.Timeout") || strings.Contains(msg, "502 Bad Gateway"), msg
	})
	agentIntoDataplaneCgroup(t, n)
	eventually(t, 30*time.Second, "the Ingress served on the node's port 80", func() (bool, string) {
		body, err := get(plain, httpURL+"/a", "shop.example.com")
		if err != nil {
			return false, err.Error()
		}
		return answeredBy(body) == "ing-a", body
	})
	for _, tt := range []struct {
		c          *http.Client
		base, host string
		path, want string
	}{
		{plain, httpURL, "shop.example.com", "/a", "ing-a"},
		{plain, httpURL, "shop.example.com", "/a/deeper", "ing-a"},
		{plain, httpURL, "shop.example.com", "/b", "ing-b"},
		{plain, httpURL, "a.example.com", "/b", "ing-a"},
		{plain, httpURL, "shop.example.com", "/other", "ing-b"}, // defaultBackend
		{plain, httpURL, "unknown.example.com", "/a", "ing-b"},  // defaultBackend
		{secure, httpsURL, "shop.example.com", "/a", "ing-a"},
		{secure, httpsURL, "shop.example.com", "/b", "ing-b"},
	} {
		body, err := get(tt.c, tt.base+tt.path, tt.host)
		if err != nil {
			t.Errorf("GET %s%s: %v", tt.base, tt.path, err)
		} else if got := answeredBy(body); got != tt.want {
			t.Errorf("GET %s%s (host %s) answered by %s, want %s", tt.base, tt.path, tt.host, got, tt.want)
		}
	}
	// The certificate served is the Secret's, which the client verified
	// against the test's CA for shop.example.com.
	if conn, err := dialInHost(l, n.zone+"-router", "tcp", net.JoinHostPort(node, "443")); err != nil {
		t.Errorf("dial the node's port 443: %v", err)
	} else {
		tc := tls.Client(conn, &tls.Config{RootCAs: ca, ServerName: "shop.example.com"})
		if err := tc.Handshake(); err != nil {
			t.Errorf("TLS handshake for shop.example.com: %v", err)
		} else if cn := tc.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "shop.example.com" {
			t.Errorf("certificate served for shop.example.com: CN %q", cn)
		}
		tc.Close()
	}

	eventually(t, 30*time.Second, "kubectl get ingress with the node's address", func() (bool, string) {
		out, err := h.run("get", "ingress", "shop")
		if err != nil {
			return false, out
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			return false, out
		}
		want := []string{"NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"}
		row := strings.Fields(lines[1])
		ok := strings.Join(strings.Fields(lines[0]), " ") == strings.Join(want, " ") && len(row) == 7 &&
			row[0] == "shop" && row[1] == "tether" && row[2] == "shop.example.com,a.example.com" &&
			row[3] == node && row[4]+" "+row[5] == "80, 443"
		return ok, out
	})

	// Re-route /b to ing-a: the keep-alive connection that asked before
	// the edit asks again, and is answered by ing-a within a second.
	before := dials.Load()
	if body, err := get(plain, httpURL+"/b", "shop.example.com"); err != nil || answeredBy(body) != "ing-b" {
		t.Fatalf("before the edit: %q %v", body, err)
	}
	h.must(t, "patch", "ingress", "shop", "--type", "json", "-p",
		`[{"op":"replace","path":"/spec/rules/0/http/paths/1/backend/service","value":{"name":"ing-a","port":{"number":80}}}]`)
	edited := time.Now()
	for {
		body, err := get(plain, httpURL+"/b", "shop.example.com")
		if err != nil {
			t.Fatalf("after the edit: %v", err)
		}
		if answeredBy(body) == "ing-a" {
			break
		}
		if time.Since(edited) > time.Second {
			t.Fatalf("/b still answered by %s a second after the edit", answeredBy(body))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the edited Ingress routed %v after kubectl patch returned", time.Since(edited).Round(time.Millisecond))
	if d := dials.Load() - before; d != 0 {
		t.Errorf("the client dialled %d new connections across the edit; want the keep-alive connection kept", d)
	}
}

// ingressCerts makes a CA and a serving certificate for host signed by
// it, returning the CA as a pool and the serving pair as PEM.
func ingressCerts(t *testing.T, host string) (pool *x509.CertPool, crtPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lab ingress CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// agentIntoDataplaneCgroup moves the node's agent process into a cgroup
// below the dataplane's, for the rest of the test, so that its sockets are
// load-balanced as those of an agent on a node whose dataplane cgroup is
// the root.
func agentIntoDataplaneCgroup(t *testing.T, n *ctrNode) {
	t.Helper()
	pid := n.agent.PID()
	// The agent is the child of the nsenter that enters the boot's PID
	// namespace.
	if kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
		if f := strings.Fields(string(kids)); len(f) == 1 {
			pid, _ = strconv.Atoi(f[0])
		}
	}
	own, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatalf("the agent's cgroup: %v", err)
	}
	var from string
	for _, line := range strings.Split(string(own), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			from = filepath.Join(cgroup2Root(), p)
		}
	}
	dir := filepath.Join(containersCgroup(t), fmt.Sprintf("lab-agent-%d", pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move the agent into %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if from != "" {
			_ = os.WriteFile(filepath.Join(from, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		}
		_ = os.Remove(dir)
	})
}
