package fleetapi

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// SignerCommonName is the common name of the certificates that sign
// releases; a certificate of the cluster's CA with another name, or
// without the code-signing usage, signs nothing an agent accepts.
const SignerCommonName = "tether release signer"

// Statement is what the hub signs for a release: every field of the spec
// but the signature itself, one per line, so that neither the bytes of
// the executable nor what it claims to be can change without the
// signature failing.
func Statement(s ReleaseSpec) []byte {
	return fmt.Appendf(nil, "tether release\nversion %s\narch %s\nbuild %s\ndigest %s\nsize %d\n",
		s.Version, s.Arch, s.Build, s.Digest, s.Size)
}

// Sign fills s.Signature and s.Signer with key's signature and its
// certificate's PEM.
func Sign(s *ReleaseSpec, key crypto.Signer, certPEM []byte) error {
	sum := sha256.Sum256(Statement(*s))
	sig, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return fmt.Errorf("sign release %s: %w", s.Version, err)
	}
	s.Signature = base64.StdEncoding.EncodeToString(sig)
	s.Signer = string(certPEM)
	return nil
}

// Verify checks that s was signed by a release signer of the CAs in
// roots, as of now.
func Verify(s ReleaseSpec, roots *x509.CertPool, now time.Time) error {
	block, _ := pem.Decode([]byte(s.Signer))
	if block == nil || block.Type != "CERTIFICATE" {
		return errors.New("release signature: the signer is not a PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("release signature: signer: %w", err)
	}
	if cert.Subject.CommonName != SignerCommonName {
		return fmt.Errorf("release signature: signer %q is not a release signer", cert.Subject.CommonName)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}}); err != nil {
		return fmt.Errorf("release signature: signer not trusted: %w", err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("release signature: signer key is %T, want ECDSA", cert.PublicKey)
	}
	sig, err := base64.StdEncoding.DecodeString(s.Signature)
	if err != nil {
		return fmt.Errorf("release signature: %w", err)
	}
	sum := sha256.Sum256(Statement(s))
	if !ecdsa.VerifyASN1(pub, sum[:], sig) {
		return errors.New("release signature does not match the release")
	}
	return nil
}
