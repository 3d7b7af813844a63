package apiserver

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// typedOnly hides every method but those of storage.API, so lists take the
// typed path.
type typedOnly struct{ storage.API }

// newTestStorage returns storage over a real SQLite file in the test's
// directory, bootstrapped as a hub's, and a logger that drops everything.
func newTestStorage(t *testing.T) (*storage.Storage, *slog.Logger) {
	t.Helper()
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	stg, err := storage.New(storage.Config{Store: st, Kinds: registry.All(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := stg.Bootstrap(context.Background(), storage.BootstrapConfig{AdvertiseAddress: "192.0.2.10"}); err != nil {
		t.Fatal(err)
	}
	createDefaultAccount(t, stg)
	return stg, quiet
}

// createDefaultAccount creates the default namespace's default service
// account, which pods need and the serviceaccount controller would create.
func createDefaultAccount(t testing.TB, stg *storage.Storage) {
	t.Helper()
	k := registry.Lookup(corev1.SchemeGroupVersion.WithResource("serviceaccounts"))
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := stg.Create(context.Background(), k, "default", sa, storage.Options{}); err != nil {
		t.Fatalf("create service account: %v", err)
	}
}

// TestJSONListMatchesTypedList compares lists answered from the stored JSON
// (JSON) or from item encodings (protobuf) with the same lists answered
// through typed objects.
func TestJSONListMatchesTypedList(t *testing.T) {
	stg, quiet := newTestStorage(t)
	ctx := context.Background()
	var pods, cms *registry.Kind
	for _, k := range registry.All() {
		if k.GVK.Group == "" && k.Resource == "pods" {
			pods = k
		}
		if k.GVK.Group == "" && k.Resource == "configmaps" {
			cms = k
		}
	}
	for i := range 5 {
		if _, err := stg.Create(ctx, pods, "default", listBenchPod(i), storage.Options{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stg.Create(ctx, cms, "default", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"},
		Data: map[string]string{"html": "<a href=\"x\">&</a>"}}, storage.Options{FieldManager: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := stg.ListJSON(ctx, pods, "default", storage.ListOptions{}); !ok || err != nil {
		t.Fatalf("pods as JSON: ok %v, err %v", ok, err)
	}
	if _, ok, err := stg.ListProtobuf(ctx, pods, "default", storage.ListOptions{}); !ok || err != nil {
		t.Fatalf("pods as protobuf: ok %v, err %v", ok, err)
	}
	fast, err := New(Config{Storage: stg, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	typed, err := New(Config{Storage: typedOnly{stg}, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	get := func(h http.Handler, path, accept string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("Authorization", "Bearer good")
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, c := range []struct{ path, accept string }{
		{"/api/v1/namespaces/default/pods", ""},
		{"/api/v1/pods", "application/json"},
		{"/api/v1/pods?limit=2", "application/json, */*"},
		{"/api/v1/pods?labelSelector=shard%3D3", "*/*"},
		{"/api/v1/namespaces/default/configmaps", "application/json"},
		{"/api/v1/namespaces", "application/json"},
		{"/api/v1/services", "application/json"},
		{"/apis/rbac.authorization.k8s.io/v1/clusterroles", "application/json"},
		{"/apis/events.k8s.io/v1/events", "application/json"},
		{"/api/v1/pods", "application/json;as=Table;v=v1;g=meta.k8s.io"},
		{"/api/v1/pods", "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
		{"/api/v1/pods", "application/yaml"},
		{"/api/v1/pods?resourceVersion=x", "application/json"},
		{"/api/v1/namespaces/default/pods", mediaProtobuf},
		{"/api/v1/pods", mediaProtobuf + ", application/json"},
		{"/api/v1/pods?limit=2", mediaProtobuf},
		{"/api/v1/pods?labelSelector=shard%3D3", mediaProtobuf},
		{"/api/v1/namespaces", mediaProtobuf},
		{"/apis/events.k8s.io/v1/events", mediaProtobuf},
		{"/api/v1/pods", mediaProtobuf + ";as=Table;v=v1;g=meta.k8s.io"},
		{"/api/v1/pods", mediaProtobuf + ";as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
		{"/api/v1/pods?resourceVersion=x", mediaProtobuf},
	} {
		want, got := get(typed.Handler(), c.path, c.accept), get(fast.Handler(), c.path, c.accept)
		if got.Code != want.Code || got.Body.String() != want.Body.String() {
			t.Errorf("GET %s (%s): %d %s\nwant %d %s", c.path, c.accept, got.Code, got.Body, want.Code, want.Body)
		}
		for _, h := range []string{"Content-Type", "X-Content-Type-Options"} {
			if got.Header().Get(h) != want.Header().Get(h) {
				t.Errorf("GET %s (%s): %s %q, want %q", c.path, c.accept, h, got.Header().Get(h), want.Header().Get(h))
			}
		}
	}
}

// TestStoredListsAudited: a list whose audit event records the response
// (level RequestResponse) is answered through the typed list, so the
// event holds it, in JSON and in protobuf alike; the answer is the same.
func TestStoredListsAudited(t *testing.T) {
	stg, quiet := newTestStorage(t)
	ctx := context.Background()
	pods := registry.Lookup(corev1.SchemeGroupVersion.WithResource("pods"))
	for i := range 3 {
		if _, err := stg.Create(ctx, pods, "default", listBenchPod(i), storage.Options{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	log, logPath := newAuditLog(t, auditv1.LevelRequestResponse)
	counted := &countedLists{Storage: stg}
	audited, err := New(Config{Storage: counted, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet, Audit: log})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New(Config{Storage: stg, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, accept := range []string{"application/json", mediaProtobuf} {
		var bodies []string
		for _, h := range []http.Handler{audited.Handler(), plain.Handler()} {
			r := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/default/pods", nil)
			r.Header.Set("Authorization", "Bearer good")
			r.Header.Set("Accept", accept)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				t.Fatalf("list as %s: %d %s", accept, w.Code, w.Body)
			}
			bodies = append(bodies, w.Body.String())
		}
		if bodies[0] != bodies[1] {
			t.Errorf("list as %s: the audited answer differs from the plain one", accept)
		}
		// A JSON list is written from the stored encodings and recorded
		// as written; the event's JSON of a protobuf list needs the
		// typed list.
		if want := map[string]int64{"application/json": 0, mediaProtobuf: 1}[accept]; counted.lists.Swap(0) != want {
			t.Errorf("list as %s: not %d typed lists", accept, want)
		}
	}
	var lists int
	for _, ev := range readAuditEvents(t, log, logPath) {
		if ev.Verb != "list" || ev.Stage != auditv1.StageResponseComplete {
			continue
		}
		lists++
		if ev.ResponseObject == nil || !strings.Contains(string(ev.ResponseObject.Raw), `"kind":"PodList"`) ||
			!strings.Contains(string(ev.ResponseObject.Raw), `"name":"bench-2"`) {
			t.Errorf("audit event of a list: responseObject %v", ev.ResponseObject)
		}
	}
	if lists != 2 {
		t.Errorf("%d list events in the audit log, want 2", lists)
	}
}

// countedLists counts the typed lists asked of its storage.
type countedLists struct {
	*storage.Storage
	lists atomic.Int64
}

func (c *countedLists) List(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (runtime.Object, error) {
	c.lists.Add(1)
	return c.Storage.List(ctx, k, namespace, opts)
}
