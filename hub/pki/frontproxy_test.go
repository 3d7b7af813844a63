package pki

import (
	"crypto/x509"
	"testing"
)

func TestFrontProxyIsSeparateAndKept(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreate(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	fp, err := a.FrontProxy()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(fp.Client.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Subject.CommonName != FrontProxyClientName {
		t.Fatalf("client CN = %q", leaf.Subject.CommonName)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(fp.CAPEM)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client certificate does not verify against the front-proxy CA: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("front-proxy client certificate verifies against the cluster CA")
	}
	again, err := LoadOrCreate(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	fp2, err := again.FrontProxy()
	if err != nil {
		t.Fatal(err)
	}
	if string(fp2.CAPEM) != string(fp.CAPEM) || string(fp2.Client.Certificate[0]) != string(fp.Client.Certificate[0]) {
		t.Fatal("front-proxy CA or client certificate changed across loads")
	}
}
