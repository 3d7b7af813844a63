package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func selfSignedCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}

func clientCert(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, orgs []string) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

func TestCertAuthenticator(t *testing.T) {
	ca, caKey := selfSignedCA(t)
	other, otherKey := selfSignedCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	good := clientCert(t, ca, caKey, "alice", []string{"dev", "ops"})
	foreign := clientCert(t, other, otherKey, "mallory", nil)
	tests := []struct {
		name   string
		state  *tls.ConnectionState
		want   *User
		wantOK bool
		err    bool
	}{
		{name: "no tls"},
		{name: "no certificate", state: &tls.ConnectionState{}},
		{name: "verified by tls", state: &tls.ConnectionState{PeerCertificates: []*x509.Certificate{good},
			VerifiedChains: [][]*x509.Certificate{{good, ca}}},
			want: &User{Name: "alice", Groups: []string{"dev", "ops", GroupAuthenticated}}, wantOK: true},
		{name: "verified here", state: &tls.ConnectionState{PeerCertificates: []*x509.Certificate{good}},
			want: &User{Name: "alice", Groups: []string{"dev", "ops", GroupAuthenticated}}, wantOK: true},
		{name: "foreign", state: &tls.ConnectionState{PeerCertificates: []*x509.Certificate{foreign}}, err: true},
	}
	a := NewCertAuthenticator(pool)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.TLS = tt.state
			u, ok, err := a.Authenticate(r)
			if (err != nil) != tt.err || ok != tt.wantOK {
				t.Fatalf("Authenticate = %v, %v, %v", u, ok, err)
			}
			if diff := cmp.Diff(tt.want, u); diff != "" {
				t.Errorf("user (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("# comment\nadmin-token,admin,uid-1,\"system:masters,dev\"\nplain,bob,uid-2\n")
	tf, err := NewTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		header string
		want   *User
		wantOK bool
		err    error
	}{
		{name: "none"},
		{name: "basic ignored", header: "Basic YWJjOmRlZg=="},
		{name: "admin", header: "Bearer admin-token", wantOK: true,
			want: &User{Name: "admin", UID: "uid-1", Groups: []string{"system:masters", "dev", GroupAuthenticated}}},
		{name: "no groups", header: "bearer plain", wantOK: true,
			want: &User{Name: "bob", UID: "uid-2", Groups: []string{GroupAuthenticated}}},
		{name: "unknown", header: "Bearer nope", err: ErrInvalidToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			u, ok, err := tf.Authenticate(r)
			if !errors.Is(err, tt.err) || ok != tt.wantOK {
				t.Fatalf("Authenticate = %v, %v, %v", u, ok, err)
			}
			if diff := cmp.Diff(tt.want, u); diff != "" {
				t.Errorf("user (-want +got):\n%s", diff)
			}
		})
	}

	// The file is read again when it changes.
	write("fresh-token,carol,uid-3,\n")
	future := time.Now().Add(time.Minute)
	os.Chtimes(path, future, future)
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer fresh-token")
	if u, ok, err := tf.Authenticate(r); err != nil || !ok || u.Name != "carol" {
		t.Errorf("after reload: %v, %v, %v", u, ok, err)
	}
	r.Header.Set("Authorization", "Bearer admin-token")
	if _, _, err := tf.Authenticate(r); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("removed token still accepted: %v", err)
	}

	write("a,b\n")
	if _, err := NewTokenFile(path); err == nil {
		t.Error("short record accepted")
	}
}

type fixed struct {
	u   *User
	ok  bool
	err error
}

func (f fixed) Authenticate(*http.Request) (*User, bool, error) { return f.u, f.ok, f.err }

func TestUnion(t *testing.T) {
	alice := &User{Name: "alice"}
	bad := errors.New("bad token")
	tests := []struct {
		name   string
		u      Union
		want   *User
		wantOK bool
		err    error
	}{
		{name: "empty"},
		{name: "none", u: Union{fixed{}, fixed{}}},
		{name: "second", u: Union{fixed{}, fixed{u: alice, ok: true}}, want: alice, wantOK: true},
		{name: "error stops", u: Union{fixed{err: bad}, fixed{u: alice, ok: true}}, err: bad},
		{name: "first wins", u: Union{fixed{u: alice, ok: true}, fixed{err: bad}}, want: alice, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, ok, err := tt.u.Authenticate(httptest.NewRequest("GET", "/", nil))
			if !errors.Is(err, tt.err) || ok != tt.wantOK || u != tt.want {
				t.Errorf("Authenticate = %v, %v, %v", u, ok, err)
			}
		})
	}
}
