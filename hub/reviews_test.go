package hub_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/hub/pki"
)

// caSignedKubeconfig writes a kubeconfig for user and groups with a client
// certificate signed by the hub's CA, as an administrator hands one out,
// and returns its path. The CA is read from a copy of the hub's PKI
// directory, so the hub's own files stay untouched.
func caSignedKubeconfig(t *testing.T, h *hubtest.Hub, user string, groups ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "ca.key"} {
		b, err := os.ReadFile(filepath.Join(h.DataDir, "pki", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "pki", f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, err := pki.LoadOrCreate(pki.Config{Dir: dir, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, user+".kubeconfig")
	if err := a.WriteKubeconfig(path, "https://"+h.Addr, user, groups); err != nil {
		t.Fatal(err)
	}
	return path
}

// anonymousGet reads path from the hub without credentials, trusting the
// hub's CA, and returns the status code and body.
func anonymousGet(t *testing.T, h *hubtest.Hub, path string) (int, string) {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(h.DataDir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := c.Get("https://" + h.Addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// whoamiOf runs kubectl auth whoami with args and returns the user.
func whoamiOf(t *testing.T, h *hubtest.Hub, args ...string) authenticationv1.UserInfo {
	t.Helper()
	out := mustKubectl(t, h, append([]string{"auth", "whoami", "-o", "json"}, args...)...)
	var ssr authenticationv1.SelfSubjectReview
	if err := json.Unmarshal([]byte(out), &ssr); err != nil {
		t.Fatalf("parse kubectl auth whoami: %v\n%s", err, out)
	}
	return ssr.Status.UserInfo
}

// TestKubectlAuthReviews drives the review APIs of a real hub with
// kubectl: discovery lists them with the create verb only; auth whoami
// shows the certificate's user and groups, or the impersonated identity
// with --as and --as-group; auth can-i and can-i --list answer from the
// hub's authorizer; a TokenReview created with kubectl checks a
// service account token; requests without credentials are
// system:anonymous, who may read the health and version paths and
// nothing else.
func TestKubectlAuthReviews(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)

	out := mustKubectl(t, h, "api-resources", "--api-group=authorization.k8s.io", "-o", "wide", "--no-headers")
	for _, r := range []string{"localsubjectaccessreviews", "selfsubjectaccessreviews", "selfsubjectrulesreviews", "subjectaccessreviews"} {
		if !slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool {
			f := strings.Fields(l)
			return len(f) > 0 && f[0] == r && f[len(f)-1] == "create"
		}) {
			t.Errorf("api-resources: no create-only %s in\n%s", r, out)
		}
	}
	out = mustKubectl(t, h, "api-resources", "--api-group=authentication.k8s.io", "-o", "name")
	if !strings.Contains(out, "selfsubjectreviews.authentication.k8s.io") || !strings.Contains(out, "tokenreviews.authentication.k8s.io") {
		t.Errorf("api-resources authentication.k8s.io:\n%s", out)
	}

	if u := whoamiOf(t, h); u.Username != pki.AdminUser || !slices.Equal(u.Groups, []string{pki.AdminGroup, "system:authenticated"}) {
		t.Errorf("admin whoami: %+v", u)
	}
	if u := whoamiOf(t, h, "--as=bob", "--as-group=devs", "--as-group=ops"); u.Username != "bob" || !slices.Equal(u.Groups, []string{"devs", "ops", "system:authenticated"}) {
		t.Errorf("whoami --as=bob --as-group=devs --as-group=ops: %+v", u)
	}
	if u := whoamiOf(t, h, "--as=system:serviceaccount:y:robot"); u.Username != "system:serviceaccount:y:robot" ||
		!slices.Equal(u.Groups, []string{"system:serviceaccounts", "system:serviceaccounts:y", "system:authenticated"}) {
		t.Errorf("whoami as a service account: %+v", u)
	}
	bob := caSignedKubeconfig(t, h, "bob", "devs")
	if u := whoamiOf(t, h, "--kubeconfig", bob); u.Username != "bob" || !slices.Equal(u.Groups, []string{"devs", "system:authenticated"}) {
		t.Errorf("bob whoami: %+v", u)
	}
	// A node reviews itself (system:basic-user, through RBAC after the
	// node rules), and gets what a role bound to system:nodes grants.
	node := caSignedKubeconfig(t, h, "system:node:n1", "system:nodes")
	if u := whoamiOf(t, h, "--kubeconfig", node); u.Username != "system:node:n1" || !slices.Equal(u.Groups, []string{"system:nodes", "system:authenticated"}) {
		t.Errorf("node whoami: %+v", u)
	}
	if out, _ := h.Run("--kubeconfig", node, "auth", "can-i", "list", "deployments.apps"); !strings.HasPrefix(out, "no") {
		t.Errorf("node can-i list deployments before a binding: %q", out)
	}
	mustKubectl(t, h, "create", "clusterrole", "read-deployments", "--verb=list", "--resource=deployments.apps")
	mustKubectl(t, h, "create", "clusterrolebinding", "nodes-read-deployments", "--clusterrole=read-deployments", "--group=system:nodes")
	waitFor(t, "a node to list deployments after a binding", func() bool {
		_, err := h.Run("--kubeconfig", node, "get", "deployments.apps", "-A")
		return err == nil
	})
	if _, err := h.Run("--kubeconfig", node, "get", "secrets", "-n", "default", "other"); err == nil ||
		!strings.Contains(err.Error(), `User "system:node:n1" cannot get resource "secrets" in API group "" in the namespace "default": no relationship found between node 'n1' and this object`) {
		t.Errorf("node get secret: %v", err)
	}

	if out := strings.TrimSpace(mustKubectl(t, h, "auth", "can-i", "create", "pods")); out != "yes" {
		t.Errorf("admin can-i create pods: %q", out)
	}
	if out := strings.TrimSpace(mustKubectl(t, h, "auth", "can-i", "get", "/healthz")); out != "yes" {
		t.Errorf("admin can-i get /healthz: %q", out)
	}
	out = mustKubectl(t, h, "auth", "can-i", "--list", "-n", "default")
	if !strings.Contains(out, "*.*") || !strings.Contains(out, "[*]") {
		t.Errorf("admin can-i --list:\n%s", out)
	}

	mustKubectl(t, h, "create", "serviceaccount", "robot")
	token := strings.TrimSpace(mustKubectl(t, h, "create", "token", "robot"))
	review := `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"` + token + `"}}`
	out, err := h.RunInput(t.Context(), review, nil, "create", "-f", "-", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var tr authenticationv1.TokenReview
	if err := json.Unmarshal([]byte(out), &tr); err != nil {
		t.Fatalf("parse TokenReview: %v\n%s", err, out)
	}
	if !tr.Status.Authenticated || tr.Status.User.Username != "system:serviceaccount:default:robot" {
		t.Errorf("TokenReview: %+v", tr.Status)
	}
	if _, err := h.Run("get", "tokenreviews"); err == nil || !strings.Contains(err.Error(), "(MethodNotAllowed): the server does not allow this method on the requested resource") {
		t.Errorf("get tokenreviews: %v", err)
	}

	for _, p := range []string{"/healthz", "/livez", "/readyz", "/version"} {
		if code, body := anonymousGet(t, h, p); code != http.StatusOK {
			t.Errorf("anonymous %s: %d %s", p, code, body)
		}
	}
	code, body := anonymousGet(t, h, "/api")
	var st metav1.Status
	_ = json.Unmarshal([]byte(body), &st)
	if code != http.StatusForbidden || st.Message != `forbidden: User "system:anonymous" cannot get path "/api"` {
		t.Errorf("anonymous /api: %d %s", code, body)
	}
}
