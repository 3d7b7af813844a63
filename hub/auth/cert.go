package auth

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// GroupAuthenticated is added to the groups of every authenticated user.
const GroupAuthenticated = "system:authenticated"

// CertAuthenticator authenticates requests by their TLS client certificate:
// the user is the subject's CN, the groups its O values.
type CertAuthenticator struct {
	roots *x509.CertPool
	now   func() time.Time
}

// NewCertAuthenticator returns an authenticator for client certificates
// signed by a CA in roots. When the TLS layer already verified the chain
// (tls.VerifyClientCertIfGiven with the same pool) its result is used;
// otherwise the leaf is verified here. A nil roots trusts only chains the
// TLS layer verified.
func NewCertAuthenticator(roots *x509.CertPool) *CertAuthenticator {
	return &CertAuthenticator{roots: roots, now: time.Now}
}

// Authenticate implements [Authenticator].
func (a *CertAuthenticator) Authenticate(r *http.Request) (*User, bool, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		// Requests that come through a node's tunnel carry no TLS state
		// of their own: the tunnel verified the node's certificate in
		// its handshake and put it in the connection's context.
		if certs := peerCertificates(r.Context()); len(certs) > 0 {
			return userOf(certs[0])
		}
		return nil, false, nil
	}
	leaf := r.TLS.PeerCertificates[0]
	if len(r.TLS.VerifiedChains) == 0 {
		if a.roots == nil {
			return nil, false, errors.New("verify client certificate: no verified chain")
		}
		inter := x509.NewCertPool()
		for _, c := range r.TLS.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := leaf.Verify(x509.VerifyOptions{
			Roots:         a.roots,
			Intermediates: inter,
			CurrentTime:   a.now(),
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		if err != nil {
			return nil, false, fmt.Errorf("verify client certificate: %w", err)
		}
	}
	return userOf(leaf)
}

func userOf(leaf *x509.Certificate) (*User, bool, error) {
	if leaf.Subject.CommonName == "" {
		return nil, false, errors.New("verify client certificate: empty common name")
	}
	groups := slices.Clone(leaf.Subject.Organization)
	if !slices.Contains(groups, GroupAuthenticated) {
		groups = append(groups, GroupAuthenticated)
	}
	return &User{Name: leaf.Subject.CommonName, Groups: groups}, true, nil
}

// Union tries each authenticator in order. The first that accepts the
// request wins; the first error (credentials presented but invalid) ends the
// search, so a bad token never falls through to anonymous access.
type Union []Authenticator

// Authenticate implements [Authenticator].
func (u Union) Authenticate(r *http.Request) (*User, bool, error) {
	for _, a := range u {
		user, ok, err := a.Authenticate(r)
		if err != nil {
			return nil, false, err
		}
		if ok {
			return user, true, nil
		}
	}
	return nil, false, nil
}

type peerKey struct{}

// WithPeerCertificates returns a context carrying the verified certificate
// chain of a connection that is not TLS itself (a tunnel stream); requests
// served on it authenticate as the chain's leaf.
func WithPeerCertificates(ctx context.Context, certs []*x509.Certificate) context.Context {
	return context.WithValue(ctx, peerKey{}, certs)
}

func peerCertificates(ctx context.Context) []*x509.Certificate {
	certs, _ := ctx.Value(peerKey{}).([]*x509.Certificate)
	return certs
}
