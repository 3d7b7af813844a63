package nodes

import (
	"context"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/join"
)

// Joiner serves the join exchanges of package join.
type Joiner struct {
	cfg Config
}

// NewJoiner returns the join endpoints for cfg.
func NewJoiner(cfg Config) *Joiner {
	cfg.setDefaults()
	return &Joiner{cfg: cfg}
}

// Handlers returns the endpoints keyed by path, for apiserver.Config.Extensions.
func (j *Joiner) Handlers() map[string]http.Handler {
	return map[string]http.Handler{
		join.JoinPath:     http.HandlerFunc(j.serveJoin),
		join.RenewPath:    http.HandlerFunc(j.serveRenew),
		join.ReattestPath: http.HandlerFunc(j.serveReattest),
	}
}

func (j *Joiner) serveJoin(w http.ResponseWriter, r *http.Request) {
	req, ok := j.decode(w, r)
	if !ok {
		return
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if err := j.checkBootstrapToken(r.Context(), bearer); err != nil {
		writeStatus(w, apierrors.NewUnauthorized(err.Error()))
		return
	}
	j.sign(w, r, req, nil)
}

func (j *Joiner) serveRenew(w http.ResponseWriter, r *http.Request) {
	req, ok := j.decode(w, r)
	if !ok {
		return
	}
	u, ok := auth.UserFrom(r.Context())
	if !ok {
		writeStatus(w, apierrors.NewUnauthorized("renewing a node certificate needs the node's current credentials"))
		return
	}
	if u.Name != join.NodeUserPrefix+req.Node || !slices.Contains(u.Groups, join.NodesGroup) {
		writeStatus(w, apierrors.NewForbidden(nodesKind.GroupResource(), req.Node,
			fmt.Errorf("user %q may not renew the certificate of node %q", u.Name, req.Node)))
		return
	}
	j.sign(w, r, req, nil)
}

// serveReattest signs again for a node whose certificate expired: the old
// certificate must come from this CA and be for the same key that signed
// the request, and the Node object must still exist.
func (j *Joiner) serveReattest(w http.ResponseWriter, r *http.Request) {
	req, ok := j.decode(w, r)
	if !ok {
		return
	}
	old, err := join.ParseCertificate(req.Certificate)
	if err != nil {
		writeStatus(w, apierrors.NewBadRequest("re-attestation needs the node's previous certificate: "+err.Error()))
		return
	}
	// Verify the chain at a moment the certificate was valid: expiry is
	// the reason for re-attesting, forgery is not.
	if _, err := old.Verify(x509.VerifyOptions{
		Roots:       j.cfg.Authority.CAPool(),
		CurrentTime: old.NotBefore.Add(time.Second),
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		writeStatus(w, apierrors.NewUnauthorized("the previous certificate was not issued by this hub: "+err.Error()))
		return
	}
	if name, err := Identify(old); err != nil || name != req.Node {
		writeStatus(w, apierrors.NewForbidden(nodesKind.GroupResource(), req.Node,
			fmt.Errorf("the previous certificate does not belong to node %q", req.Node)))
		return
	}
	if _, err := j.cfg.Storage.Get(r.Context(), nodesKind, "", req.Node); err != nil {
		if apierrors.IsNotFound(err) {
			writeStatus(w, apierrors.NewForbidden(nodesKind.GroupResource(), req.Node,
				errors.New("the node no longer exists: join again with a token")))
			return
		}
		writeStatus(w, err)
		return
	}
	j.sign(w, r, req, old)
}

func (j *Joiner) decode(w http.ResponseWriter, r *http.Request) (join.Request, bool) {
	var req join.Request
	if r.Method != http.MethodPost {
		writeStatus(w, apierrors.NewMethodNotSupported(nodesKind.GroupResource(), r.Method))
		return req, false
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		writeStatus(w, apierrors.NewBadRequest("read request: "+err.Error()))
		return req, false
	}
	if err := json.Unmarshal(data, &req); err != nil {
		writeStatus(w, apierrors.NewBadRequest("decode join request: "+err.Error()))
		return req, false
	}
	if msgs := validation.IsDNS1123Subdomain(req.Node); len(msgs) > 0 {
		writeStatus(w, apierrors.NewBadRequest(fmt.Sprintf("invalid node name %q: %s", req.Node, strings.Join(msgs, "; "))))
		return req, false
	}
	return req, true
}

// sign checks the certificate request and answers with a node certificate.
// When old is set, the request must be for old's key.
func (j *Joiner) sign(w http.ResponseWriter, r *http.Request, req join.Request, old *x509.Certificate) {
	block, _ := pem.Decode(req.CSR)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		writeStatus(w, apierrors.NewBadRequest("csr: no PEM certificate request"))
		return
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		writeStatus(w, apierrors.NewBadRequest("csr: "+err.Error()))
		return
	}
	if csr.Subject.CommonName != join.NodeUserPrefix+req.Node ||
		!slices.Equal(csr.Subject.Organization, []string{join.NodesGroup}) ||
		len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses)+len(csr.URIs) > 0 {
		writeStatus(w, apierrors.NewBadRequest(fmt.Sprintf("csr: the subject must be exactly CN=%s%s, O=%s with no other names",
			join.NodeUserPrefix, req.Node, join.NodesGroup)))
		return
	}
	if old != nil {
		oldKey, err := x509.MarshalPKIXPublicKey(old.PublicKey)
		newKey, err2 := x509.MarshalPKIXPublicKey(csr.PublicKey)
		if err != nil || err2 != nil || subtle.ConstantTimeCompare(oldKey, newKey) != 1 {
			writeStatus(w, apierrors.NewForbidden(nodesKind.GroupResource(), req.Node,
				errors.New("the request is not signed by the key of the previous certificate")))
			return
		}
	}
	certPEM, err := j.cfg.Authority.Sign(req.CSR, j.cfg.CertTTL)
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	j.cfg.Logger.Info("issued node certificate", "node", req.Node, "path", r.URL.Path, "ttl", j.cfg.CertTTL)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(join.Response{Certificate: certPEM, CA: j.cfg.Authority.CAPEM()})
}

// checkBootstrapToken accepts a bearer "<id>.<secret>" whose Secret in
// kube-system is a bootstrap token for authentication that has not expired.
func (j *Joiner) checkBootstrapToken(ctx context.Context, bearer string) error {
	id, secret, ok := join.ParseBearer(bearer)
	if !ok {
		return errors.New("joining needs a bootstrap token: Authorization: Bearer <id>.<secret>")
	}
	obj, err := j.cfg.Storage.Get(ctx, secretsKind, metav1.NamespaceSystem, join.BootstrapTokenSecretPrefix+id)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("join token %s is unknown", id)
		}
		return fmt.Errorf("look up join token %s: %w", id, err)
	}
	s := obj.(*corev1.Secret)
	if string(s.Type) != join.BootstrapTokenSecretType ||
		string(s.Data[join.BootstrapTokenIDKey]) != id ||
		string(s.Data[join.BootstrapTokenUsageAuthKey]) != "true" {
		return fmt.Errorf("join token %s is not a bootstrap token for authentication", id)
	}
	if subtle.ConstantTimeCompare(s.Data[join.BootstrapTokenSecretKey], []byte(secret)) != 1 {
		return fmt.Errorf("join token %s has a wrong secret", id)
	}
	if exp := string(s.Data[join.BootstrapTokenExpirationKey]); exp != "" {
		t, err := time.Parse(time.RFC3339, exp)
		if err != nil {
			return fmt.Errorf("join token %s has an unreadable expiration %q", id, exp)
		}
		if !j.cfg.Now().Before(t) {
			return fmt.Errorf("join token %s expired at %s", id, t.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

func writeStatus(w http.ResponseWriter, err error) {
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		se = apierrors.NewInternalError(err)
	}
	st := se.ErrStatus
	st.Kind, st.APIVersion = "Status", "v1"
	st.Status = metav1.StatusFailure
	if st.Details == nil {
		st.Details = &metav1.StatusDetails{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_ = json.NewEncoder(w).Encode(st)
}
