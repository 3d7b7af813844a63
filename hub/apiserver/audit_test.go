package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/tether-edge/tether/hub/audit"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

type denySecrets struct{}

func (denySecrets) Authorize(u *auth.User, a Attributes) error {
	if a.Kind == "secrets" {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, a.Name, nil)
	}
	return nil
}

// newAuditLog opens an audit log in the test's directory whose policy
// logs every request at level, and returns it with its path.
func newAuditLog(t *testing.T, level auditv1.Level) (*audit.Log, string) {
	t.Helper()
	return newAuditLogPolicy(t, "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: "+string(level)+"\n")
}

// newAuditLogPolicy is newAuditLog with the policy given in YAML.
func newAuditLogPolicy(t *testing.T, policyYAML string) (*audit.Log, string) {
	t.Helper()
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "audit.log")
	log, err := audit.New(audit.Options{Path: logPath, PolicyFile: policy})
	if err != nil {
		t.Fatal(err)
	}
	return log, logPath
}

// readAuditEvents closes log and returns the events written to its file
// at path, in order.
func readAuditEvents(t *testing.T, log *audit.Log, path string) []auditv1.Event {
	t.Helper()
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []auditv1.Event
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var ev auditv1.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestAuditHook drives the hook with a handler standing for the pipeline:
// the authenticated and the impersonated user, every stage of a policy
// that omits none, ResponseStarted of a watch, a denial, and a client's
// Audit-Id.
func TestAuditHook(t *testing.T) {
	log, logPath := newAuditLog(t, auditv1.LevelMetadata)
	s := &Server{cfg: Config{Audit: log}, authz: denySecrets{}}
	alice := &auth.User{Name: "alice", Groups: []string{"devs", "system:authenticated"}}
	bob := &auth.User{Name: "bob", UID: "b1", Groups: []string{"system:authenticated"}}
	h := s.withAudit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Audit-Id", requestID(r))
		auditAuthenticated(r, alice)
		as := bob
		if r.Header.Get("Impersonate-User") == "" {
			as = alice
		}
		q := r.URL.Query()
		a := Attributes{Verb: q.Get("verb"), Resource: true, Version: "v1", Kind: q.Get("resource"), Namespace: "ns", Name: q.Get("name")}
		if err := s.authorize(r, as, a); err != nil {
			st := toStatus(err).ErrStatus
			auditStatus(w, &st)
			w.WriteHeader(int(st.Code))
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("{}"))
	}))
	do := func(query string, header map[string]string) string {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/x?"+query, nil)
		for k, v := range header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Header().Get("Audit-Id")
	}
	getID := do("verb=get&resource=pods&name=p", map[string]string{"Impersonate-User": "bob"})
	watchID := do("verb=watch&resource=pods", nil)
	deniedID := do("verb=get&resource=secrets&name=s", nil)
	clientID := do("verb=get&resource=pods&name=q", map[string]string{"Audit-Id": "client-chosen-id"})
	if clientID != "client-chosen-id" {
		t.Errorf("Audit-Id %q, want the client's", clientID)
	}
	stages := map[string][]auditv1.Stage{}
	byID := map[string]auditv1.Event{}
	for _, ev := range readAuditEvents(t, log, logPath) {
		stages[string(ev.AuditID)] = append(stages[string(ev.AuditID)], ev.Stage)
		byID[string(ev.AuditID)] = ev
	}
	want := map[string]string{
		getID:    "RequestReceived ResponseComplete",
		watchID:  "RequestReceived ResponseStarted ResponseComplete",
		deniedID: "RequestReceived ResponseComplete",
		clientID: "RequestReceived ResponseComplete",
	}
	for id, w := range want {
		var got []string
		for _, s := range stages[id] {
			got = append(got, string(s))
		}
		if strings.Join(got, " ") != w {
			t.Errorf("stages of %s: %v, want %s", id, got, w)
		}
	}
	ev := byID[getID]
	if ev.User.Username != "alice" || ev.ImpersonatedUser == nil || ev.ImpersonatedUser.Username != "bob" || ev.ImpersonatedUser.UID != "b1" {
		t.Errorf("impersonated request: user %+v, impersonatedUser %+v", ev.User, ev.ImpersonatedUser)
	}
	if ev := byID[watchID]; ev.ImpersonatedUser != nil || ev.User.Username != "alice" || ev.ObjectRef.Resource != "pods" {
		t.Errorf("watch: %+v", ev)
	}
	ev = byID[deniedID]
	if ev.ResponseStatus == nil || ev.ResponseStatus.Code != 403 || ev.ResponseStatus.Reason != "Forbidden" ||
		ev.Annotations["authorization.k8s.io/decision"] != "forbid" || !strings.Contains(ev.Annotations["authorization.k8s.io/reason"], "forbidden") {
		t.Errorf("denied request: %+v", ev)
	}
	if byID[getID].Annotations["authorization.k8s.io/decision"] != "allow" {
		t.Errorf("allowed request's annotations: %v", byID[getID].Annotations)
	}
}

// TestAuditOmitsManagedFields: with omitManagedFields, the audit events'
// response objects lack managedFields, of an object, of each item of a
// list (written from the stored encodings) and of each row's object of a
// Table, while the answers keep them.
func TestAuditOmitsManagedFields(t *testing.T) {
	stg, quiet := newTestStorage(t)
	pods := registry.Lookup(corev1.SchemeGroupVersion.WithResource("pods"))
	for i := range 2 {
		if _, err := stg.Create(context.Background(), pods, "default", listBenchPod(i), storage.Options{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	log, logPath := newAuditLogPolicy(t, "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitManagedFields: true\nrules:\n- level: RequestResponse\n")
	srv, err := New(Config{Storage: stg, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet, Audit: log})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, accept string }{
		{"/api/v1/namespaces/default/pods/bench-1", "application/json"},
		{"/api/v1/namespaces/default/pods", "application/json"},
		{"/api/v1/namespaces/default/pods?includeObject=Object", "application/json;as=Table;v=v1;g=meta.k8s.io"},
	} {
		r := httptest.NewRequest(http.MethodGet, c.path, nil)
		r.Header.Set("Authorization", "Bearer good")
		r.Header.Set("Accept", c.accept)
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, r)
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"managedFields"`) {
			t.Fatalf("GET %s as %s: %d, managedFields in the answer: %v", c.path, c.accept, w.Code, strings.Contains(w.Body.String(), `"managedFields"`))
		}
	}
	var n int
	for _, ev := range readAuditEvents(t, log, logPath) {
		if ev.Stage != auditv1.StageResponseComplete || ev.Verb == "" {
			continue
		}
		n++
		if ev.ResponseObject == nil || !strings.Contains(string(ev.ResponseObject.Raw), `"bench-1"`) ||
			strings.Contains(string(ev.ResponseObject.Raw), "managedFields") {
			var raw []byte
			if ev.ResponseObject != nil {
				raw = ev.ResponseObject.Raw
			}
			t.Errorf("%s %s: responseObject %s", ev.Verb, ev.RequestURI, raw)
		}
	}
	if n != 3 {
		t.Errorf("%d events, want 3", n)
	}
}
