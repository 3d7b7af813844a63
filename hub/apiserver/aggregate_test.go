package apiserver

import (
	"net/http"
	"net/http/httptest"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"

	"github.com/tether-edge/tether/hub/auth"
)

// oneGroup proxies echo.example.com/v1 and nothing else.
type oneGroup struct{ h http.Handler }

func (o oneGroup) ProxyFor(group, version string) http.Handler {
	if group == "echo.example.com" && version == "v1" {
		return o.h
	}
	return nil
}

// recordAttrs denies echoes named "secret" and records what it saw.
type recordAttrs struct{ seen *[]Attributes }

func (r recordAttrs) Authorize(_ *auth.User, a Attributes) error {
	*r.seen = append(*r.seen, a)
	if a.Name == "secret" {
		return apierrors.NewForbidden(schema.GroupResource{Group: a.Group, Resource: a.Kind}, a.Name, nil)
	}
	return nil
}

// TestAggregatedRoutesAfterAuthorization: requests of an aggregated
// group/version are authorized with upstream's attributes and then handed
// to the aggregator with the user in their context; other group/versions
// are the hub's own.
func TestAggregatedRoutesAfterAuthorization(t *testing.T) {
	var seen []Attributes
	var proxied []string
	s, err := New(Config{
		Storage: untouchable{t: t}, Kinds: testKinds, Authenticator: tokenAuth{}, Authorizer: recordAttrs{&seen},
		Version: version.Info{Major: "1", Minor: "37"},
		Aggregated: oneGroup{http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, _ := auth.UserFrom(r.Context())
			proxied = append(proxied, u.Name+" "+r.URL.Path)
			w.WriteHeader(http.StatusTeapot)
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	r := do(t, srv, http.MethodGet, "/apis/echo.example.com/v1/namespaces/ns1/echoes/x", "good", "", nil, nil)
	if r.code != http.StatusTeapot || len(proxied) != 1 || proxied[0] != "alice /apis/echo.example.com/v1/namespaces/ns1/echoes/x" {
		t.Fatalf("proxied %v, code %d", proxied, r.code)
	}
	a := seen[len(seen)-1]
	if a.Verb != "get" || !a.Resource || a.Group != "echo.example.com" || a.Version != "v1" || a.Kind != "echoes" || a.Namespace != "ns1" || a.Name != "x" {
		t.Fatalf("attributes %+v", a)
	}
	r = do(t, srv, http.MethodGet, "/apis/echo.example.com/v1/echoes?watch=true", "good", "", nil, nil)
	if a := seen[len(seen)-1]; r.code != http.StatusTeapot || a.Verb != "watch" || a.Namespace != "" {
		t.Fatalf("watch: %d %+v", r.code, a)
	}
	r = do(t, srv, http.MethodGet, "/apis/echo.example.com/v1/namespaces/ns1/echoes/secret", "good", "", nil, nil)
	if r.code != http.StatusForbidden || len(proxied) != 2 {
		t.Fatalf("denied request: %d, proxied %v", r.code, proxied)
	}
	r = do(t, srv, http.MethodGet, "/apis/other.example.com/v1/things", "good", "", nil, nil)
	if r.code != http.StatusNotFound || len(proxied) != 2 {
		t.Fatalf("unregistered group/version: %d, proxied %v", r.code, proxied)
	}
}
