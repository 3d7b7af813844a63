package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/join"
)

// testCA signs node certificates as the hub does.
type testCA struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tether test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{key: key, cert: cert, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// sign returns a PEM certificate for node's key pub.
func (ca *testCA) sign(t *testing.T, node string, pub *ecdsa.PublicKey, notAfter time.Time) []byte {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: join.NodeUserPrefix + node, Organization: []string{"system:nodes"}},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// writeJoined writes the files of a node that joined as node.
func writeJoined(t *testing.T, dir string, ca *testCA, node string) *ecdsa.PrivateKey {
	t.Helper()
	key, err := join.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := join.MarshalKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		keyFile:  keyPEM,
		certFile: ca.sign(t, node, &key.PublicKey, time.Now().Add(time.Hour)),
		caFile:   ca.pem,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return key
}

func TestLoadAndSave(t *testing.T) {
	dir := t.TempDir()
	if id, err := loadIdentity(dir); id != nil || err != nil {
		t.Fatalf("empty data directory: %v, %v; want no identity and no error", id, err)
	}
	ca := newTestCA(t)
	key := writeJoined(t, dir, ca, "edge-1")
	id, err := loadIdentity(dir)
	if err != nil || id == nil {
		t.Fatalf("load: %v, %v", id, err)
	}
	if id.Node() != "edge-1" || id.Current().Leaf == nil {
		t.Fatalf("loaded node %q, leaf %v", id.Node(), id.Current().Leaf)
	}
	cfg := id.TLSConfig("hub.example")
	if got, _ := cfg.GetClientCertificate(nil); got != id.Current() || cfg.ServerName != "hub.example" {
		t.Fatalf("TLS config presents %v for %q", got, cfg.ServerName)
	}

	// A certificate for another node, or for another key, is refused and
	// the current one stays in use, on disk too.
	before := id.Current()
	other, _ := join.NewKey()
	for name, certPEM := range map[string][]byte{
		"other node": ca.sign(t, "edge-2", &key.PublicKey, time.Now().Add(time.Hour)),
		"other key":  ca.sign(t, "edge-1", &other.PublicKey, time.Now().Add(time.Hour)),
	} {
		if err := id.save(certPEM, nil); err == nil {
			t.Errorf("%s: saved", name)
		}
		if id.Current() != before {
			t.Errorf("%s: the refused certificate is in use", name)
		}
	}
	onDisk, err := loadIdentity(dir)
	if err != nil || !onDisk.Current().Leaf.Equal(before.Leaf) {
		t.Fatalf("after refusals the file holds another certificate (%v)", err)
	}

	// A renewed certificate is used at once and survives a restart.
	renewed := ca.sign(t, "edge-1", &key.PublicKey, time.Now().Add(2*time.Hour))
	if err := id.save(renewed, ca.pem); err != nil {
		t.Fatal(err)
	}
	if id.Current() == before {
		t.Fatal("the renewed certificate is not in use")
	}
	onDisk, err = loadIdentity(dir)
	if err != nil || !onDisk.Current().Leaf.Equal(id.Current().Leaf) {
		t.Fatalf("restart after renewal: %v", err)
	}
}

func TestEstablishRefusals(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	dir := t.TempDir()
	_, err := Establish(ctx, Params{DataDir: dir, HubURL: "https://127.0.0.1:1"}, log)
	if err == nil || !strings.Contains(err.Error(), "a join token is needed") {
		t.Errorf("no certificate and no token: %v", err)
	}
	writeJoined(t, dir, newTestCA(t), "edge-1")
	_, err = Establish(ctx, Params{DataDir: dir, NodeName: "edge-9", HubURL: "https://127.0.0.1:1"}, log)
	if err == nil || !strings.Contains(err.Error(), `holds the identity of node "edge-1", not "edge-9"`) {
		t.Errorf("another node's data directory: %v", err)
	}
	id, err := Establish(ctx, Params{DataDir: dir, HubURL: "https://127.0.0.1:1", Token: "ignored"}, log)
	if err != nil || id.Node() != "edge-1" {
		t.Errorf("saved identity: %v, %v", id, err)
	}
}

func TestTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&join.HTTPError{Code: 503}, true},
		{&join.HTTPError{Code: 429}, true},
		{&join.HTTPError{Code: 403}, false},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{errors.New("parse hub CA: no certificate"), false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
