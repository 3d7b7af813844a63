package apiserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/auth"
)

// usersAuth maps bearer tokens to users: "admin" (system:masters),
// "alice", "nobody", "broken"; any other bearer token is invalid.
type usersAuth struct{}

func (usersAuth) Authenticate(r *http.Request) (*auth.User, bool, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return nil, false, nil
	}
	switch tok {
	case "admin":
		return &auth.User{Name: "admin", Groups: []string{"system:masters", auth.GroupAuthenticated}}, true, nil
	case "alice", "nobody", "broken":
		return &auth.User{Name: tok, UID: tok + "-uid", Groups: []string{auth.GroupAuthenticated}}, true, nil
	}
	return nil, false, errors.New("unknown token")
}

// policyAuthz is a small fixed policy standing in for RBAC, recording
// what it was asked: system:masters may do everything; alice may read
// pods in namespace y, impersonate user bob, group devs, service account
// y/robot, any UID and the extra "scopes", and create the reviews;
// "nobody" may do nothing; "broken" gets an evaluation error; anyone may
// read /healthz and create a SelfSubjectReview; other denials say why
// when the request is a delete.
type policyAuthz struct {
	mu   sync.Mutex
	seen []string
}

func (p *policyAuthz) record(u *auth.User, a Attributes) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, u.Name+"["+strings.Join(u.Groups, ",")+"] "+a.Verb+" "+a.Group+"/"+a.Kind+"/"+a.Subresource+" "+a.Namespace+"/"+a.Name+" "+a.Path)
}

func (p *policyAuthz) saw(want string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.seen, want)
}

func (p *policyAuthz) Authorize(u *auth.User, a Attributes) error {
	p.record(u, a)
	if u.InGroup("system:masters") {
		return nil
	}
	if !a.Resource && a.Path == "/healthz" || a.Resource && a.Kind == "selfsubjectreviews" {
		return nil
	}
	switch u.Name {
	case "broken":
		return errors.New("policy store unavailable")
	case "alice":
		switch {
		case a.Resource && (a.Group == "authorization.k8s.io" || a.Group == "authentication.k8s.io") && a.Verb == "create" && strings.HasSuffix(a.Kind, "reviews"):
			return nil
		case a.Kind == "pods" && a.Namespace == "y" && (a.Verb == "get" || a.Verb == "list"):
			return nil
		case a.Verb == "impersonate" && (a.Kind == "users" && a.Name == "bob" || a.Kind == "groups" && a.Name == "devs" ||
			a.Kind == "serviceaccounts" && a.Namespace == "y" && a.Name == "robot" ||
			a.Group == "authentication.k8s.io" && (a.Kind == "uids" || a.Kind == "userextras" && a.Subresource == "scopes")):
			return nil
		}
	}
	if a.Verb == "delete" {
		return Forbidden(u, a, "deletes are frozen")
	}
	return Forbidden(u, a, "")
}

func (p *policyAuthz) RulesFor(u *auth.User, ns string) authorizationv1.SubjectRulesReviewStatus {
	if u.Name == "alice" && ns == "y" {
		return authorizationv1.SubjectRulesReviewStatus{ResourceRules: []authorizationv1.ResourceRule{
			{Verbs: []string{"get", "list"}, APIGroups: []string{""}, Resources: []string{"pods"}}}}
	}
	return authorizationv1.SubjectRulesReviewStatus{}
}

// selectorAuthz allows everything and keeps the selectors of the last
// list it was asked about.
type selectorAuthz struct {
	mu           sync.Mutex
	label, field string
}

func (s *selectorAuthz) Authorize(_ *auth.User, a Attributes) error {
	if a.Verb == "list" {
		s.mu.Lock()
		s.label, s.field = a.LabelSelector, a.FieldSelector
		s.mu.Unlock()
	}
	return nil
}

func (s *selectorAuthz) last() (string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.label, s.field
}

// plainAuthz allows everything and lists no rules.
type plainAuthz struct{}

func (plainAuthz) Authorize(*auth.User, Attributes) error { return nil }

func newPolicyServer(t *testing.T, authz Authorizer, ext map[string]http.Handler) *httptest.Server {
	t.Helper()
	s, err := New(Config{Storage: untouchable{t: t}, Kinds: testKinds, Authenticator: usersAuth{}, Authorizer: authz, Extensions: ext})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// TestAnonymousRequestsAreAuthorized shows that requests without
// credentials are system:anonymous in system:unauthenticated and that the
// Authorizer decides on them, health paths included; that invalid
// credentials stay 401; and that the hub's extensions are still reached
// without a user.
func TestAnonymousRequestsAreAuthorized(t *testing.T) {
	p := &policyAuthz{}
	var extUser *auth.User
	ext := map[string]http.Handler{"/tether/join": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		extUser, _ = auth.UserFrom(r.Context())
		w.WriteHeader(http.StatusTeapot)
	})}
	srv := newPolicyServer(t, p, ext)

	if got := do(t, srv, "GET", "/healthz", "", "", nil, nil); got.code != 200 || got.body != "ok" {
		t.Errorf("anonymous /healthz: %d %s", got.code, got.body)
	}
	if !p.saw("system:anonymous[system:unauthenticated] get // / /healthz") {
		t.Errorf("the authorizer was not asked about anonymous /healthz: %q", p.seen)
	}
	for path, msg := range map[string]string{
		"/":                         `forbidden: User "system:anonymous" cannot get path "/"`,
		"/version":                  `forbidden: User "system:anonymous" cannot get path "/version"`,
		"/readyz":                   `forbidden: User "system:anonymous" cannot get path "/readyz"`,
		"/api/v1/namespaces/y/pods": `pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" in the namespace "y"`,
	} {
		got := do(t, srv, "GET", path, "", "", nil, nil)
		if got.code != 403 || got.status.Reason != metav1.StatusReasonForbidden || got.status.Message != msg {
			t.Errorf("anonymous %s: %d %q, want 403 %q", path, got.code, got.status.Message, msg)
		}
	}
	if got := do(t, srv, "GET", "/healthz", "stolen", "", nil, nil); got.code != 401 || got.status.Message != "Unauthorized" {
		t.Errorf("invalid token: %d %s, want 401", got.code, got.body)
	}
	if got := do(t, srv, "POST", "/tether/join", "", "", nil, nil); got.code != http.StatusTeapot || extUser != nil {
		t.Errorf("extension: %d, user %v; want it reached without a user", got.code, extUser)
	}

	// Without an Authorizer, anonymous users read only the public
	// information; authenticated users may do everything.
	s, err := New(Config{Storage: untouchable{t: t}, Kinds: testKinds, Authenticator: usersAuth{}})
	if err != nil {
		t.Fatal(err)
	}
	def := httptest.NewServer(s.Handler())
	t.Cleanup(def.Close)
	for _, path := range []string{"/healthz", "/livez", "/readyz/ping", "/version"} {
		if got := do(t, def, "GET", path, "", "", nil, nil); got.code != 200 {
			t.Errorf("default authorizer, anonymous %s: %d %s", path, got.code, got.body)
		}
	}
	if got := do(t, def, "GET", "/metrics", "", "", nil, nil); got.code != 403 || got.status.Message != `forbidden: User "system:anonymous" cannot get path "/metrics"` {
		t.Errorf("default authorizer, anonymous /metrics: %d %s", got.code, got.body)
	}
	if got := do(t, def, "GET", "/metrics", "nobody", "", nil, nil); got.code != 200 {
		t.Errorf("default authorizer, authenticated /metrics: %d", got.code)
	}

	// A bearer token no authenticator claims is invalid, not absent.
	s, err = New(Config{Storage: untouchable{t: t}, Kinds: testKinds, Authenticator: auth.Union{}})
	if err != nil {
		t.Fatal(err)
	}
	none := httptest.NewServer(s.Handler())
	t.Cleanup(none.Close)
	if got := do(t, none, "GET", "/healthz", "unclaimed", "", nil, nil); got.code != 401 {
		t.Errorf("unclaimed bearer token: %d %s, want 401", got.code, got.body)
	}
	if got := do(t, none, "GET", "/healthz", "", "", nil, nil); got.code != 200 {
		t.Errorf("no credentials: %d %s, want 200", got.code, got.body)
	}
}

// whoami posts a SelfSubjectReview with the given headers.
func whoami(t *testing.T, srv *httptest.Server, token string, hdr http.Header) (rawResult, authenticationv1.UserInfo) {
	t.Helper()
	req, err := http.NewRequest("POST", srv.URL+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = hdr.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	res := rawResult{code: resp.StatusCode, body: string(b)}
	_ = json.Unmarshal([]byte(res.body), &res.status)
	var ssr authenticationv1.SelfSubjectReview
	if resp.StatusCode == http.StatusCreated {
		if err := json.Unmarshal([]byte(res.body), &ssr); err != nil {
			t.Fatal(err)
		}
	}
	return res, ssr.Status.UserInfo
}

// TestImpersonation drives the Impersonate-* headers: each thing asked
// for is authorized with the impersonate verb on users, groups,
// serviceaccounts, uids or userextras/<key>; the request then runs as
// the impersonated identity, with the groups upstream adds.
func TestImpersonation(t *testing.T) {
	p := &policyAuthz{}
	srv := newPolicyServer(t, p, nil)
	tests := []struct {
		name  string
		token string
		hdr   http.Header
		code  int
		want  authenticationv1.UserInfo
		msg   string
		asked []string
	}{
		{name: "none", token: "alice", code: 201,
			want: authenticationv1.UserInfo{Username: "alice", UID: "alice-uid", Groups: []string{"system:authenticated"}}},
		{name: "user", token: "alice", hdr: http.Header{"Impersonate-User": {"bob"}}, code: 201,
			want:  authenticationv1.UserInfo{Username: "bob", Groups: []string{"system:authenticated"}},
			asked: []string{"alice[system:authenticated] impersonate /users/ /bob ", "bob[system:authenticated] create authentication.k8s.io/selfsubjectreviews/ / /apis/authentication.k8s.io/v1/selfsubjectreviews"}},
		{name: "user and group", token: "alice", hdr: http.Header{"Impersonate-User": {"bob"}, "Impersonate-Group": {"devs"}}, code: 201,
			want:  authenticationv1.UserInfo{Username: "bob", Groups: []string{"devs", "system:authenticated"}},
			asked: []string{"alice[system:authenticated] impersonate /groups/ /devs "}},
		{name: "group system:authenticated is not repeated", token: "admin", hdr: http.Header{"Impersonate-User": {"bob"}, "Impersonate-Group": {"devs", "system:authenticated"}}, code: 201,
			want: authenticationv1.UserInfo{Username: "bob", Groups: []string{"devs", "system:authenticated"}}},
		{name: "service account", token: "alice", hdr: http.Header{"Impersonate-User": {"system:serviceaccount:y:robot"}}, code: 201,
			want:  authenticationv1.UserInfo{Username: "system:serviceaccount:y:robot", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:y", "system:authenticated"}},
			asked: []string{"alice[system:authenticated] impersonate /serviceaccounts/ y/robot "}},
		{name: "uid and extra", token: "alice", hdr: http.Header{"Impersonate-User": {"bob"}, "Impersonate-Uid": {"u-1"}, "Impersonate-Extra-Scopes": {"a", "b"}}, code: 201,
			want: authenticationv1.UserInfo{Username: "bob", UID: "u-1", Groups: []string{"system:authenticated"},
				Extra: map[string]authenticationv1.ExtraValue{"scopes": {"a", "b"}}},
			asked: []string{"alice[system:authenticated] impersonate authentication.k8s.io/uids/ /u-1 ",
				"alice[system:authenticated] impersonate authentication.k8s.io/userextras/scopes /a ",
				"alice[system:authenticated] impersonate authentication.k8s.io/userextras/scopes /b "}},
		{name: "anonymous", token: "admin", hdr: http.Header{"Impersonate-User": {"system:anonymous"}}, code: 201,
			want: authenticationv1.UserInfo{Username: "system:anonymous", Groups: []string{"system:unauthenticated"}}},
		{name: "user denied", token: "alice", hdr: http.Header{"Impersonate-User": {"carol"}}, code: 403,
			msg: `users "carol" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope`},
		{name: "group denied", token: "alice", hdr: http.Header{"Impersonate-User": {"bob"}, "Impersonate-Group": {"system:masters"}}, code: 403,
			msg: `groups "system:masters" is forbidden: User "alice" cannot impersonate resource "groups" in API group "" at the cluster scope`},
		{name: "service account denied", token: "alice", hdr: http.Header{"Impersonate-User": {"system:serviceaccount:kube-system:default"}}, code: 403,
			msg: `serviceaccounts "default" is forbidden: User "alice" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "kube-system"`},
		{name: "extra denied", token: "alice", hdr: http.Header{"Impersonate-User": {"bob"}, "Impersonate-Extra-Reason": {"x"}}, code: 403,
			msg: `userextras.authentication.k8s.io "x" is forbidden: User "alice" cannot impersonate resource "userextras/reason" in API group "authentication.k8s.io" at the cluster scope`},
		{name: "anonymous may not impersonate", hdr: http.Header{"Impersonate-User": {"bob"}}, code: 403,
			msg: `users "bob" is forbidden: User "system:anonymous" cannot impersonate resource "users" in API group "" at the cluster scope`},
		{name: "group without user", token: "admin", hdr: http.Header{"Impersonate-Group": {"devs"}}, code: 400,
			msg: "requested [{Group  devs    }] without impersonating a user"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ui := whoami(t, srv, tc.token, tc.hdr)
			if got.code != tc.code {
				t.Fatalf("code %d, want %d: %s", got.code, tc.code, got.body)
			}
			if tc.msg != "" && got.status.Message != tc.msg {
				t.Errorf("message %q\n        want %q", got.status.Message, tc.msg)
			}
			if tc.code == 201 {
				if diff := cmp.Diff(tc.want, ui); diff != "" {
					t.Errorf("user (-want +got):\n%s", diff)
				}
			}
			for _, a := range tc.asked {
				if !p.saw(a) {
					t.Errorf("authorizer not asked %q; asked %q", a, p.seen)
				}
			}
		})
	}
}

// review posts body to path as token and decodes the answer into out.
func review(t *testing.T, srv *httptest.Server, token, path, body string, out any) rawResult {
	t.Helper()
	got := do(t, srv, "POST", path, token, "application/json", []byte(body), nil)
	if got.code == http.StatusCreated && out != nil {
		if err := json.Unmarshal([]byte(got.body), out); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

const (
	ssarPath = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
	sarPath  = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
	ssrrPath = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
)

// TestAccessReviews asks the authorizer through SelfSubjectAccessReview,
// SubjectAccessReview and LocalSubjectAccessReview and lists rules
// through SelfSubjectRulesReview; the reviews are validated as upstream
// validates them, their creation is itself authorized, and nothing is
// stored (the storage fails the test when touched).
func TestAccessReviews(t *testing.T) {
	p := &policyAuthz{}
	srv := newPolicyServer(t, p, nil)
	ssar := func(ra string) string {
		return `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{"resourceAttributes":` + ra + `}}`
	}
	status := func(t *testing.T, token, path, body string) authorizationv1.SubjectAccessReviewStatus {
		t.Helper()
		var out struct {
			Status authorizationv1.SubjectAccessReviewStatus `json:"status"`
		}
		if got := review(t, srv, token, path, body, &out); got.code != 201 {
			t.Fatalf("%s: %d %s", path, got.code, got.body)
		}
		return out.Status
	}
	for _, tc := range []struct {
		name, token, path, body string
		want                    authorizationv1.SubjectAccessReviewStatus
	}{
		{"ssar allowed", "alice", ssarPath, ssar(`{"verb":"list","resource":"pods","namespace":"y"}`), authorizationv1.SubjectAccessReviewStatus{Allowed: true}},
		{"ssar denied", "alice", ssarPath, ssar(`{"verb":"create","resource":"pods","namespace":"y"}`), authorizationv1.SubjectAccessReviewStatus{}},
		{"ssar denied with a reason", "alice", ssarPath, ssar(`{"verb":"delete","resource":"pods","namespace":"y","name":"a"}`), authorizationv1.SubjectAccessReviewStatus{Reason: "deletes are frozen"}},
		{"ssar non-resource", "alice", ssarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{"nonResourceAttributes":{"verb":"get","path":"/healthz"}}}`, authorizationv1.SubjectAccessReviewStatus{Allowed: true}},
		{"ssar impersonated", "admin", ssarPath, ssar(`{"verb":"list","resource":"pods","namespace":"y"}`), authorizationv1.SubjectAccessReviewStatus{Allowed: true}},
		{"sar for alice", "admin", sarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"alice","resourceAttributes":{"verb":"get","resource":"pods","namespace":"y"}}}`, authorizationv1.SubjectAccessReviewStatus{Allowed: true}},
		{"sar for alice elsewhere", "admin", sarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"alice","resourceAttributes":{"verb":"get","resource":"pods","namespace":"z"}}}`, authorizationv1.SubjectAccessReviewStatus{}},
		{"sar for a group", "admin", sarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"groups":["system:masters"],"resourceAttributes":{"verb":"delete","resource":"nodes"}}}`, authorizationv1.SubjectAccessReviewStatus{Allowed: true}},
		{"sar evaluation error", "admin", sarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"broken","resourceAttributes":{"verb":"get","resource":"pods"}}}`, authorizationv1.SubjectAccessReviewStatus{EvaluationError: "policy store unavailable"}},
		{"lsar", "admin", "/apis/authorization.k8s.io/v1/namespaces/y/localsubjectaccessreviews", `{"apiVersion":"authorization.k8s.io/v1","kind":"LocalSubjectAccessReview","spec":{"user":"alice","resourceAttributes":{"verb":"list","resource":"pods","namespace":"y"}}}`, authorizationv1.SubjectAccessReviewStatus{Allowed: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status(t, tc.token, tc.path, tc.body); got != tc.want {
				t.Errorf("status %+v, want %+v", got, tc.want)
			}
		})
	}
	if !p.saw("alice[system:authenticated] list /pods/ y/ ") {
		t.Errorf("the authorizer was not asked about alice's list: %q", p.seen)
	}

	// Selectors reach the authorizer as selector strings.
	sel := &selectorAuthz{}
	ssrv := newPolicyServer(t, sel, nil)
	if got := review(t, ssrv, "alice", ssarPath, ssar(`{"verb":"list","resource":"pods","labelSelector":{"requirements":[{"key":"app","operator":"In","values":["web","db"]}]},"fieldSelector":{"requirements":[{"key":"spec.nodeName","operator":"In","values":["n1"]}]}}`), nil); got.code != 201 {
		t.Fatalf("ssar with selectors: %d %s", got.code, got.body)
	}
	if l, f := sel.last(); l != "app in (db,web)" || f != "spec.nodeName=n1" {
		t.Errorf("selectors %q, %q", l, f)
	}
	if got := review(t, ssrv, "alice", ssarPath, ssar(`{"verb":"list","resource":"pods","labelSelector":{"rawSelector":"tier=front"},"fieldSelector":{"rawSelector":"spec.nodeName!=n2"}}`), nil); got.code != 201 {
		t.Fatalf("ssar with raw selectors: %d %s", got.code, got.body)
	}
	if l, f := sel.last(); l != "tier=front" || f != "spec.nodeName!=n2" {
		t.Errorf("raw selectors %q, %q", l, f)
	}

	// Invalid reviews are 422 with upstream's causes; a denied create of
	// a review is 403; reviews answer create only.
	for _, tc := range []struct {
		name, token, method, path, body string
		code                            int
		msg                             string
	}{
		{"ssar without attributes", "alice", "POST", ssarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{}}`, 422,
			`SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: Invalid value: null: exactly one of nonResourceAttributes or resourceAttributes must be specified`},
		{"ssar with both attributes", "alice", "POST", ssarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{"resourceAttributes":{"verb":"get"},"nonResourceAttributes":{"verb":"get","path":"/"}}}`, 422,
			`SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.nonResourceAttributes: Invalid value: {"path":"/","verb":"get"}: cannot be specified in combination with resourceAttributes`},
		{"ssar with a name", "alice", "POST", ssarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","metadata":{"name":"x"},"spec":{"resourceAttributes":{"verb":"get"}}}`, 422, ""},
		{"sar without subject", "admin", "POST", sarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"resourceAttributes":{"verb":"get"}}}`, 422,
			`SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: Invalid value: "": at least one of user or group must be specified`},
		{"lsar namespace mismatch", "admin", "POST", "/apis/authorization.k8s.io/v1/namespaces/y/localsubjectaccessreviews", `{"apiVersion":"authorization.k8s.io/v1","kind":"LocalSubjectAccessReview","spec":{"user":"alice","resourceAttributes":{"verb":"get","namespace":"z"}}}`, 422,
			`LocalSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes.namespace: Invalid value: "z": must match metadata.namespace`},
		{"lsar non-resource", "admin", "POST", "/apis/authorization.k8s.io/v1/namespaces/y/localsubjectaccessreviews", `{"apiVersion":"authorization.k8s.io/v1","kind":"LocalSubjectAccessReview","spec":{"user":"alice","nonResourceAttributes":{"verb":"get","path":"/"}}}`, 422, ""},
		{"lsar body in another namespace", "admin", "POST", "/apis/authorization.k8s.io/v1/namespaces/y/localsubjectaccessreviews", `{"apiVersion":"authorization.k8s.io/v1","kind":"LocalSubjectAccessReview","metadata":{"namespace":"z"},"spec":{"user":"alice","resourceAttributes":{"verb":"get","namespace":"z"}}}`, 400,
			"the namespace of the provided object does not match the namespace sent on the request"},
		{"ssrr without namespace", "alice", "POST", ssrrPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectRulesReview","spec":{}}`, 400, "no namespace on request"},
		{"review creation is authorized", "nobody", "POST", ssarPath, ssar(`{"verb":"get"}`), 403,
			`selfsubjectaccessreviews.authorization.k8s.io is forbidden: User "nobody" cannot create resource "selfsubjectaccessreviews" in API group "authorization.k8s.io" at the cluster scope`},
		{"alice may not ask about others", "alice", "POST", sarPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"bob","resourceAttributes":{"verb":"get"}}}`, 201, ""},
		{"get is not served", "admin", "GET", ssarPath, "", 405, ""},
		{"named create is not served", "admin", "POST", ssarPath + "/x", ssar(`{"verb":"get"}`), 405, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := do(t, srv, tc.method, tc.path, tc.token, "application/json", []byte(tc.body), nil)
			if got.code != tc.code {
				t.Fatalf("code %d, want %d: %s", got.code, tc.code, got.body)
			}
			if tc.msg != "" && got.status.Message != tc.msg {
				t.Errorf("message %q\n        want %q", got.status.Message, tc.msg)
			}
			if tc.code == 422 && (got.status.Details == nil || len(got.status.Details.Causes) == 0) {
				t.Errorf("422 without causes: %s", got.body)
			}
		})
	}

	// Rules come from the authorizer's RuleLister; without one the
	// review says it is incomplete.
	var srr authorizationv1.SelfSubjectRulesReview
	if got := review(t, srv, "alice", ssrrPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectRulesReview","spec":{"namespace":"y"}}`, &srr); got.code != 201 {
		t.Fatalf("ssrr: %d %s", got.code, got.body)
	}
	want := authorizationv1.SubjectRulesReviewStatus{ResourceRules: []authorizationv1.ResourceRule{{Verbs: []string{"get", "list"}, APIGroups: []string{""}, Resources: []string{"pods"}}},
		NonResourceRules: []authorizationv1.NonResourceRule{}}
	if diff := cmp.Diff(want, srr.Status); diff != "" {
		t.Errorf("ssrr status (-want +got):\n%s", diff)
	}
	plain := newPolicyServer(t, plainAuthz{}, nil)
	srr = authorizationv1.SelfSubjectRulesReview{}
	if got := review(t, plain, "alice", ssrrPath, `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectRulesReview","spec":{"namespace":"y"}}`, &srr); got.code != 201 || !srr.Status.Incomplete {
		t.Errorf("ssrr without a RuleLister: %d %s", got.code, got.body)
	}
}

// TestTokenReview checks bearer tokens with the hub's authenticator:
// service account tokens for their audiences, static tokens for the API's
// audiences only, invalid tokens with the authenticator's error.
func TestTokenReview(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sat := auth.NewServiceAccountTokens(key, nil)
	s, err := New(Config{Storage: untouchable{t: t}, Kinds: testKinds, Authenticator: auth.Union{sat, usersAuth{}},
		Authorizer: &policyAuthz{}, ServiceAccountTokens: sat})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	issue := func(auds ...string) string {
		now := time.Now()
		tok, err := sat.Issue(auth.Claims{Namespace: "y", ServiceAccount: "robot", ServiceAccountUID: "sa-uid", Audiences: auds, IssuedAt: now, Expiry: now.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	apiTok, vaultTok := issue(auth.DefaultIssuer), issue("vault", "other")
	robot := authenticationv1.UserInfo{Username: "system:serviceaccount:y:robot", UID: "sa-uid",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:y", "system:authenticated"}}
	body := func(tok string, auds ...string) string {
		b, _ := json.Marshal(authenticationv1.TokenReview{TypeMeta: metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenReview"},
			Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: auds}})
		return string(b)
	}
	for _, tc := range []struct {
		name, body string
		want       authenticationv1.TokenReviewStatus
		wantErr    bool
	}{
		{name: "service account token", body: body(apiTok), want: authenticationv1.TokenReviewStatus{Authenticated: true, User: robot, Audiences: []string{auth.DefaultIssuer}}},
		{name: "service account token for its audience", body: body(vaultTok, "vault"), want: authenticationv1.TokenReviewStatus{Authenticated: true, User: robot, Audiences: []string{"vault"}}},
		{name: "service account token for another audience", body: body(vaultTok), wantErr: true},
		{name: "static token", body: body("alice"), want: authenticationv1.TokenReviewStatus{Authenticated: true,
			User: authenticationv1.UserInfo{Username: "alice", UID: "alice-uid", Groups: []string{"system:authenticated"}}, Audiences: []string{auth.DefaultIssuer}}},
		{name: "static token for another audience", body: body("alice", "vault")},
		{name: "invalid token", body: body("stolen"), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tr authenticationv1.TokenReview
			got := review(t, srv, "admin", "/apis/authentication.k8s.io/v1/tokenreviews", tc.body, &tr)
			if got.code != 201 {
				t.Fatalf("%d %s", got.code, got.body)
			}
			if tc.wantErr != (tr.Status.Error != "") {
				t.Errorf("error %q, want one: %v", tr.Status.Error, tc.wantErr)
			}
			tr.Status.Error = ""
			if diff := cmp.Diff(tc.want, tr.Status); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
		})
	}
	if got := review(t, srv, "admin", "/apis/authentication.k8s.io/v1/tokenreviews", body(""), nil); got.code != 400 || got.status.Message != "token is required for TokenReview in authentication" {
		t.Errorf("empty token: %d %s", got.code, got.body)
	}
}
