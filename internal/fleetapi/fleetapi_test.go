package fleetapi

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"strings"
	"testing"
	"time"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testCA{cert, key}
}

func (ca testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

func (ca testCA) issue(t *testing.T, cn string, usage x509.ExtKeyUsage) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestSignAndVerify(t *testing.T) {
	ca := newCA(t)
	key, cert := ca.issue(t, SignerCommonName, x509.ExtKeyUsageCodeSigning)
	spec := ReleaseSpec{Version: "v1.2.0", Arch: "amd64", Build: BuildEdge,
		Digest: "sha256:" + strings.Repeat("ab", 32), Size: 1234}
	if err := Sign(&spec, key, cert); err != nil {
		t.Fatal(err)
	}
	if err := Verify(spec, ca.pool(), time.Now()); err != nil {
		t.Fatalf("a signed release: %v", err)
	}
	changed := map[string]func(*ReleaseSpec){
		"version": func(s *ReleaseSpec) { s.Version = "v1.2.1" },
		"arch":    func(s *ReleaseSpec) { s.Arch = "arm64" },
		"build":   func(s *ReleaseSpec) { s.Build = BuildFull },
		"digest":  func(s *ReleaseSpec) { s.Digest = "sha256:" + strings.Repeat("cd", 32) },
		"size":    func(s *ReleaseSpec) { s.Size++ },
		"signature": func(s *ReleaseSpec) {
			s.Signature = s.Signature[:10] + strings.ToUpper(s.Signature[10:11]) + s.Signature[11:]
		},
	}
	for field, change := range changed {
		s := spec
		change(&s)
		if s == spec {
			continue
		}
		if err := Verify(s, ca.pool(), time.Now()); err == nil {
			t.Errorf("a release with its %s changed verified", field)
		}
	}
	if err := Verify(spec, newCA(t).pool(), time.Now()); err == nil || !strings.Contains(err.Error(), "not trusted") {
		t.Errorf("another CA: %v", err)
	}
	if err := Verify(spec, ca.pool(), time.Now().Add(2*time.Hour)); err == nil {
		t.Error("an expired signer verified")
	}
	for name, c := range map[string]struct {
		cn    string
		usage x509.ExtKeyUsage
	}{"client certificate": {SignerCommonName, x509.ExtKeyUsageClientAuth}, "other name": {"system:node:n1", x509.ExtKeyUsageCodeSigning}} {
		k, crt := ca.issue(t, c.cn, c.usage)
		s := spec
		if err := Sign(&s, k, crt); err != nil {
			t.Fatal(err)
		}
		if err := Verify(s, ca.pool(), time.Now()); err == nil {
			t.Errorf("signed with a %s: verified", name)
		}
	}
}

func TestDeltaRoundTrip(t *testing.T) {
	old := make([]byte, 3<<20)
	rand.Read(old)
	cur := bytes.Clone(old)
	copy(cur[1<<20:], []byte("a few changed bytes in the middle"))
	cur = append(cur, []byte("and some more at the end")...)
	var delta bytes.Buffer
	if err := EncodeDelta(&delta, old, bytes.NewReader(cur)); err != nil {
		t.Fatal(err)
	}
	if delta.Len() > 4<<10 {
		t.Errorf("delta of a few changes to 3 MiB of random bytes is %d bytes", delta.Len())
	}
	var out bytes.Buffer
	if err := DecodeDelta(&out, old, bytes.NewReader(delta.Bytes()), int64(len(cur))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), cur) {
		t.Fatal("decoded delta differs")
	}
	out.Reset()
	if err := DecodeDelta(&out, old, bytes.NewReader(delta.Bytes()), int64(len(cur))-1); err == nil {
		t.Error("a delta longer than its limit decoded")
	}
	other := bytes.Clone(old)
	other[100]++
	out.Reset()
	if err := DecodeDelta(&out, other, bytes.NewReader(delta.Bytes()), int64(len(cur))); err == nil && bytes.Equal(out.Bytes(), cur) {
		t.Error("a delta applied to another base gave the release")
	}
}

func TestReadExecutableRefusesOthers(t *testing.T) {
	f, err := os.Open(os.Args[0]) // the test binary: Go, but not tether
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ReadExecutable(f); err == nil || !strings.Contains(err.Error(), "not tether") {
		t.Errorf("the test binary: %v", err)
	}
	if _, err := ReadExecutable(strings.NewReader("#!/bin/sh\necho v1\n")); err == nil || !strings.Contains(err.Error(), "not a Go executable") {
		t.Errorf("a script: %v", err)
	}
}

func TestNamesAndMessages(t *testing.T) {
	for v, want := range map[string]string{
		"v1.4.0":          "v1.4.0-edge-amd64",
		"V2.0.0+build.7":  "v2.0.0-build.7-edge-amd64",
		"1.0_rc1":         "1.0-rc1-edge-amd64",
		"+weird+version+": "weird-version-edge-amd64",
	} {
		if got := ReleaseName(v, BuildEdge, "amd64"); got != want {
			t.Errorf("ReleaseName(%q) = %q, want %q", v, got, want)
		}
	}
	m := UpgradeMessage("v2-edge-amd64", "refused: signature does not match")
	if got := UpgradeRelease(m); got != "v2-edge-amd64" {
		t.Errorf("UpgradeRelease(%q) = %q", m, got)
	}
	if _, err := ParseDigest("sha256:" + strings.Repeat("A", 64)); err == nil {
		t.Error("upper-case digest accepted")
	}
	if h, err := ParseDigest("sha256:" + strings.Repeat("0", 64)); err != nil || len(h) != 64 {
		t.Errorf("ParseDigest: %q %v", h, err)
	}
}
