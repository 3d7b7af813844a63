package pki

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// TestReleaseSigner: the signer is created once, kept across loads,
// signs statements fleetapi.Verify accepts against the cluster CA, and
// is replaced once less than a year of its validity is left.
func TestReleaseSigner(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	clock := func() time.Time { return now }
	a, err := LoadOrCreate(Config{Dir: dir, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	key, certPEM, err := a.ReleaseSigner()
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != fleetapi.SignerCommonName || len(cert.ExtKeyUsage) != 1 ||
		cert.ExtKeyUsage[0] != x509.ExtKeyUsageCodeSigning || cert.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("signer certificate: CN %q, usages %v %v", cert.Subject.CommonName, cert.ExtKeyUsage, cert.KeyUsage)
	}
	if fi, err := os.Stat(filepath.Join(dir, "pki", "release-signer.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("signer key file: %v, %v", fi, err)
	}
	spec := fleetapi.ReleaseSpec{Version: "v1.0.0", Arch: "arm64", Build: fleetapi.BuildEdge,
		Digest: "sha256:" + string(bytes.Repeat([]byte("ab"), 32)), Size: 42}
	if err := fleetapi.Sign(&spec, key, certPEM); err != nil {
		t.Fatal(err)
	}
	if err := fleetapi.Verify(spec, a.CAPool(), now); err != nil {
		t.Fatalf("verify a release the signer signed: %v", err)
	}

	again, err := LoadOrCreate(Config{Dir: dir, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	_, kept, err := again.ReleaseSigner()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(kept, certPEM) {
		t.Error("the signer changed across loads")
	}

	// Four years and a bit later, less than a year is left: a new one.
	now = now.Add(4*365*24*time.Hour + 48*time.Hour)
	later, err := LoadOrCreate(Config{Dir: dir, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	_, renewed, err := later.ReleaseSigner()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(renewed, certPEM) {
		t.Error("the signer was kept with less than a year left")
	}
	spec.Signature, spec.Signer = "", ""
	key2, _, _ := later.ReleaseSigner()
	if err := fleetapi.Sign(&spec, key2, renewed); err != nil {
		t.Fatal(err)
	}
	if err := fleetapi.Verify(spec, later.CAPool(), now); err != nil {
		t.Fatalf("verify with the renewed signer: %v", err)
	}
}
