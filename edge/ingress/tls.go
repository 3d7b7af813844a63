package ingress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// parsedCert is a Secret's certificate, parsed once per version of the
// Secret.
type parsedCert struct {
	uid, version string
	cert         *tls.Certificate // nil: the Secret holds no usable pair
}

// cert returns the certificate of the kubernetes.io/tls Secret ref, or
// nil when the controller has no such Secret or its pair does not parse.
// The caller holds c.mu.
func (c *Controller) cert(ref types.NamespacedName) *tls.Certificate {
	s := c.secrets[ref]
	if s == nil {
		return nil
	}
	if p, ok := c.certs[ref]; ok && p.uid == string(s.UID) && p.version == s.ResourceVersion {
		return p.cert
	}
	p := parsedCert{uid: string(s.UID), version: s.ResourceVersion}
	if cert, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
		c.log.Warn("TLS Secret has no usable certificate", "secret", ref.String(), "err", err)
	} else {
		p.cert = &cert
	}
	c.certs[ref] = p
	return p.cert
}

// forgetCerts drops the parsed certificates of Secrets the controller no
// longer has. The caller holds c.mu.
func (c *Controller) forgetCerts() {
	for ref := range c.certs {
		if c.secrets[ref] == nil {
			delete(c.certs, ref)
		}
	}
}

// selfSigned makes the certificate served to TLS names no Secret covers,
// as ingress controllers do with their "fake" default certificate.
func selfSigned() (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("generate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "tether ingress default certificate"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"ingress.local"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
