package hub_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestErrorStatuses walks the ways a request fails against a real hub and
// checks that each answer is a Status with upstream's code and reason and
// with details, which clients read without checking for them.
func TestErrorStatuses(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	anonCfg := rest.AnonymousClientConfig(cfg)
	anon, err := rest.HTTPClientFor(anonCfg)
	if err != nil {
		t.Fatal(err)
	}
	do := func(t *testing.T, c *http.Client, method, path, ctype, body string) (int, metav1.Status, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, cfg.Host+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var st metav1.Status
		_ = json.Unmarshal(b, &st)
		return resp.StatusCode, st, string(b)
	}
	const js = "application/json"
	cm := func(name, extra string) string {
		return `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"` + extra + `}}`
	}
	if code, _, body := do(t, admin, "POST", "/api/v1/namespaces/default/configmaps", js, cm("taken", "")); code != 201 {
		t.Fatalf("create configmap: %d %s", code, body)
	}

	tests := []struct {
		name, method, path, ctype, body string
		anonymous                       bool
		code                            int
		reason                          metav1.StatusReason
		details                         metav1.StatusDetails
		message                         string
	}{
		{name: "no credentials", method: "GET", path: "/api/v1/pods", anonymous: true, code: 403, reason: metav1.StatusReasonForbidden,
			details: metav1.StatusDetails{Kind: "pods"}, message: `pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" at the cluster scope`},
		{name: "unknown path", method: "GET", path: "/api/v1/widgets", code: 404, reason: metav1.StatusReasonNotFound,
			message: "the server could not find the requested resource"},
		{name: "unknown group", method: "GET", path: "/apis/example.com/v1", code: 404, reason: metav1.StatusReasonNotFound},
		{name: "unknown name", method: "GET", path: "/api/v1/namespaces/default/pods/nope", code: 404, reason: metav1.StatusReasonNotFound,
			details: metav1.StatusDetails{Kind: "pods", Name: "nope"}, message: `pods "nope" not found`},
		{name: "unknown namespace", method: "POST", path: "/api/v1/namespaces/nope/configmaps", ctype: js, body: cm("a", ""), code: 404, reason: metav1.StatusReasonNotFound,
			details: metav1.StatusDetails{Kind: "namespaces", Name: "nope"}},
		{name: "bad body", method: "POST", path: "/api/v1/namespaces", ctype: js, body: "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n", code: 400, reason: metav1.StatusReasonBadRequest,
			message: `the object provided is unrecognized (must be of type Namespace): couldn't get version/kind; json parse error: invalid character 'a' looking for beginning of value (61706956657273696f6e3a2076310a6b696e643a204e616d657370616365 ...)`},
		{name: "wrong kind", method: "POST", path: "/api/v1/namespaces", ctype: js, body: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}`, code: 400, reason: metav1.StatusReasonBadRequest,
			message: `Pod in version "v1" cannot be handled as a Namespace: converting (v1.Pod) to (core.Namespace): unknown conversion`},
		{name: "forbidden", method: "DELETE", path: "/api/v1/namespaces/kube-system", code: 403, reason: metav1.StatusReasonForbidden,
			details: metav1.StatusDetails{Kind: "namespaces", Name: "kube-system"}},
		{name: "already exists", method: "POST", path: "/api/v1/namespaces/default/configmaps", ctype: js, body: cm("taken", ""), code: 409, reason: metav1.StatusReasonAlreadyExists,
			details: metav1.StatusDetails{Kind: "configmaps", Name: "taken"}},
		{name: "conflict", method: "PUT", path: "/api/v1/namespaces/default/configmaps/taken", ctype: js, body: cm("taken", `,"resourceVersion":"1"`), code: 409, reason: metav1.StatusReasonConflict,
			details: metav1.StatusDetails{Kind: "configmaps", Name: "taken"}},
		{name: "invalid", method: "POST", path: "/api/v1/namespaces/default/configmaps", ctype: js, body: cm("Not_Valid", ""), code: 422, reason: metav1.StatusReasonInvalid,
			details: metav1.StatusDetails{Kind: "ConfigMap", Name: "Not_Valid"}},
		{name: "method not allowed", method: "DELETE", path: "/api/v1/namespaces", code: 405, reason: metav1.StatusReasonMethodNotAllowed,
			details: metav1.StatusDetails{Kind: "namespaces"}},
		{name: "discovery method not allowed", method: "POST", path: "/apis", ctype: js, body: "{}", code: 405, reason: metav1.StatusReasonMethodNotAllowed},
		{name: "unsupported media type", method: "POST", path: "/api/v1/namespaces/default/configmaps", ctype: "text/plain", body: cm("a", ""), code: 415, reason: metav1.StatusReasonUnsupportedMediaType},
		{name: "unknown field selector", method: "GET", path: "/api/v1/configmaps?fieldSelector=foo.bar%3Dbaz", code: 400, reason: metav1.StatusReasonBadRequest,
			message: `"foo.bar" is not a known field selector: only "metadata.name", "metadata.namespace"`},
		{name: "unsupported field label", method: "GET", path: "/api/v1/pods?fieldSelector=spec.color%3Dblue", code: 400, reason: metav1.StatusReasonBadRequest,
			message: "field label not supported: spec.color"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := admin
			if tc.anonymous {
				c = anon
			}
			code, st, body := do(t, c, tc.method, tc.path, tc.ctype, tc.body)
			if code != tc.code || int(st.Code) != tc.code || st.Reason != tc.reason || st.Kind != "Status" || st.Status != metav1.StatusFailure {
				t.Fatalf("got %d %q, want %d %q: %s", code, st.Reason, tc.code, tc.reason, body)
			}
			if st.Details == nil {
				t.Fatalf("status without details: %s", body)
			}
			if st.Details.Kind != tc.details.Kind || st.Details.Name != tc.details.Name {
				t.Errorf("details %+v, want kind %q name %q", *st.Details, tc.details.Kind, tc.details.Name)
			}
			if tc.message != "" && st.Message != tc.message {
				t.Errorf("message %q, want %q", st.Message, tc.message)
			}
		})
	}

	t.Run("kubectl field selectors", func(t *testing.T) {
		_, err := h.Run("get", "configmaps", "--field-selector", "foo.bar=baz")
		// kubectl prefixes the server's message with what it listed.
		want := `Error from server (BadRequest): Unable to find "/v1, Resource=configmaps" that match label selector "", field selector "foo.bar=baz": "foo.bar" is not a known field selector: only "metadata.name", "metadata.namespace"`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("kubectl get configmaps with an unknown field: %v, want %q", err, want)
		}
		// metadata.namespace is known for a cluster-scoped kind too, and
		// matches no object but with an empty value.
		if out, err := h.Run("get", "clusterroles", "--field-selector", "metadata.namespace=x", "-o", "name"); err != nil || out != "" {
			t.Errorf("kubectl get clusterroles by namespace: %q, %v", out, err)
		}
		if _, err := h.Run("get", "pods", "--field-selector", "spec.color=blue"); err == nil || !strings.Contains(err.Error(), "field label not supported: spec.color") {
			t.Errorf("kubectl get pods with an unknown field: %v", err)
		}
	})

	t.Run("kubectl posts a pod to namespaces", func(t *testing.T) {
		pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`
		_, err := h.RunInput(context.Background(), pod, nil, "create", "--raw", "/api/v1/namespaces", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), `cannot be handled as a Namespace: converting (v1.Pod)`) {
			t.Errorf("kubectl create --raw of a pod to namespaces: %v", err)
		}
	})

	t.Run("kubectl sends yaml as json", func(t *testing.T) {
		yaml := "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n"
		_, err := h.RunInput(context.Background(), yaml, nil, "create", "--raw", "/api/v1/namespaces", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), "the object provided is unrecognized (must be of type Namespace): couldn't get version/kind; json parse error") {
			t.Errorf("kubectl create --raw of yaml: %v", err)
		}
	})
}
