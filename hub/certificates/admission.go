// Package certificates is the hub's side of certificates.k8s.io
// CertificateSigningRequests beyond what hub/registry says of the kind:
// the admission kube-apiserver applies to them (CertificateApproval,
// CertificateSigning, CertificateSubjectRestriction), and the signer of
// kubernetes.io/kube-apiserver-client, which kube-controller-manager runs
// upstream (csrsigning) and which here signs with the hub's CA, whose
// certificates the hub's authenticator accepts (CN = user, O = groups).
//
// The signer is an API client like the controllers; it lives in the hub,
// not in controllers, because it holds the CA's key.
package certificates

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	certificatesv1 "k8s.io/api/certificates/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

var csrGVK = certificatesv1.SchemeGroupVersion.WithKind("CertificateSigningRequest")

// Admission checks writes of CertificateSigningRequests as upstream's
// admission plugins do: approving (/approval) needs the `approve` verb on
// the `signers` resource named by the request's signerName (or by
// "<domain>/*"), issuing or failing (/status) needs `sign` on it, and no
// request to kubernetes.io/kube-apiserver-client may ask for the
// system:masters group. It implements storage.Admitter and
// storage.SubresourceAdmitter.
type Admission struct {
	mu    sync.RWMutex
	authz apiserver.Authorizer
}

var (
	_ storage.Admitter            = (*Admission)(nil)
	_ storage.SubresourceAdmitter = (*Admission)(nil)
)

// NewAdmission returns the admission; until SetAuthorizer it allows every
// approval and signature, as the API server allows every request without
// an authorizer.
func NewAdmission() *Admission { return &Admission{} }

// SetAuthorizer sets the authorizer asked about signers: the API server's.
func (a *Admission) SetAuthorizer(z apiserver.Authorizer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.authz = z
}

// AdmitCreate refuses a kube-apiserver-client request for system:masters.
func (a *Admission) AdmitCreate(_ context.Context, k *registry.Kind, obj runtime.Object, _ bool) (func(), error) {
	if k.GVK != csrGVK {
		return nil, nil
	}
	csr := obj.(*certificatesv1.CertificateSigningRequest)
	if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientSignerName {
		return nil, nil
	}
	req, err := registry.ParseCSR(csr.Spec.Request)
	if err != nil {
		return nil, forbidden(csr.Name, fmt.Sprintf("failed to parse CSR: %v", err))
	}
	for _, g := range req.Subject.Organization {
		if g == pki.AdminGroup {
			return nil, forbidden(csr.Name, fmt.Sprintf("use of %s signer with %s group is not allowed",
				certificatesv1.KubeAPIServerClientSignerName, pki.AdminGroup))
		}
	}
	return nil, nil
}

// AdmitSubresourceUpdate checks approvals and signatures against the
// signer's permissions.
func (a *Admission) AdmitSubresourceUpdate(ctx context.Context, k *registry.Kind, sub string, obj, old runtime.Object, _ bool) error {
	if k.GVK != csrGVK {
		return nil
	}
	cur, prev := obj.(*certificatesv1.CertificateSigningRequest), old.(*certificatesv1.CertificateSigningRequest)
	var verb string
	switch sub {
	case "approval":
		verb = "approve"
	case "status":
		if reflect.DeepEqual(cur.Status.Certificate, prev.Status.Certificate) &&
			apiequality.Semantic.DeepEqual(cur.Status.Conditions, prev.Status.Conditions) {
			return nil
		}
		verb = "sign"
	default:
		return nil
	}
	u, ok := auth.UserFrom(ctx)
	if !ok || u == nil {
		return nil // the hub itself, not a request
	}
	if a.mayUseSigner(u, verb, prev.Spec.SignerName) {
		return nil
	}
	return forbidden(prev.Name, fmt.Sprintf("user not permitted to %s requests with signerName %q", verb, prev.Spec.SignerName))
}

// mayUseSigner reports whether u may verb the signer, by its name or by
// its domain's wildcard.
func (a *Admission) mayUseSigner(u *auth.User, verb, signer string) bool {
	a.mu.RLock()
	z := a.authz
	a.mu.RUnlock()
	if z == nil {
		return true
	}
	at := apiserver.Attributes{Verb: verb, Resource: true, Group: certificatesv1.GroupName, Version: "*", Kind: "signers", Name: signer}
	if z.Authorize(u, at) == nil {
		return true
	}
	domain, _, _ := strings.Cut(signer, "/")
	at.Name = domain + "/*"
	return z.Authorize(u, at) == nil
}

func forbidden(name, msg string) error {
	return apierrors.NewForbidden(certificatesv1.Resource("certificatesigningrequests"), name, errors.New(msg))
}
