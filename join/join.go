package join

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Paths of the exchanges on the hub's API port.
const (
	JoinPath     = "/tether/v1/join"
	RenewPath    = "/tether/v1/renew"
	ReattestPath = "/tether/v1/reattest"
)

// Identity of nodes, as in upstream Kubernetes.
const (
	NodeUserPrefix = "system:node:"
	NodesGroup     = "system:nodes"
)

// Bootstrap tokens are stored as upstream does: a Secret of type
// BootstrapTokenSecretType named BootstrapTokenSecretPrefix+<id> in
// kube-system, with these data keys.
const (
	BootstrapTokenSecretType     = "bootstrap.kubernetes.io/token"
	BootstrapTokenSecretPrefix   = "bootstrap-token-"
	BootstrapTokenIDKey          = "token-id"
	BootstrapTokenSecretKey      = "token-secret"
	BootstrapTokenExpirationKey  = "expiration"
	BootstrapTokenUsageAuthKey   = "usage-bootstrap-authentication"
	BootstrapTokenDescriptionKey = "description"
)

// tokenPrefix starts every join token so that a pasted bootstrap token
// without a pin is recognised and refused with a clear message.
const tokenPrefix = "tether"

var (
	idRE     = regexp.MustCompile(`^[a-z0-9]{6}$`)
	secretRE = regexp.MustCompile(`^[a-z0-9]{16}$`)
	hashRE   = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ErrMalformedToken is returned by ParseToken.
var ErrMalformedToken = errors.New("malformed join token")

// Token is a join token: the id and secret of a bootstrap token, and the
// hash of the hub CA's public key that the joining node pins.
//
// Its text form is "tether:<id>.<secret>:sha256:<hex>", e.g.
// tether:abcdef.0123456789abcdef:sha256:3b9f…
type Token struct {
	ID     string // 6 characters [a-z0-9]
	Secret string // 16 characters [a-z0-9]
	CAHash string // "sha256:<64 hex digits>"
}

// ParseToken parses the text form of a join token.
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, tokenPrefix+":")
	if !ok {
		return Token{}, fmt.Errorf("%w: want tether:<id>.<secret>:sha256:<hash> as printed by `tether token create`", ErrMalformedToken)
	}
	bearer, hash, ok := strings.Cut(rest, ":")
	if !ok {
		return Token{}, fmt.Errorf("%w: no CA hash", ErrMalformedToken)
	}
	id, secret, ok := strings.Cut(bearer, ".")
	if !ok || !idRE.MatchString(id) || !secretRE.MatchString(secret) {
		return Token{}, fmt.Errorf("%w: the token part must be <6 chars>.<16 chars> of [a-z0-9]", ErrMalformedToken)
	}
	if !hashRE.MatchString(hash) {
		return Token{}, fmt.Errorf("%w: the CA hash must be sha256:<64 hex digits>", ErrMalformedToken)
	}
	return Token{ID: id, Secret: secret, CAHash: hash}, nil
}

// String returns the text form of t.
func (t Token) String() string {
	return tokenPrefix + ":" + t.Bearer() + ":" + t.CAHash
}

// Bearer returns "<id>.<secret>", the bearer token the hub checks.
func (t Token) Bearer() string { return t.ID + "." + t.Secret }

// ParseBearer splits a bootstrap bearer token "<id>.<secret>"; ok is false
// when it does not have that shape.
func ParseBearer(s string) (id, secret string, ok bool) {
	id, secret, ok = strings.Cut(s, ".")
	if !ok || !idRE.MatchString(id) || !secretRE.MatchString(secret) {
		return "", "", false
	}
	return id, secret, true
}

// CAHash returns "sha256:<hex>" of cert's SubjectPublicKeyInfo, the form
// kubeadm uses to pin a cluster CA.
func CAHash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// NodeName returns the node named by a certificate subject's common name
// "system:node:<name>", or false.
func NodeName(commonName string) (string, bool) {
	name, ok := strings.CutPrefix(commonName, NodeUserPrefix)
	if !ok || name == "" {
		return "", false
	}
	return name, true
}
