package pki

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"time"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// releaseSignerRenewal is how much validity the release signer's
// certificate must have left to be kept: a signature is checked against
// the certificate's validity when an agent verifies it, so a release
// signed late in the certificate's life would soon stop verifying.
const releaseSignerRenewal = 365 * 24 * time.Hour

// releaseSignerValidity is the lifetime of a new release signer
// certificate (capped at the CA's expiry).
const releaseSignerValidity = 5 * 365 * 24 * time.Hour

// ReleaseSigner returns the key that signs releases and its certificate
// in PEM form, loading pki/release-signer.{crt,key} or creating them: an
// ECDSA P-256 key whose certificate, issued by the cluster CA, names
// fleetapi.SignerCommonName and allows code signing only. A certificate
// with less than a year of validity left, or not issued by the current
// CA, is replaced by a new key and certificate. Each hub of a cluster
// may hold its own: agents trust any signer the cluster CA issued.
func (a *Authority) ReleaseSigner() (crypto.Signer, []byte, error) {
	a.signerMu.Lock()
	defer a.signerMu.Unlock()
	certPath, keyPath := a.path("release-signer.crt"), a.path("release-signer.key")
	certPEM, errC := os.ReadFile(certPath)
	keyPEM, errK := os.ReadFile(keyPath)
	if errC == nil && errK == nil {
		cert, key, err := parsePair(certPEM, keyPEM)
		if err == nil && a.releaseSignerUsable(cert) {
			return key, certPEM, nil
		}
	}
	// issue caps the validity at the CA's own expiry.
	certPEM, keyPEM, err := a.issue(pkix.Name{CommonName: fleetapi.SignerCommonName}, nil, nil,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}, releaseSignerValidity, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("issue the release signer certificate: %w", err)
	}
	if err := writeAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	if err := writeAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, nil, err
	}
	_, key, err := parsePair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("load the release signer: %w", err)
	}
	return key, certPEM, nil
}

// releaseSignerUsable reports whether cert is a release signer of the
// current CA with at least a year of validity left (or, when the CA
// itself expires sooner, as much as the CA allows).
func (a *Authority) releaseSignerUsable(cert *x509.Certificate) bool {
	if cert.Subject.CommonName != fleetapi.SignerCommonName || cert.CheckSignatureFrom(a.caCert) != nil {
		return false
	}
	left := cert.NotAfter.Sub(a.cfg.Now())
	if caLeft := a.caCert.NotAfter.Sub(a.cfg.Now()); caLeft < releaseSignerRenewal {
		// Nothing the CA issues can last a year: keep one that lasts as
		// long as the CA, within a day.
		return left > 0 && left >= caLeft-24*time.Hour
	}
	return left >= releaseSignerRenewal
}
