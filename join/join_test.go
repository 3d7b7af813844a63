package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestTokenRoundTrip(t *testing.T) {
	tok := Token{ID: "abc123", Secret: "0123456789abcdef", CAHash: "sha256:" + strings.Repeat("ab", 32)}
	got, err := ParseToken(" " + tok.String() + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if got != tok {
		t.Fatalf("round trip: got %+v, want %+v", got, tok)
	}
	if tok.Bearer() != "abc123.0123456789abcdef" {
		t.Fatalf("bearer %q", tok.Bearer())
	}
}

func TestParseTokenRejects(t *testing.T) {
	hash := "sha256:" + strings.Repeat("0f", 32)
	for _, s := range []string{
		"",
		"abc123.0123456789abcdef",                         // a bare bootstrap token: no pin
		"tether:abc123.0123456789abcdef",                  // no hash
		"tether:ABC123.0123456789abcdef:" + hash,          // upper case id
		"tether:abc12.0123456789abcdef:" + hash,           // short id
		"tether:abc123.0123456789abcde:" + hash,           // short secret
		"tether:abc123.0123456789abcdef:sha1:" + hash[7:], // wrong algorithm
		"tether:abc123.0123456789abcdef:sha256:xyz",       // bad hex
	} {
		if _, err := ParseToken(s); !errors.Is(err, ErrMalformedToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrMalformedToken", s, err)
		}
	}
}

func TestNodeName(t *testing.T) {
	if n, ok := NodeName("system:node:edge-1"); !ok || n != "edge-1" {
		t.Fatalf("NodeName = %q %v", n, ok)
	}
	for _, cn := range []string{"system:node:", "admin", "system:nodes"} {
		if _, ok := NodeName(cn); ok {
			t.Errorf("NodeName(%q) accepted", cn)
		}
	}
}

func TestCSRAndKey(t *testing.T) {
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	pemKey, err := MarshalKey(key)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseKey(pemKey)
	if err != nil || !back.Equal(key) {
		t.Fatalf("key round trip: %v", err)
	}
	csrPEM, err := NewCSR(key, "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(csrPEM), "CERTIFICATE REQUEST") {
		t.Fatalf("not a PEM request: %s", csrPEM)
	}
}

// testCA makes a CA and a serving certificate for 127.0.0.1 signed by it.
func testCA(t *testing.T) (*x509.Certificate, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "hub"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	return ca, tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}
}

func TestJoinPinsTheCA(t *testing.T) {
	ca, serving := testCA(t)
	var gotAuth string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		if r.URL.Path != JoinPath {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(Response{Certificate: []byte("-----BEGIN CERTIFICATE-----\n"), CA: []byte("ca")})
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serving}}
	srv.StartTLS()
	defer srv.Close()

	tok := Token{ID: "abc123", Secret: "0123456789abcdef", CAHash: CAHash(ca)}
	resp, err := Join(context.Background(), srv.URL, tok, Request{Node: "n1"})
	if err != nil {
		t.Fatalf("join with the right pin: %v", err)
	}
	if gotAuth != "Bearer abc123.0123456789abcdef" || string(resp.CA) != "ca" {
		t.Fatalf("auth %q, response %+v", gotAuth, resp)
	}

	other, _ := testCA(t)
	tok.CAHash = CAHash(other)
	_, err = Join(context.Background(), srv.URL, tok, Request{Node: "n1"})
	if err == nil || !strings.Contains(err.Error(), "does not match the pin") {
		t.Fatalf("join with a wrong pin: %v, want a pin mismatch", err)
	}
}

func TestJoinSurfacesStatusMessage(t *testing.T) {
	ca, serving := testCA(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"join token abc123 expired at 2026-01-01T00:00:00Z","reason":"Unauthorized","code":401}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serving}}
	srv.StartTLS()
	defer srv.Close()
	_, err := Join(context.Background(), srv.URL, Token{ID: "abc123", Secret: "0123456789abcdef", CAHash: CAHash(ca)}, Request{Node: "n1"})
	var he *HTTPError
	if !errors.As(err, &he) || he.Code != 401 || !strings.Contains(he.Message, "expired") {
		t.Fatalf("got %v, want the hub's 401 message", err)
	}
}
