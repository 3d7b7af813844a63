package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"time"
)

// FrontProxyClientName is the common name of the front-proxy client
// certificate, the one name extension API servers are told to accept
// (requestheader-allowed-names), as kubeadm names it.
const FrontProxyClientName = "front-proxy-client"

// FrontProxy is the request-header authority: a CA of its own, separate
// from the cluster CA so that a certificate it signs is good for nothing
// but asserting a caller's identity in front-proxy headers, and the
// client certificate the hub presents when it proxies a request to an
// extension API server.
type FrontProxy struct {
	// CAPEM is the front-proxy CA certificate, PEM-encoded
	// (requestheader-client-ca-file).
	CAPEM []byte
	// Client is the hub's front-proxy client certificate and key.
	Client tls.Certificate
}

// FrontProxy loads the front-proxy CA and client certificate from the
// authority's directory (pki/front-proxy-ca.{crt,key} and
// pki/front-proxy-client.{crt,key}), creating them on first use and
// re-issuing the client certificate when a third of its life remains.
func (a *Authority) FrontProxy() (*FrontProxy, error) {
	caCert, caKey, caPEM, err := a.loadOrCreateCAPair("front-proxy-ca", "front-proxy-ca")
	if err != nil {
		return nil, err
	}
	certPEM, errC := os.ReadFile(a.path("front-proxy-client.crt"))
	keyPEM, errK := os.ReadFile(a.path("front-proxy-client.key"))
	if errC == nil && errK == nil {
		cert, _, err := parsePair(certPEM, keyPEM)
		if err == nil && a.fresh(cert) && cert.CheckSignatureFrom(caCert) == nil {
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				return nil, fmt.Errorf("load front-proxy client certificate: %w", err)
			}
			return &FrontProxy{CAPEM: caPEM, Client: pair}, nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate front-proxy client key: %w", err)
	}
	now := a.cfg.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: FrontProxyClientName},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              minTime(now.Add(a.cfg.ServingValidity), caCert.NotAfter),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("sign front-proxy client certificate: %w", err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if keyPEM, err = encodeKey(key); err != nil {
		return nil, err
	}
	if err := writeAtomic(a.path("front-proxy-client.key"), keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeAtomic(a.path("front-proxy-client.crt"), certPEM, 0o644); err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load front-proxy client certificate: %w", err)
	}
	return &FrontProxy{CAPEM: caPEM, Client: pair}, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
