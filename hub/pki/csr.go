package pki

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// SigningPolicy says what a certificate signed from a request holds
// beyond the request's subject, names and key.
type SigningPolicy struct {
	// TTL is how long the certificate is valid from now (capped at the
	// CA's own expiry).
	TTL time.Duration
	// Backdate moves notBefore into the past to tolerate clock skew.
	// Certificates with a TTL of 8 hours or more count it in their
	// lifetime; shorter ones get the whole TTL from now.
	Backdate time.Duration
	// KeyUsage and ExtKeyUsage are the certificate's usages.
	KeyUsage    x509.KeyUsage
	ExtKeyUsage []x509.ExtKeyUsage
}

// shortLived is the TTL under which backdating does not shorten a
// certificate's lifetime from now.
const shortLived = 8 * time.Hour

// SignRequest signs a checked certificate request with the CA under p,
// keeping the request's subject and subject alternative names, and returns
// the certificate in PEM form.
func (a *Authority) SignRequest(req *x509.CertificateRequest, p SigningPolicy) ([]byte, error) {
	if req == nil {
		return nil, errors.New("sign certificate request: no request")
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("check certificate request: %w", err)
	}
	now := a.cfg.Now()
	notBefore := now.Add(-p.Backdate)
	notAfter := notBefore.Add(p.TTL)
	if p.TTL < shortLived {
		notAfter = now.Add(p.TTL)
	}
	if notAfter.After(a.caCert.NotAfter) {
		notAfter = a.caCert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               req.Subject,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              p.KeyUsage,
		ExtKeyUsage:           p.ExtKeyUsage,
		BasicConstraintsValid: true,
		DNSNames:              req.DNSNames,
		IPAddresses:           req.IPAddresses,
		EmailAddresses:        req.EmailAddresses,
		URIs:                  req.URIs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.caCert, req.PublicKey, a.caKey)
	if err != nil {
		return nil, fmt.Errorf("sign certificate request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
