package certificates

import (
	"context"
	"fmt"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
)

// grants allows exactly the listed "verb resource name" triples and
// records what it was asked.
type grants struct {
	allowed map[string]bool
	asked   []string
}

func (g *grants) Authorize(_ *auth.User, a apiserver.Attributes) error {
	k := fmt.Sprintf("%s %s/%s %s %s", a.Verb, a.Group, a.Version, a.Kind, a.Name)
	g.asked = append(g.asked, k)
	if g.allowed[k] {
		return nil
	}
	return apierrors.NewForbidden(schema.GroupResource{}, a.Name, fmt.Errorf("no"))
}

// TestSignerPermissions: approving needs approve on the signer by name or
// by its domain's wildcard, issuing needs sign; others are refused with
// upstream's message.
func TestSignerPermissions(t *testing.T) {
	kind := registry.Lookup(certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests"))
	old := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "r"},
		Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: "example.com/team"}}
	approved := old.DeepCopy()
	approved.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
	issued := old.DeepCopy()
	issued.Status.Certificate = []byte("c")
	ctx := auth.WithUser(context.Background(), &auth.User{Name: "u", Groups: []string{"g"}})

	for _, tc := range []struct {
		name, sub string
		obj       *certificatesv1.CertificateSigningRequest
		allowed   []string
		wantErr   string
	}{
		{"approve by name", "approval", approved, []string{"approve certificates.k8s.io/* signers example.com/team"}, ""},
		{"approve by domain", "approval", approved, []string{"approve certificates.k8s.io/* signers example.com/*"}, ""},
		{"approve refused", "approval", approved, []string{"sign certificates.k8s.io/* signers example.com/team"},
			`certificatesigningrequests.certificates.k8s.io "r" is forbidden: user not permitted to approve requests with signerName "example.com/team"`},
		{"sign", "status", issued, []string{"sign certificates.k8s.io/* signers example.com/team"}, ""},
		{"sign refused", "status", issued, nil,
			`certificatesigningrequests.certificates.k8s.io "r" is forbidden: user not permitted to sign requests with signerName "example.com/team"`},
		{"status unchanged", "status", old, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &grants{allowed: map[string]bool{}}
			for _, a := range tc.allowed {
				g.allowed[a] = true
			}
			adm := NewAdmission()
			adm.SetAuthorizer(g)
			err := adm.AdmitSubresourceUpdate(ctx, kind, tc.sub, tc.obj, old, false)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("refused: %v (asked %v)", err, g.asked)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr || !apierrors.IsForbidden(err)):
				t.Errorf("got %v, want %s", err, tc.wantErr)
			}
		})
	}
}
