package nodes

import (
	"context"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
)

// grants allows what its function says, as RBAC with some bindings would.
type grants func(u *auth.User, at apiserver.Attributes) bool

func (g grants) Authorize(u *auth.User, at apiserver.Attributes) error {
	if g(u, at) {
		return nil
	}
	return errors.New("denied by the next authorizer")
}

// TestNodeAuthorizerAsksNext: what the node rules do not allow goes to the
// next authorizer, as in upstream's Node,RBAC chain: a node reviews itself
// (system:basic-user) and gets what a role bound to it grants; what both
// deny is 403 with the node rules' reason, and nothing the node rules deny
// is allowed when there is no next authorizer.
func TestNodeAuthorizerAsksNext(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := NewAuthorizer(Config{Storage: st, Logger: quiet})
	go a.Run(ctx)
	n1 := nodeUser("n1")
	review := apiserver.Attributes{Verb: "create", Resource: true, Group: "authentication.k8s.io", Version: "v1", Kind: "selfsubjectreviews"}
	ingresses := apiserver.Attributes{Verb: "list", Resource: true, Group: "networking.k8s.io", Version: "v1", Kind: "ingresses"}
	secret := apiserver.Attributes{Verb: "get", Resource: true, Version: "v1", Kind: "secrets", Namespace: "shop", Name: "other"}
	metrics := apiserver.Attributes{Verb: "get", Path: "/metrics"}

	for _, at := range []apiserver.Attributes{review, ingresses, secret, metrics} {
		if err := a.Authorize(n1, at); !apierrors.IsForbidden(err) {
			t.Errorf("without a next authorizer, %s %s%s = %v, want 403", at.Verb, at.Kind, at.Path, err)
		}
	}

	a.Next = grants(func(u *auth.User, at apiserver.Attributes) bool {
		switch {
		case at.Kind == "selfsubjectreviews" && u.InGroup(auth.GroupAuthenticated):
			return true
		case at.Kind == "ingresses" && u.InGroup("system:nodes"):
			return true
		}
		return false
	})
	for _, at := range []apiserver.Attributes{review, ingresses} {
		if err := a.Authorize(n1, at); err != nil {
			t.Errorf("%s %s with the next authorizer's grant: %v", at.Verb, at.Kind, err)
		}
	}
	err := a.Authorize(n1, secret)
	if !apierrors.IsForbidden(err) || !strings.HasSuffix(err.Error(), "no relationship found between node 'n1' and this object") {
		t.Errorf("get a secret no pod of n1 uses = %v, want 403 with the node rules' reason", err)
	}
	if err := a.Authorize(n1, metrics); !apierrors.IsForbidden(err) {
		t.Errorf("get /metrics = %v, want 403", err)
	}
}
