package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"time"
)

// DefaultIssuer is the iss claim of service account tokens, as upstream
// clusters commonly set it; it is also the audience the API accepts.
const DefaultIssuer = "https://kubernetes.default.svc.cluster.local"

// Claims are what a service account token says.
type Claims struct {
	Namespace, ServiceAccount, ServiceAccountUID string
	// PodName and PodUID bind the token to a pod: it stops working when
	// the pod is gone.
	PodName, PodUID string
	// NodeName and NodeUID bind the token to a node.
	NodeName, NodeUID string
	Audiences         []string
	IssuedAt, Expiry  time.Time
}

// ServiceAccountTokens issues and checks service account tokens: JWTs
// signed with ES256 by the hub's service account key, as the TokenRequest
// API (serviceaccounts/token) hands them out.
type ServiceAccountTokens struct {
	key    *ecdsa.PrivateKey
	keyID  string
	issuer string
	// APIAudiences are the audiences a token must carry to authenticate
	// to the hub itself.
	apiAudiences []string
	// Exists reports whether the objects a token names still exist with
	// the same UIDs: the service account, and its bound pod or node.
	exists func(ctx context.Context, c Claims) error
	now    func() time.Time
}

// NewServiceAccountTokens returns a signer and authenticator. exists
// checks that the objects a token names are still there; nil skips that.
func NewServiceAccountTokens(key *ecdsa.PrivateKey, exists func(ctx context.Context, c Claims) error) *ServiceAccountTokens {
	pub, _ := json.Marshal([]string{key.X.Text(16), key.Y.Text(16)})
	sum := sha256.Sum256(pub)
	return &ServiceAccountTokens{key: key, keyID: hex.EncodeToString(sum[:8]), issuer: DefaultIssuer,
		apiAudiences: []string{DefaultIssuer}, exists: exists, now: time.Now}
}

// APIAudiences returns the audiences a token must carry to authenticate to
// the hub's API.
func (t *ServiceAccountTokens) APIAudiences() []string { return slices.Clone(t.apiAudiences) }

// Issuer returns the iss claim the tokens carry.
func (t *ServiceAccountTokens) Issuer() string { return t.issuer }

type jwtHeader struct {
	Alg string `json:"alg"`
	Kid string `json:"kid,omitempty"`
	Typ string `json:"typ,omitempty"`
}

type k8sClaims struct {
	Namespace      string  `json:"namespace"`
	ServiceAccount objRef  `json:"serviceaccount"`
	Pod            *objRef `json:"pod,omitempty"`
	Node           *objRef `json:"node,omitempty"`
}

type objRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

type jwtClaims struct {
	Iss string    `json:"iss"`
	Sub string    `json:"sub"`
	Aud []string  `json:"aud"`
	Exp int64     `json:"exp"`
	Iat int64     `json:"iat"`
	Nbf int64     `json:"nbf"`
	Jti string    `json:"jti"`
	K8s k8sClaims `json:"kubernetes.io"`
}

var b64 = base64.RawURLEncoding

// Issue signs a token with c.
func (t *ServiceAccountTokens) Issue(c Claims) (string, error) {
	if c.Namespace == "" || c.ServiceAccount == "" {
		return "", errors.New("issue token: no service account")
	}
	var jti [16]byte
	_, _ = rand.Read(jti[:])
	cl := jwtClaims{
		Iss: t.issuer, Sub: "system:serviceaccount:" + c.Namespace + ":" + c.ServiceAccount,
		Aud: c.Audiences, Exp: c.Expiry.Unix(), Iat: c.IssuedAt.Unix(), Nbf: c.IssuedAt.Unix(), Jti: hex.EncodeToString(jti[:]),
		K8s: k8sClaims{Namespace: c.Namespace, ServiceAccount: objRef{c.ServiceAccount, c.ServiceAccountUID}},
	}
	if c.PodName != "" {
		cl.K8s.Pod = &objRef{c.PodName, c.PodUID}
	}
	if c.NodeName != "" {
		cl.K8s.Node = &objRef{c.NodeName, c.NodeUID}
	}
	head, _ := json.Marshal(jwtHeader{Alg: "ES256", Kid: t.keyID})
	body, err := json.Marshal(cl)
	if err != nil {
		return "", fmt.Errorf("issue token: %w", err)
	}
	signing := b64.EncodeToString(head) + "." + b64.EncodeToString(body)
	sum := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, t.key, sum[:])
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signing + "." + b64.EncodeToString(sig), nil
}

// errNotOurs marks a bearer token that is not one of our JWTs, so other
// authenticators may look at it.
var errNotOurs = errors.New("not a service account token")

// Verify checks a token's signature, time window and audience (one of
// audiences) and returns its claims.
func (t *ServiceAccountTokens) Verify(token string, audiences []string) (Claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return Claims{}, errNotOurs
	}
	headRaw, err := b64.DecodeString(parts[0])
	if err != nil {
		return Claims{}, errNotOurs
	}
	var head jwtHeader
	if json.Unmarshal(headRaw, &head) != nil || head.Alg != "ES256" {
		return Claims{}, errNotOurs
	}
	body, err := b64.DecodeString(parts[1])
	if err != nil {
		return Claims{}, errNotOurs
	}
	var cl jwtClaims
	if json.Unmarshal(body, &cl) != nil || cl.Iss != t.issuer {
		return Claims{}, errNotOurs
	}
	sig, err := b64.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return Claims{}, errors.New("service account token: bad signature encoding")
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(&t.key.PublicKey, sum[:], r, s) {
		return Claims{}, errors.New("service account token: invalid signature")
	}
	now := t.now().Unix()
	// A minute of leeway for clocks, as upstream.
	if now > cl.Exp+60 {
		return Claims{}, errors.New("service account token has expired")
	}
	if now+60 < cl.Nbf {
		return Claims{}, errors.New("service account token is not valid yet")
	}
	if !slices.ContainsFunc(cl.Aud, func(a string) bool { return slices.Contains(audiences, a) }) {
		return Claims{}, errors.New("service account token has no audience this server accepts")
	}
	c := Claims{Namespace: cl.K8s.Namespace, ServiceAccount: cl.K8s.ServiceAccount.Name, ServiceAccountUID: cl.K8s.ServiceAccount.UID,
		Audiences: cl.Aud, IssuedAt: time.Unix(cl.Iat, 0), Expiry: time.Unix(cl.Exp, 0)}
	if cl.K8s.Pod != nil {
		c.PodName, c.PodUID = cl.K8s.Pod.Name, cl.K8s.Pod.UID
	}
	if cl.K8s.Node != nil {
		c.NodeName, c.NodeUID = cl.K8s.Node.Name, cl.K8s.Node.UID
	}
	if "system:serviceaccount:"+c.Namespace+":"+c.ServiceAccount != cl.Sub {
		return Claims{}, errors.New("service account token: subject and claims disagree")
	}
	return c, nil
}

// Authenticate implements [Authenticator] for bearer tokens that are our
// JWTs; other bearer tokens are left to the next authenticator. The token
// must carry one of the API's audiences, or of those WithAudiences put in
// the request's context.
func (t *ServiceAccountTokens) Authenticate(r *http.Request) (*User, bool, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return nil, false, nil
	}
	auds, ok := AudiencesFrom(r.Context())
	if !ok {
		auds = t.apiAudiences
	}
	c, err := t.Verify(strings.TrimSpace(token), auds)
	if errors.Is(err, errNotOurs) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if t.exists != nil {
		if err := t.exists(r.Context(), c); err != nil {
			return nil, false, fmt.Errorf("service account token: %w", err)
		}
	}
	return &User{
		Name:   "system:serviceaccount:" + c.Namespace + ":" + c.ServiceAccount,
		UID:    c.ServiceAccountUID,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + c.Namespace, GroupAuthenticated},
	}, true, nil
}
