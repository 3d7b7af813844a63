package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

type hub struct {
	srv   *httptest.Server
	cfg   *rest.Config
	cs    *kubernetes.Clientset
	store *sqlite.Store
	api   *Server
}

// newHub serves the API over TLS on loopback, backed by a real storage over
// a real SQLite file.
func newHub(t *testing.T) *hub { t.Helper(); return newHubWith(t, nil) }

// newHubWith is newHub with a chance to change the server's Config.
func newHubWith(t testing.TB, tweak func(*Config)) *hub {
	t.Helper()
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	stg, err := storage.New(storage.Config{Store: st, Kinds: registry.All(), Logger: quiet})
	if err != nil {
		t.Fatalf("new storage: %v", err)
	}
	if err := stg.Bootstrap(context.Background(), storage.BootstrapConfig{AdvertiseAddress: "192.0.2.10"}); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	createDefaultAccount(t, stg)
	cfg := Config{Storage: stg, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet,
		Version: version.Info{Major: "1", Minor: "37", GitVersion: "v1.37.2"}}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	rcfg := &rest.Config{Host: srv.URL, BearerToken: "good", TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	cs, err := kubernetes.NewForConfig(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	return &hub{srv: srv, cfg: rcfg, cs: cs, store: st, api: s}
}

func reasonOf(err error) metav1.StatusReason { return apierrors.ReasonForError(err) }

func TestTypedCRUD(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	cms := h.cs.CoreV1().ConfigMaps("default")
	created, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"app": "x"}}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if created.UID == "" || created.ResourceVersion == "" {
		t.Fatalf("created object lacks uid or resourceVersion: %+v", created.ObjectMeta)
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, metav1.CreateOptions{}); reasonOf(err) != metav1.StatusReasonAlreadyExists {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}
	got, err := cms.Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if diff := cmp.Diff(created.Data, got.Data); diff != "" {
		t.Errorf("data (-created +got):\n%s", diff)
	}
	list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: "app=x"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("list: %v %d items", err, len(list.Items))
	}
	got.Data["k"] = "w"
	updated, err := cms.Update(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if updated.ResourceVersion == got.ResourceVersion {
		t.Errorf("update kept resourceVersion %s", got.ResourceVersion)
	}
	if _, err := cms.Update(ctx, got, metav1.UpdateOptions{}); reasonOf(err) != metav1.StatusReasonConflict {
		t.Fatalf("stale update: %v, want Conflict", err)
	}
	// Dry-run create stores nothing.
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dry"}}, metav1.CreateOptions{DryRun: []string{"All"}}); err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	if _, err := cms.Get(ctx, "dry", metav1.GetOptions{}); reasonOf(err) != metav1.StatusReasonNotFound {
		t.Fatalf("dry-run object: %v, want NotFound", err)
	}
	if err := cms.Delete(ctx, "a", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := cms.Delete(ctx, "a", metav1.DeleteOptions{}); reasonOf(err) != metav1.StatusReasonNotFound {
		t.Fatalf("second delete: %v, want NotFound", err)
	}
}

func TestDeleteResponse(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	cm, err := h.cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gone"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res := do(t, h.srv, "DELETE", "/api/v1/namespaces/default/configmaps/gone", "good", "application/json",
		[]byte(`{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}`), nil)
	want := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess,
		Details: &metav1.StatusDetails{Name: "gone", Kind: "configmaps", UID: cm.UID}}
	if res.code != 200 {
		t.Fatalf("delete: %d %s", res.code, res.body)
	}
	if diff := cmp.Diff(want, res.status); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
}

func TestProtobuf(t *testing.T) {
	h := newHub(t)
	cfg := rest.CopyConfig(h.cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pb"}, Data: map[string]string{"a": "b"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("protobuf create: %v", err)
	}
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "pb", metav1.GetOptions{})
	if err != nil || got.Data["a"] != "b" {
		t.Fatalf("protobuf get: %v %v", err, got)
	}
	w, err := cs.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{ResourceVersion: got.ResourceVersion, TimeoutSeconds: ptr.To(int64(5))})
	if err != nil {
		t.Fatalf("protobuf watch: %v", err)
	}
	defer w.Stop()
	if err := cs.CoreV1().ConfigMaps("default").Delete(ctx, "pb", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != "DELETED" || ev.Object.(*corev1.ConfigMap).Name != "pb" {
			t.Fatalf("event %s %T", ev.Type, ev.Object)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no protobuf watch event")
	}
}

func TestPatches(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	cms := h.cs.CoreV1().ConfigMaps("default")
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"a": "1"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		pt     types.PatchType
		patch  string
		opts   metav1.PatchOptions
		labels map[string]string
		reason metav1.StatusReason
	}{
		{name: "json", pt: types.JSONPatchType, patch: `[{"op":"add","path":"/metadata/labels/b","value":"2"}]`, labels: map[string]string{"a": "1", "b": "2"}},
		{name: "merge", pt: types.MergePatchType, patch: `{"metadata":{"labels":{"a":null}}}`, labels: map[string]string{"b": "2"}},
		{name: "strategic", pt: types.StrategicMergePatchType, patch: `{"metadata":{"labels":{"c":"3"}}}`, labels: map[string]string{"b": "2", "c": "3"}},
		{name: "apply", pt: types.ApplyPatchType, patch: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"p","labels":{"d":"4"}}}`, opts: metav1.PatchOptions{FieldManager: "test"}, labels: map[string]string{"b": "2", "c": "3", "d": "4"}},
		{name: "json test fails", pt: types.JSONPatchType, patch: `[{"op":"test","path":"/metadata/labels/b","value":"9"}]`, reason: metav1.StatusReasonInvalid},
		{name: "json malformed", pt: types.JSONPatchType, patch: `{"op":`, reason: metav1.StatusReasonBadRequest},
		{name: "stale resourceVersion", pt: types.MergePatchType, patch: `{"metadata":{"resourceVersion":"1","labels":{"e":"5"}}}`, reason: metav1.StatusReasonConflict},
		{name: "strict unknown field", pt: types.MergePatchType, patch: `{"spec":{"foo":1}}`, opts: metav1.PatchOptions{FieldValidation: "Strict"}, reason: metav1.StatusReasonBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := cms.Get(ctx, "p", metav1.GetOptions{})
			got, err := cms.Patch(ctx, "p", tc.pt, []byte(tc.patch), tc.opts)
			if tc.reason != "" {
				if reasonOf(err) != tc.reason {
					t.Fatalf("error %v, want %s", err, tc.reason)
				}
				after, _ := cms.Get(ctx, "p", metav1.GetOptions{})
				if after.ResourceVersion != before.ResourceVersion {
					t.Errorf("failed patch changed resourceVersion %s -> %s", before.ResourceVersion, after.ResourceVersion)
				}
				return
			}
			if err != nil {
				t.Fatalf("patch: %v", err)
			}
			if diff := cmp.Diff(tc.labels, got.Labels); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFieldValidationWarn(t *testing.T) {
	h := newHub(t)
	res := do(t, h.srv, "POST", "/api/v1/namespaces/default/configmaps", "good", "application/json",
		[]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"w"},"spec":{"foo":1}}`), nil)
	if res.code != 201 {
		t.Fatalf("create: %d %s", res.code, res.body)
	}
	if diff := cmp.Diff([]string{`299 - "unknown field \"spec\""`}, res.header.Values("Warning")); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

func TestPodTable(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx"}}}}
	if _, err := h.cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	accept := "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
	for _, path := range []string{"/api/v1/namespaces/default/pods?limit=500", "/api/v1/pods", "/api/v1/namespaces/default/pods/web"} {
		res := do(t, h.srv, "GET", path, "good", "", nil, map[string]string{"Accept": accept})
		var tbl metav1.Table
		if err := json.Unmarshal([]byte(res.body), &tbl); err != nil || res.code != 200 {
			t.Fatalf("%s: %d %v %s", path, res.code, err, res.body)
		}
		if tbl.Kind != "Table" || tbl.APIVersion != "meta.k8s.io/v1" || len(tbl.ColumnDefinitions) == 0 || tbl.ColumnDefinitions[0].Name != "Name" {
			t.Fatalf("%s: not a pod table: %s", path, res.body)
		}
		if len(tbl.Rows) != 1 || tbl.Rows[0].Cells[0] != "web" {
			t.Fatalf("%s: rows %+v", path, tbl.Rows)
		}
		var pm metav1.PartialObjectMetadata
		if err := json.Unmarshal(tbl.Rows[0].Object.Raw, &pm); err != nil || pm.Kind != "PartialObjectMetadata" || pm.Labels["app"] != "web" || pm.Namespace != "default" {
			t.Fatalf("%s: row object %s", path, tbl.Rows[0].Object.Raw)
		}
	}
	var names []string
	res := do(t, h.srv, "GET", "/api/v1/namespaces/default/pods", "good", "", nil, map[string]string{"Accept": accept})
	var tbl metav1.Table
	_ = json.Unmarshal([]byte(res.body), &tbl)
	for _, c := range tbl.ColumnDefinitions {
		if c.Priority == 0 {
			names = append(names, c.Name)
		}
	}
	if diff := cmp.Diff([]string{"Name", "Ready", "Status", "Restarts", "Age"}, names); diff != "" {
		t.Errorf("pod columns (-want +got):\n%s", diff)
	}
}

func TestWatchFraming(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	list, err := h.cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", h.srv.URL+"/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=3&resourceVersion="+list.ResourceVersion, nil)
	req.Header.Set("Authorization", "Bearer good")
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("watch: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if _, err := h.cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "w1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatalf("no event: %v", sc.Err())
	}
	var ev struct {
		Type   string
		Object struct {
			Kind, APIVersion string
			Metadata         metav1.ObjectMeta
		}
	}
	if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
		t.Fatalf("event line %q: %v", sc.Text(), err)
	}
	if ev.Type != "ADDED" || ev.Object.Kind != "ConfigMap" || ev.Object.APIVersion != "v1" || ev.Object.Metadata.Name != "w1" {
		t.Errorf("event %s", sc.Text())
	}
	start := time.Now()
	for sc.Scan() {
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("timeoutSeconds=3 watch lasted %v", d)
	}
}

func TestWatchTable(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	for _, n := range []string{"t1", "t2"} {
		if _, err := h.cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	req, _ := http.NewRequest("GET", h.srv.URL+"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0&timeoutSeconds=1", nil)
	req.Header.Set("Authorization", "Bearer good")
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var cols []int
	for sc.Scan() {
		var ev struct {
			Type   string
			Object metav1.Table
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Object.Kind != "Table" || len(ev.Object.Rows) != 1 {
			t.Fatalf("event %s", sc.Text())
		}
		cols = append(cols, len(ev.Object.ColumnDefinitions))
	}
	if len(cols) < 2 || cols[0] == 0 || cols[1] != 0 {
		t.Errorf("column definitions per event %v, want only in the first", cols)
	}
}

func TestInformer(t *testing.T) {
	h := newHub(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := informers.NewSharedInformerFactoryWithOptions(h.cs, 0, informers.WithNamespace("default"))
	inf := f.Core().V1().ConfigMaps().Informer()
	seen := make(chan string, 10)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) { seen <- obj.(*corev1.ConfigMap).Name }})
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	if _, err := h.cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "inf"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case n := <-seen:
			if n == "inf" {
				return
			}
		case <-deadline:
			t.Fatal("informer did not see the new configmap")
		}
	}
}

func TestScaleAndStatus(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	deps := h.cs.AppsV1().Deployments("default")
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "d"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "d"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx"}}}}}}
	if _, err := deps.Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc, err := deps.GetScale(ctx, "d", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get scale: %v", err)
	}
	if sc.Spec.Replicas != 1 || sc.Status.Selector != "app=d" {
		t.Errorf("scale %+v", sc)
	}
	sc.Spec.Replicas = 3
	if _, err := deps.UpdateScale(ctx, "d", sc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update scale: %v", err)
	}
	if _, err := deps.UpdateScale(ctx, "d", sc, metav1.UpdateOptions{}); reasonOf(err) != metav1.StatusReasonConflict {
		t.Fatalf("stale scale update: %v, want Conflict", err)
	}
	res, err := h.cs.AppsV1().RESTClient().Patch(types.MergePatchType).Namespace("default").Resource("deployments").Name("d").SubResource("scale").
		Body([]byte(`{"spec":{"replicas":5}}`)).DoRaw(ctx)
	if err != nil {
		t.Fatalf("patch scale: %v", err)
	}
	var got autoscalingv1.Scale
	if err := json.Unmarshal(res, &got); err != nil || got.Spec.Replicas != 5 || got.Kind != "Scale" || got.APIVersion != "autoscaling/v1" {
		t.Fatalf("patched scale %s", res)
	}
	cur, _ := deps.Get(ctx, "d", metav1.GetOptions{})
	if *cur.Spec.Replicas != 5 {
		t.Errorf("deployment replicas %d, want 5", *cur.Spec.Replicas)
	}
	// Status writes keep spec; main writes keep status.
	cur.Status.Replicas = 7
	cur.Spec.Replicas = ptr.To(int32(9))
	st, err := deps.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status: %v", err)
	}
	if st.Status.Replicas != 7 || *st.Spec.Replicas != 5 {
		t.Errorf("after status update: status %d spec %d", st.Status.Replicas, *st.Spec.Replicas)
	}
	st.Status.Replicas = 0
	main, err := deps.Update(ctx, st, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if main.Status.Replicas != 7 {
		t.Errorf("main update changed status to %d", main.Status.Replicas)
	}
}

func TestDynamicAndMetadata(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	dc, err := dynamic.NewForConfig(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	list, err := dc.Resource(gvr).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("dynamic list namespaces: %v", err)
	}
	res := do(t, h.srv, "GET", "/api/v1/namespaces", "good", "", nil, map[string]string{"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"})
	var pl metav1.PartialObjectMetadataList
	if err := json.Unmarshal([]byte(res.body), &pl); err != nil || pl.Kind != "PartialObjectMetadataList" || len(pl.Items) != len(list.Items) {
		t.Fatalf("metadata list: %d %s", res.code, res.body)
	}
	if !strings.Contains(res.body, `"name":"default"`) {
		t.Errorf("metadata list lacks default namespace: %s", res.body)
	}
}

func TestWatchExpired(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	for _, n := range []string{"e1", "e2"} {
		if _, err := h.cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.store.Compact(ctx, h.store.Revision()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	res := do(t, h.srv, "GET", "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1&timeoutSeconds=2", "good", "", nil, nil)
	if res.code == 410 && res.status.Reason == metav1.StatusReasonExpired {
		return
	}
	var ev struct {
		Type   string
		Object metav1.Status
	}
	if err := json.Unmarshal([]byte(strings.SplitN(res.body, "\n", 2)[0]), &ev); err != nil || ev.Type != "ERROR" || ev.Object.Code != 410 || ev.Object.Reason != metav1.StatusReasonExpired {
		t.Fatalf("watch below compaction: %d %s", res.code, res.body)
	}
}
