package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// tokenAuth accepts "Bearer good" and rejects any other bearer token.
type tokenAuth struct{}

func (tokenAuth) Authenticate(r *http.Request) (*auth.User, bool, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, false, nil
	}
	if h != "Bearer good" {
		return nil, false, errors.New("unknown token")
	}
	return &auth.User{Name: "alice", Groups: []string{"system:authenticated"}}, true, nil
}

// untouchable is a storage.API whose every method fails the test: the
// requests driven through it must be rejected before any object operation.
type untouchable struct {
	storage.API
	t *testing.T
}

func (u untouchable) Get(_ context.Context, k *registry.Kind, ns, name string) (runtime.Object, error) {
	u.t.Errorf("storage Get(%s, %s, %s) called", k.Resource, ns, name)
	return nil, errors.New("storage must not be reached")
}

var testKinds = []*registry.Kind{
	{GVK: corev1.SchemeGroupVersion.WithKind("ConfigMap"), Resource: "configmaps", Singular: "configmap", Namespaced: true},
	{GVK: corev1.SchemeGroupVersion.WithKind("Namespace"), Resource: "namespaces", Singular: "namespace", HasStatus: true},
	{GVK: corev1.SchemeGroupVersion.WithKind("Pod"), Resource: "pods", Singular: "pod", Namespaced: true, HasStatus: true},
	{GVK: appsv1.SchemeGroupVersion.WithKind("Deployment"), Resource: "deployments", Singular: "deployment", Namespaced: true, HasStatus: true,
		Scale: &registry.ScaleAccess{
			Get: func(obj runtime.Object) (int32, int32, string) {
				d := obj.(*appsv1.Deployment)
				return *d.Spec.Replicas, d.Status.Replicas, metav1.FormatLabelSelector(d.Spec.Selector)
			},
			Set: func(obj runtime.Object, n int32) { obj.(*appsv1.Deployment).Spec.Replicas = &n },
		}},
	{GVK: corev1.SchemeGroupVersion.WithKind("Event"), Resource: "events", Singular: "event", Namespaced: true, Verbs: []string{"get", "list", "watch"}},
}

func newUntouchable(t *testing.T) *httptest.Server {
	t.Helper()
	s, err := New(Config{
		Storage:       untouchable{t: t},
		Kinds:         testKinds,
		Authenticator: tokenAuth{},
		Version:       version.Info{Major: "1", Minor: "37", GitVersion: "v1.37.0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

type rawResult struct {
	code   int
	status metav1.Status
	body   string
	header http.Header
}

func do(t *testing.T, srv *httptest.Server, method, path, token, ctype string, body []byte, hdr map[string]string) rawResult {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	res := rawResult{code: resp.StatusCode, body: string(b), header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		_ = json.Unmarshal(b, &res.status)
	}
	return res
}

func TestRejectedBeforeStorage(t *testing.T) {
	srv := newUntouchable(t)
	cm := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}`)
	big := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"x":"` + strings.Repeat("x", 3<<20) + `"}}`)
	tests := []struct {
		name, method, path, token, ctype string
		body                             []byte
		hdr                              map[string]string
		code                             int
		reason                           metav1.StatusReason
		message                          string
	}{
		{name: "no credentials", method: "GET", path: "/api/v1/namespaces/default/configmaps", code: 403, reason: metav1.StatusReasonForbidden, message: `configmaps is forbidden: User "system:anonymous" cannot list resource "configmaps" in API group "" in the namespace "default"`},
		{name: "bad token", method: "GET", path: "/api/v1/pods", token: "bad", code: 401, reason: metav1.StatusReasonUnauthorized, message: "Unauthorized"},
		{name: "metrics need credentials", method: "GET", path: "/metrics", code: 403, reason: metav1.StatusReasonForbidden, message: `forbidden: User "system:anonymous" cannot get path "/metrics"`},
		{name: "unknown resource", method: "GET", path: "/api/v1/namespaces/default/widgets", token: "good", code: 404, reason: metav1.StatusReasonNotFound, message: "the server could not find the requested resource"},
		{name: "unknown group", method: "GET", path: "/apis/example.com/v1/widgets", token: "good", code: 404, reason: metav1.StatusReasonNotFound, message: "the server could not find the requested resource"},
		{name: "unknown subresource", method: "GET", path: "/api/v1/namespaces/default/configmaps/a/status", token: "good", code: 404, reason: metav1.StatusReasonNotFound, message: "the server could not find the requested resource"},
		{name: "namespaced kind without namespace", method: "GET", path: "/api/v1/configmaps/a", token: "good", code: 404, reason: metav1.StatusReasonNotFound, message: "the server could not find the requested resource"},
		{name: "verb not served", method: "POST", path: "/api/v1/namespaces/default/events", token: "good", ctype: "application/json", body: cm, code: 405, reason: metav1.StatusReasonMethodNotAllowed, message: `create is not supported on resources of kind "events"`},
		{name: "post to object", method: "POST", path: "/api/v1/namespaces/default/configmaps/a", token: "good", ctype: "application/json", body: cm, code: 405, reason: metav1.StatusReasonMethodNotAllowed, message: `create is not supported on resources of kind "configmaps"`},
		{name: "binding is create only", method: "GET", path: "/api/v1/namespaces/default/pods/a/binding", token: "good", code: 405, reason: metav1.StatusReasonMethodNotAllowed, message: `get is not supported on resources of kind "pods"`},
		{name: "unsupported body type", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "text/plain", body: cm, code: 415, reason: metav1.StatusReasonUnsupportedMediaType},
		{name: "unsupported patch type", method: "PATCH", path: "/api/v1/namespaces/default/configmaps/a", token: "good", ctype: "application/json", body: []byte(`{}`), code: 415, reason: metav1.StatusReasonUnsupportedMediaType},
		{name: "body too large", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "application/json", body: big, code: 413, reason: metav1.StatusReasonRequestEntityTooLarge, message: "Request entity too large: limit is 3145728"},
		{name: "malformed json", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":`), code: 400, reason: metav1.StatusReasonBadRequest},
		{name: "wrong apiVersion", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"a"}}`), code: 400, reason: metav1.StatusReasonBadRequest, message: `Deployment in version "v1" cannot be handled as a ConfigMap: converting (v1.Deployment) to (core.ConfigMap): unknown conversion`},
		{name: "wrong kind", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"a"}}`), code: 400, reason: metav1.StatusReasonBadRequest, message: `Secret in version "v1" cannot be handled as a ConfigMap: converting (v1.Secret) to (core.ConfigMap): unknown conversion`},
		{name: "pod posted to namespaces", method: "POST", path: "/api/v1/namespaces", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}`), code: 400, reason: metav1.StatusReasonBadRequest, message: `Pod in version "v1" cannot be handled as a Namespace: converting (v1.Pod) to (core.Namespace): unknown conversion`},
		{name: "older version of the kind", method: "POST", path: "/apis/apps/v1/namespaces/default/deployments", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"apps/v1beta1","kind":"Deployment","metadata":{"name":"a"}}`), code: 400, reason: metav1.StatusReasonBadRequest, message: "the API version in the data (apps/v1beta1) does not match the expected API version (apps/v1)"},
		{name: "pod posted to deployments", method: "POST", path: "/apis/apps/v1/namespaces/default/deployments", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}`), code: 400, reason: metav1.StatusReasonBadRequest, message: `Pod in version "v1" cannot be handled as a Deployment: converting (v1.Pod) to (apps.Deployment): unknown conversion`},
		{name: "yaml sent as json", method: "POST", path: "/api/v1/namespaces", token: "good", ctype: "application/json", body: []byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n"), code: 400, reason: metav1.StatusReasonBadRequest, message: `the object provided is unrecognized (must be of type Namespace): couldn't get version/kind; json parse error: invalid character 'a' looking for beginning of value (61706956657273696f6e3a2076310a6b696e643a204e616d657370616365 ...)`},
		{name: "empty body", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "application/json", code: 400, reason: metav1.StatusReasonBadRequest, message: `the object provided is unrecognized (must be of type ConfigMap): couldn't get version/kind; json parse error: unexpected end of JSON input (<empty>)`},
		{name: "field of the wrong type", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":1}}`), code: 400, reason: metav1.StatusReasonBadRequest, message: `ConfigMap in version "v1" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string`},
		{name: "unknown kind in the data", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"v1","kind":"Widget","metadata":{"name":"a"}}`), code: 400, reason: metav1.StatusReasonBadRequest},
		{name: "strict unknown field", method: "POST", path: "/api/v1/namespaces/default/configmaps?fieldValidation=Strict", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"spec":{"foo":1}}`), code: 400, reason: metav1.StatusReasonBadRequest, message: `ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: unknown field "spec"`},
		{name: "namespace mismatch", method: "POST", path: "/api/v1/namespaces/default/configmaps", token: "good", ctype: "application/json", body: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"other"}}`), code: 400, reason: metav1.StatusReasonBadRequest, message: "the namespace of the provided object does not match the namespace sent on the request"},
		{name: "unknown dryRun", method: "POST", path: "/api/v1/namespaces/default/configmaps?dryRun=Some", token: "good", ctype: "application/json", body: cm, code: 422, reason: metav1.StatusReasonInvalid},
		{name: "sendInitialEvents", method: "GET", path: "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true", token: "good", code: 422, reason: metav1.StatusReasonInvalid},
		{name: "bad label selector", method: "GET", path: "/api/v1/namespaces/default/configmaps?labelSelector=a%3D%3D%3Db", token: "good", code: 400, reason: metav1.StatusReasonBadRequest},
		{name: "bad field selector", method: "GET", path: "/api/v1/pods?fieldSelector=spec.nodeName", token: "good", code: 400, reason: metav1.StatusReasonBadRequest},
		{name: "nothing acceptable", method: "GET", path: "/api/v1/namespaces/default/configmaps/a", token: "good", hdr: map[string]string{"Accept": "text/html"}, code: 406, reason: metav1.StatusReasonNotAcceptable},
		{name: "apply without manager", method: "PATCH", path: "/apis/apps/v1/namespaces/default/deployments/a", token: "good", ctype: "application/apply-patch+yaml", body: []byte("apiVersion: apps/v1\nkind: Deployment\n"), code: 422, reason: metav1.StatusReasonInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := do(t, srv, tc.method, tc.path, tc.token, tc.ctype, tc.body, tc.hdr)
			if got.code != tc.code || got.status.Reason != tc.reason || int(got.status.Code) != tc.code || got.status.Kind != "Status" {
				t.Fatalf("got %d %q, want %d %q; body %s", got.code, got.status.Reason, tc.code, tc.reason, got.body)
			}
			if tc.message != "" && got.status.Message != tc.message {
				t.Errorf("message %q, want %q", got.status.Message, tc.message)
			}
			if !strings.Contains(got.body, `"details":{`) {
				t.Errorf("status without details: %s", got.body)
			}
		})
	}
}

func TestPublicEndpoints(t *testing.T) {
	srv := newUntouchable(t)
	tests := []struct {
		path, token string
		code        int
		body        string
	}{
		{path: "/healthz", code: 200, body: "ok"},
		{path: "/livez", code: 200, body: "ok"},
		{path: "/readyz?verbose", code: 200, body: "[+]ping ok\nreadyz check passed\n"},
		{path: "/readyz/ping", code: 200, body: "ok"},
		{path: "/version", code: 200, body: "{\"major\":\"1\",\"minor\":\"37\",\"emulationMajor\":\"\",\"emulationMinor\":\"\",\"minCompatibilityMajor\":\"\",\"minCompatibilityMinor\":\"\",\"gitVersion\":\"v1.37.0\",\"gitCommit\":\"\",\"gitTreeState\":\"\",\"buildDate\":\"\",\"goVersion\":\"\",\"compiler\":\"\",\"platform\":\"\"}\n"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			got := do(t, srv, "GET", tc.path, tc.token, "", nil, nil)
			if got.code != tc.code {
				t.Fatalf("code %d, want %d: %s", got.code, tc.code, got.body)
			}
			if diff := cmp.Diff(tc.body, got.body); diff != "" && !strings.HasPrefix(tc.path, "/version") {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
	got := do(t, srv, "GET", "/metrics", "good", "", nil, nil)
	if got.code != 200 || !strings.Contains(got.body, `apiserver_request_total{code="200",resource="",verb="get"}`) {
		t.Errorf("metrics: %d\n%s", got.code, got.body)
	}
}

func TestProfiling(t *testing.T) {
	off := newUntouchable(t)
	if got := do(t, off, "GET", "/debug/pprof/", "good", "", nil, nil); got.code != http.StatusNotFound {
		t.Errorf("profiles without Profiling: %d, want 404", got.code)
	}
	s, err := New(Config{Storage: untouchable{t: t}, Kinds: testKinds, Authenticator: tokenAuth{}, Profiling: true})
	if err != nil {
		t.Fatal(err)
	}
	on := httptest.NewServer(s.Handler())
	t.Cleanup(on.Close)
	if got := do(t, on, "GET", "/debug/pprof/heap", "", "", nil, nil); got.code != http.StatusForbidden {
		t.Errorf("heap profile without credentials: %d, want 403", got.code)
	}
	if got := do(t, on, "GET", "/debug/pprof/", "good", "", nil, nil); got.code != 200 || !strings.Contains(got.body, "goroutine") {
		t.Errorf("profile index: %d\n%s", got.code, got.body)
	}
	if got := do(t, on, "GET", "/debug/pprof/goroutine?debug=1", "good", "", nil, nil); got.code != 200 || !strings.Contains(got.body, "goroutine profile:") {
		t.Errorf("goroutine profile: %d\n%.200s", got.code, got.body)
	}
}
