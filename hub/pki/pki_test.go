package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/auth"
)

func leaf(t *testing.T, a *Authority) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(a.serving.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCreateAndReload(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreate(Config{Dir: dir, Hosts: []string{"hub.example", "192.0.2.7"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.key", "serving.key"} {
		st, err := os.Stat(filepath.Join(dir, "pki", f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, want 0600", f, st.Mode().Perm())
		}
	}
	c := leaf(t, a)
	for _, n := range []string{"localhost", "hub.example", "kubernetes", "kubernetes.default.svc.cluster.local"} {
		if !slices.Contains(c.DNSNames, n) {
			t.Errorf("serving cert lacks DNS name %q: %v", n, c.DNSNames)
		}
	}
	for _, ip := range []string{"127.0.0.1", "::1", "10.0.0.1", "192.0.2.7"} {
		if !slices.ContainsFunc(c.IPAddresses, net.ParseIP(ip).Equal) {
			t.Errorf("serving cert lacks IP %s: %v", ip, c.IPAddresses)
		}
	}

	b, err := LoadOrCreate(Config{Dir: dir, Hosts: []string{"hub.example", "192.0.2.7"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a.CAPEM(), b.CAPEM()); diff != "" {
		t.Errorf("CA changed on reload (-first +second):\n%s", diff)
	}
	if a.CAHash() != b.CAHash() || len(a.CAHash()) != len("sha256:")+64 {
		t.Errorf("CAHash = %q then %q", a.CAHash(), b.CAHash())
	}
	if !leaf(t, b).Equal(c) {
		t.Error("serving certificate re-issued though nothing changed")
	}

	d, err := LoadOrCreate(Config{Dir: dir, Hosts: []string{"other.example"}})
	if err != nil {
		t.Fatal(err)
	}
	nc := leaf(t, d)
	if nc.Equal(c) || !slices.Contains(nc.DNSNames, "other.example") {
		t.Errorf("serving certificate not re-issued for new names: %v", nc.DNSNames)
	}
	if a.CAHash() != d.CAHash() {
		t.Error("CA changed when names changed")
	}

	// Near expiry: pretend two thirds of the lifetime has passed.
	e, err := LoadOrCreate(Config{Dir: dir, Hosts: []string{"other.example"},
		Now: func() time.Time { return time.Now().Add(300 * 24 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	if leaf(t, e).Equal(nc) {
		t.Error("serving certificate not re-issued near expiry")
	}
}

func TestKubeconfigHandshakeAndAuth(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreate(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	authn := auth.Union{auth.NewCertAuthenticator(a.CAPool())}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{TLSConfig: a.ServerTLSConfig(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, ok, err := authn.Authenticate(r)
		if err != nil || !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		io.WriteString(w, u.Name)
		for _, g := range u.Groups {
			io.WriteString(w, " "+g)
		}
	})}
	go hs.ServeTLS(ln, "", "")
	defer hs.Close()
	// The listener is on 127.0.0.1, which the serving certificate covers.
	srvURL := "https://" + ln.Addr().String()

	path := filepath.Join(dir, "admin.kubeconfig")
	if err := a.WriteKubeconfig(path, srvURL, AdminUser, []string{AdminGroup}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig mode = %v", st.Mode().Perm())
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(srvURL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if diff := cmp.Diff("tether-admin system:masters system:authenticated", string(body)); diff != "" {
		t.Errorf("identity (-want +got):\n%s", diff)
	}
	if resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
		t.Errorf("protocol not h2: %+v", resp.TLS)
	}

	// A client certificate from another CA fails the handshake.
	other, err := LoadOrCreate(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cp, kp, err := other.IssueClientCert("mallory", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	bad := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: a.CAPool(), Certificates: []tls.Certificate{pair}}}}
	if resp, err := bad.Get(srvURL + "/"); err == nil {
		resp.Body.Close()
		t.Errorf("foreign client certificate accepted: %s", resp.Status)
	}
}

func TestSign(t *testing.T) {
	a, err := LoadOrCreate(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := a.Sign(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: a.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("signed certificate does not verify: %v", err)
	}
	if c.Subject.CommonName != "system:node:n1" || !slices.Equal(c.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("subject = %v", c.Subject)
	}
	if _, err := a.Sign([]byte("junk"), time.Hour); err == nil {
		t.Error("Sign accepted junk")
	}
}

// TestServingCertificateForPods: pods address the hub as the kubernetes
// Service, by its cluster IP or its DNS names, and verify it against the
// CA. A data directory holding a serving certificate from before the hub
// named them (or named another service IP) gets a new one at start.
func TestServingCertificateForPods(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreate(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	// An older certificate: loopback names only.
	certPEM, keyPEM, err := a.issue(pkix.Name{CommonName: "tether-hub"}, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, time.Hour*24*365, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeAtomic(filepath.Join(dir, "pki", "serving.crt"), certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeAtomic(filepath.Join(dir, "pki", "serving.key"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"10.0.0.1", "10.96.0.1"} {
		b, err := LoadOrCreate(Config{Dir: dir, ServiceIP: net.ParseIP(ip)})
		if err != nil {
			t.Fatal(err)
		}
		c := leaf(t, b)
		for _, host := range []string{ip, "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} {
			opts := x509.VerifyOptions{DNSName: host, Roots: b.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			if _, err := c.Verify(opts); err != nil {
				t.Errorf("service IP %s: serving certificate not valid for %s: %v", ip, host, err)
			}
		}
		onDisk, err := os.ReadFile(filepath.Join(dir, "pki", "serving.crt"))
		if err != nil {
			t.Fatal(err)
		}
		if blk, _ := pem.Decode(onDisk); blk == nil || !slices.Equal(blk.Bytes, c.Raw) {
			t.Errorf("service IP %s: re-issued certificate not written to the data directory", ip)
		}
	}
}
