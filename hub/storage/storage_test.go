package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/sqlite"
)

type fixture struct {
	s  *Storage
	st *sqlite.Store
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), BookmarkInterval: 200 * time.Millisecond, FutureWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("new storage: %v", err)
	}
	if err := s.Bootstrap(context.Background(), BootstrapConfig{AdvertiseAddress: "192.0.2.10", Port: 6443}); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	// Pods need their service account, which the serviceaccount
	// controller would create.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := s.Create(context.Background(), kind(t, "", "v1", "serviceaccounts"), "default", sa, Options{}); err != nil {
		t.Fatalf("create service account: %v", err)
	}
	return &fixture{s: s, st: st}
}

func kind(t testing.TB, group, version, resource string) *registry.Kind {
	t.Helper()
	k := registry.Lookup(schema.GroupVersionResource{Group: group, Version: version, Resource: resource})
	if k == nil {
		t.Fatalf("kind %s/%s %s not served", group, version, resource)
	}
	return k
}

func cm(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}
}

func rvOf(t *testing.T, obj runtime.Object) int64 {
	t.Helper()
	m, err := meta.CommonAccessor(obj)
	if err != nil {
		t.Fatalf("accessor of %T: %v", obj, err)
	}
	n, err := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion of %T: %v", obj, err)
	}
	return n
}

func wantReason(t *testing.T, err error, reason metav1.StatusReason) {
	t.Helper()
	if got := apierrors.ReasonForError(err); got != reason {
		t.Fatalf("error %v: reason %q, want %q", err, got, reason)
	}
}

func TestBootstrapIdempotent(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rev := f.st.Revision()
	if err := f.s.Bootstrap(ctx, BootstrapConfig{AdvertiseAddress: "192.0.2.10", Port: 6443}); err != nil {
		t.Fatalf("second bootstrap: %v", err)
	}
	if got := f.st.Revision(); got != rev {
		t.Errorf("second bootstrap wrote: revision %d → %d", rev, got)
	}
	svc, err := f.s.Get(ctx, kind(t, "", "v1", "services"), "default", "kubernetes")
	if err != nil {
		t.Fatalf("get kubernetes service: %v", err)
	}
	if ip := svc.(*corev1.Service).Spec.ClusterIP; ip != "10.0.0.1" {
		t.Errorf("cluster IP %q", ip)
	}
	for _, ns := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
		if _, err := f.s.Get(ctx, kind(t, "", "v1", "namespaces"), "", ns); err != nil {
			t.Errorf("namespace %s: %v", ns, err)
		}
	}
}

func TestKeepBootstrapped(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	svcs, nsk := kind(t, "", "v1", "services"), kind(t, "", "v1", "namespaces")
	if _, deleted, err := f.s.Delete(ctx, svcs, "default", "kubernetes", nil, false); err != nil || !deleted {
		t.Fatalf("delete kubernetes service: deleted %v, %v", deleted, err)
	}
	// A system namespace cannot be deleted through the API; one lost
	// from the store all the same comes back.
	if _, err := f.st.Delete(ctx, store.Key{Resource: "namespaces", Name: "kube-node-lease"}, 0); err != nil {
		t.Fatal(err)
	}
	go f.s.KeepBootstrapped(ctx, BootstrapConfig{AdvertiseAddress: "192.0.2.10", Port: 6443}, 20*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, errSvc := f.s.Get(ctx, svcs, "default", "kubernetes")
		ns, errNS := f.s.Get(ctx, nsk, "", "kube-node-lease")
		if errSvc == nil && errNS == nil && ns.(*corev1.Namespace).DeletionTimestamp == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recreated: kubernetes service %v, kube-node-lease %v", errSvc, errNS)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// With everything in place, the checks write nothing.
	rev := f.st.Revision()
	time.Sleep(100 * time.Millisecond)
	if got := f.st.Revision(); got != rev {
		t.Errorf("checks of present objects wrote: revision %d → %d", rev, got)
	}
}

func TestCreateGetList(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	obj, err := f.s.Create(ctx, k, "default", cm("a", map[string]string{"x": "1"}), Options{FieldManager: "test"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	c := obj.(*corev1.ConfigMap)
	if c.UID == "" || c.CreationTimestamp.IsZero() || c.Kind != "ConfigMap" || c.APIVersion != "v1" {
		t.Errorf("created object lacks system fields: %+v", c.ObjectMeta)
	}
	if len(c.ManagedFields) != 1 || c.ManagedFields[0].Manager != "test" || c.ManagedFields[0].Operation != metav1.ManagedFieldsOperationUpdate {
		t.Errorf("managedFields = %+v", c.ManagedFields)
	}
	got, err := f.s.Get(ctx, k, "default", "a")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if diff := cmp.Diff(obj, got); diff != "" {
		t.Errorf("get differs from create (-create +get):\n%s", diff)
	}
	_, err = f.s.Create(ctx, k, "default", cm("a", nil), Options{})
	wantReason(t, err, metav1.StatusReasonAlreadyExists)

	gen, err := f.s.Create(ctx, k, "default", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "gen-"}}, Options{})
	if err != nil {
		t.Fatalf("create generateName: %v", err)
	}
	if n := gen.(*corev1.ConfigMap).Name; len(n) != len("gen-")+5 {
		t.Errorf("generated name %q", n)
	}

	list, err := f.s.List(ctx, k, "default", ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	l := list.(*corev1.ConfigMapList)
	if len(l.Items) != 2 || l.Kind != "ConfigMapList" || rvOf(t, l) != f.st.Revision() {
		t.Errorf("list: %d items, kind %q, rv %s (store %d)", len(l.Items), l.Kind, l.ResourceVersion, f.st.Revision())
	}
	empty, err := f.s.List(ctx, k, "kube-public", ListOptions{})
	if err != nil {
		t.Fatalf("list empty: %v", err)
	}
	if items := empty.(*corev1.ConfigMapList).Items; items == nil {
		t.Errorf("empty list has nil items")
	}
	_, err = f.s.List(ctx, k, "default", ListOptions{Field: fields.OneTermEqualSelector("spec.foo", "x")})
	wantReason(t, err, metav1.StatusReasonBadRequest)
	sel, err := f.s.List(ctx, k, "default", ListOptions{Field: fields.OneTermEqualSelector("metadata.name", "a")})
	if err != nil || len(sel.(*corev1.ConfigMapList).Items) != 1 {
		t.Errorf("field selector list: %v", err)
	}
}

func TestCreateNamespaceRules(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	nsk := kind(t, "", "v1", "namespaces")
	tests := []struct {
		name, ns, objNS string
		reason          metav1.StatusReason
	}{
		{"missing namespace", "nope", "", metav1.StatusReasonNotFound},
		{"mismatch", "default", "kube-system", metav1.StatusReasonBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := cm("x", nil)
			o.Namespace = tc.objNS
			_, err := f.s.Create(ctx, k, tc.ns, o, Options{})
			wantReason(t, err, tc.reason)
		})
	}
	for _, name := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
		rev := f.st.Revision()
		_, _, err := f.s.Delete(ctx, nsk, "", name, nil, false)
		wantReason(t, err, metav1.StatusReasonForbidden)
		if want := `namespaces "` + name + `" is forbidden: this namespace may not be deleted`; err.Error() != want {
			t.Errorf("delete namespace %s: %q, want %q", name, err, want)
		}
		if f.st.Revision() != rev {
			t.Errorf("refused delete of namespace %s wrote", name)
		}
	}
	if _, err := f.s.Create(ctx, nsk, "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}, Options{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	obj, deleted, err := f.s.Delete(ctx, nsk, "", "doomed", nil, false)
	if err != nil || deleted {
		t.Fatalf("delete namespace: deleted %v, %v", deleted, err)
	}
	if ns := obj.(*corev1.Namespace); ns.Status.Phase != corev1.NamespaceTerminating || ns.DeletionTimestamp == nil {
		t.Fatalf("namespace after delete: %+v", ns.Status)
	}
	_, err = f.s.Create(ctx, k, "doomed", cm("x", nil), Options{})
	wantReason(t, err, metav1.StatusReasonForbidden)

	// Finalize removes spec.finalizers; the namespace then goes.
	_, err = f.s.GuaranteedUpdate(ctx, nsk, "", "doomed", Options{Subresource: "finalize"}, func(cur runtime.Object) (runtime.Object, error) {
		cur.(*corev1.Namespace).Spec.Finalizers = nil
		return cur, nil
	})
	if err != nil {
		t.Fatalf("finalize: %v", err)
	}
	_, err = f.s.Get(ctx, nsk, "", "doomed")
	wantReason(t, err, metav1.StatusReasonNotFound)
}

func TestUpdateSemantics(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "apps", "v1", "deployments")
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx"}}},
			},
		},
		Status: appsv1.DeploymentStatus{Replicas: 9},
	}
	obj, err := f.s.Create(ctx, k, "default", d, Options{FieldManager: "test"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	created := obj.(*appsv1.Deployment)
	if created.Generation != 1 || created.Status.Replicas != 0 {
		t.Fatalf("create: generation %d, status %+v", created.Generation, created.Status)
	}

	// No-op update: same revision, no write.
	rev := f.st.Revision()
	same, err := f.s.Update(ctx, k, "default", "web", created.DeepCopy(), Options{FieldManager: "test"})
	if err != nil {
		t.Fatalf("no-op update: %v", err)
	}
	if rvOf(t, same) != rvOf(t, created) || f.st.Revision() != rev {
		t.Errorf("no-op update wrote: rv %d → %d, store %d → %d", rvOf(t, created), rvOf(t, same), rev, f.st.Revision())
	}

	// Spec change bumps generation; status in the body is ignored.
	upd := created.DeepCopy()
	upd.Spec.Replicas = ptr.To[int32](3)
	upd.Status.Replicas = 7
	obj, err = f.s.Update(ctx, k, "default", "web", upd, Options{FieldManager: "test"})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	u := obj.(*appsv1.Deployment)
	if u.Generation != 2 || u.Status.Replicas != 0 || *u.Spec.Replicas != 3 {
		t.Errorf("update: generation %d, status.replicas %d, spec.replicas %d", u.Generation, u.Status.Replicas, *u.Spec.Replicas)
	}

	// Stale resourceVersion: conflict.
	_, err = f.s.Update(ctx, k, "default", "web", created.DeepCopy(), Options{})
	wantReason(t, err, metav1.StatusReasonConflict)

	// Status write keeps spec and generation.
	st := u.DeepCopy()
	st.Spec.Replicas = ptr.To[int32](10)
	st.Status.Replicas = 3
	obj, err = f.s.Update(ctx, k, "default", "web", st, Options{Subresource: "status", FieldManager: "ctl"})
	if err != nil {
		t.Fatalf("status update: %v", err)
	}
	s2 := obj.(*appsv1.Deployment)
	if s2.Status.Replicas != 3 || *s2.Spec.Replicas != 3 || s2.Generation != 2 {
		t.Errorf("status update: status %d, spec %d, generation %d", s2.Status.Replicas, *s2.Spec.Replicas, s2.Generation)
	}

	// Immutable selector: 422.
	bad := s2.DeepCopy()
	bad.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}
	bad.Spec.Template.Labels = map[string]string{"app": "other"}
	_, err = f.s.Update(ctx, k, "default", "web", bad, Options{})
	wantReason(t, err, metav1.StatusReasonInvalid)

	// Name mismatch: 400.
	_, err = f.s.Update(ctx, k, "default", "other", s2.DeepCopy(), Options{})
	wantReason(t, err, metav1.StatusReasonBadRequest)

	// Dry run stores nothing.
	rev = f.st.Revision()
	dry := s2.DeepCopy()
	dry.Spec.Replicas = ptr.To[int32](5)
	dry.ResourceVersion = ""
	obj, err = f.s.Update(ctx, k, "default", "web", dry, Options{DryRun: true})
	if err != nil {
		t.Fatalf("dry-run update: %v", err)
	}
	if *obj.(*appsv1.Deployment).Spec.Replicas != 5 || f.st.Revision() != rev {
		t.Errorf("dry-run update: replicas %d, store %d → %d", *obj.(*appsv1.Deployment).Spec.Replicas, rev, f.st.Revision())
	}
	if _, err := f.s.Create(ctx, kind(t, "", "v1", "configmaps"), "default", cm("dry", nil), Options{DryRun: true}); err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	if f.st.Revision() != rev {
		t.Errorf("dry-run create wrote")
	}
	_, err = f.s.Get(ctx, kind(t, "", "v1", "configmaps"), "default", "dry")
	wantReason(t, err, metav1.StatusReasonNotFound)
}

func TestApply(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	patch := []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ap\ndata:\n  a: one\n")
	obj, created, err := f.s.Apply(ctx, k, "default", "ap", patch, Options{FieldManager: "alice"})
	if err != nil || !created {
		t.Fatalf("apply create: created %v, %v", created, err)
	}
	if d := obj.(*corev1.ConfigMap).Data["a"]; d != "one" {
		t.Errorf("data %q", d)
	}
	other := []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ap\ndata:\n  a: two\n")
	_, _, err = f.s.Apply(ctx, k, "default", "ap", other, Options{FieldManager: "bob"})
	wantReason(t, err, metav1.StatusReasonConflict)
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.ErrStatus.Details == nil || len(se.ErrStatus.Details.Causes) == 0 ||
		se.ErrStatus.Details.Causes[0].Type != metav1.CauseTypeFieldManagerConflict {
		t.Errorf("conflict lacks FieldManagerConflict causes: %v", err)
	}
	obj, created, err = f.s.Apply(ctx, k, "default", "ap", other, Options{FieldManager: "bob", Force: true})
	if err != nil || created {
		t.Fatalf("forced apply: created %v, %v", created, err)
	}
	if d := obj.(*corev1.ConfigMap).Data["a"]; d != "two" {
		t.Errorf("forced apply data %q", d)
	}
	_, _, err = f.s.Apply(ctx, k, "default", "ap", other, Options{})
	wantReason(t, err, metav1.StatusReasonBadRequest)
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "a"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
}

func TestDeleteGracefulFinalizersBind(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "pods")
	created, err := f.s.Create(ctx, k, "default", pod("p"), Options{FieldManager: "kubectl"})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}}
	if err := f.s.Bind(ctx, "default", b, Options{FieldManager: "scheduler"}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	// As upstream, a binding sets the node and PodScheduled and leaves
	// managedFields alone.
	bound, err := f.s.Get(ctx, k, "default", "p")
	if err != nil {
		t.Fatal(err)
	}
	bp := bound.(*corev1.Pod)
	if bp.Spec.NodeName != "n1" || len(bp.Status.Conditions) != 1 || bp.Status.Conditions[0].Type != corev1.PodScheduled {
		t.Fatalf("bound pod: node %q, conditions %v", bp.Spec.NodeName, bp.Status.Conditions)
	}
	if d := cmp.Diff(created.(*corev1.Pod).ManagedFields, bp.ManagedFields); d != "" {
		t.Errorf("managedFields changed by the binding (-created +bound):\n%s", d)
	}
	err = f.s.Bind(ctx, "default", b, Options{})
	wantReason(t, err, metav1.StatusReasonConflict)

	obj, deleted, err := f.s.Delete(ctx, k, "default", "p", &metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](30)}, false)
	if err != nil || deleted {
		t.Fatalf("graceful delete: deleted %v, %v", deleted, err)
	}
	p := obj.(*corev1.Pod)
	if p.DeletionTimestamp == nil || p.DeletionGracePeriodSeconds == nil || *p.DeletionGracePeriodSeconds != 30 {
		t.Fatalf("graceful delete: %+v", p.ObjectMeta)
	}
	_, deleted, err = f.s.Delete(ctx, k, "default", "p", &metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, false)
	if err != nil || !deleted {
		t.Fatalf("delete grace 0: deleted %v, %v", deleted, err)
	}

	// Finalizers hold the object until removed by an update.
	ck := kind(t, "", "v1", "configmaps")
	c := cm("fin", nil)
	c.Finalizers = []string{"example.com/hold"}
	if _, err := f.s.Create(ctx, ck, "default", c, Options{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	obj, deleted, err = f.s.Delete(ctx, ck, "default", "fin", nil, false)
	if err != nil || deleted || obj.(*corev1.ConfigMap).DeletionTimestamp == nil {
		t.Fatalf("delete with finalizer: deleted %v, %v", deleted, err)
	}
	_, err = f.s.Create(ctx, ck, "default", cm("fin", nil), Options{})
	if wantReason(t, err, metav1.StatusReasonAlreadyExists); err != nil && !containsPrefix(err.Error(), "object is being deleted: ") {
		t.Errorf("AlreadyExists message %q", err.Error())
	}
	_, err = f.s.GuaranteedUpdate(ctx, ck, "default", "fin", Options{}, func(cur runtime.Object) (runtime.Object, error) {
		cur.(*corev1.ConfigMap).Finalizers = nil
		return cur, nil
	})
	if err != nil {
		t.Fatalf("remove finalizer: %v", err)
	}
	_, err = f.s.Get(ctx, ck, "default", "fin")
	wantReason(t, err, metav1.StatusReasonNotFound)

	// Preconditions.
	if _, err := f.s.Create(ctx, ck, "default", cm("pre", nil), Options{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	_, _, err = f.s.Delete(ctx, ck, "default", "pre", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: ptr.To("1")}}, false)
	wantReason(t, err, metav1.StatusReasonConflict)
	// Orphan adds the orphan finalizer.
	obj, deleted, err = f.s.Delete(ctx, ck, "default", "pre", &metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}, false)
	if err != nil || deleted || !cmp.Equal(obj.(*corev1.ConfigMap).Finalizers, []string{metav1.FinalizerOrphanDependents}) {
		t.Fatalf("orphan delete: deleted %v, %v", deleted, err)
	}
}

func containsPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatalf("watch closed")
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatalf("no watch event")
	}
	return watch.Event{}
}

func nextNonBookmark(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	for {
		if ev := next(t, w); ev.Type != watch.Bookmark {
			return ev
		}
	}
}

func TestWatch(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	a, err := f.s.Create(ctx, k, "default", cm("a", nil), Options{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	w, err := f.s.Watch(ctx, k, "default", WatchOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()
	ev := next(t, w)
	if ev.Type != watch.Added || ev.Object.(*corev1.ConfigMap).Name != "a" || ev.Object.GetObjectKind().GroupVersionKind().Kind != "ConfigMap" {
		t.Fatalf("synthetic event %v %#v", ev.Type, ev.Object)
	}
	// A no-op update emits nothing; a real one is MODIFIED.
	if _, err := f.s.Update(ctx, k, "default", "a", a.DeepCopyObject(), Options{}); err != nil {
		t.Fatalf("no-op update: %v", err)
	}
	b := a.DeepCopyObject().(*corev1.ConfigMap)
	b.Data = map[string]string{"k": "v"}
	if _, err := f.s.Update(ctx, k, "default", "a", b, Options{}); err != nil {
		t.Fatalf("update: %v", err)
	}
	if ev := next(t, w); ev.Type != watch.Modified || ev.Object.(*corev1.ConfigMap).Data["k"] != "v" {
		t.Fatalf("want MODIFIED, got %v", ev.Type)
	}
	_, _, err = f.s.Delete(ctx, k, "default", "a", nil, false)
	if err != nil {
		t.Fatalf("delete: %v", err)
	}
	del := next(t, w)
	if del.Type != watch.Deleted || rvOf(t, del.Object) != f.st.Revision() {
		t.Fatalf("want DELETED at %d, got %v %v", f.st.Revision(), del.Type, del.Object)
	}

	// Exact resume from the creation revision sees the later changes only.
	w2, err := f.s.Watch(ctx, k, "default", WatchOptions{ResourceVersion: strconv.FormatInt(rvOf(t, a), 10)})
	if err != nil {
		t.Fatalf("resume watch: %v", err)
	}
	defer w2.Stop()
	if ev := next(t, w2); ev.Type != watch.Modified {
		t.Fatalf("resume: want MODIFIED, got %v", ev.Type)
	}
	if ev := next(t, w2); ev.Type != watch.Deleted {
		t.Fatalf("resume: want DELETED, got %v", ev.Type)
	}

	// Future resourceVersion: 504 ResourceVersionTooLarge.
	_, err = f.s.Watch(ctx, k, "default", WatchOptions{ResourceVersion: strconv.FormatInt(f.st.Revision()+100, 10)})
	wantReason(t, err, metav1.StatusReasonTimeout)

	// Compacted: one ERROR event with 410 Expired, then the end.
	if _, err := f.s.Create(ctx, k, "default", cm("c", nil), Options{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := f.st.Compact(ctx, f.st.Revision()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	w3, err := f.s.Watch(ctx, k, "default", WatchOptions{ResourceVersion: "1"})
	if err != nil {
		t.Fatalf("watch compacted: %v", err)
	}
	ev = next(t, w3)
	st, ok := ev.Object.(*metav1.Status)
	if ev.Type != watch.Error || !ok || st.Code != 410 || st.Reason != metav1.StatusReasonExpired {
		t.Fatalf("compacted watch: %v %#v", ev.Type, ev.Object)
	}
	if _, ok := <-w3.ResultChan(); ok {
		t.Errorf("compacted watch did not end")
	}
}

func TestWatchSelectorsAndBookmarks(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	w, err := f.s.Watch(ctx, k, "default", WatchOptions{Label: labels.SelectorFromSet(labels.Set{"sel": "yes"}), AllowBookmarks: true})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()
	o, err := f.s.Create(ctx, k, "default", cm("s", nil), Options{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	in := o.DeepCopyObject().(*corev1.ConfigMap)
	in.Labels = map[string]string{"sel": "yes"}
	o, err = f.s.Update(ctx, k, "default", "s", in, Options{})
	if err != nil {
		t.Fatalf("update in: %v", err)
	}
	if ev := nextNonBookmark(t, w); ev.Type != watch.Added {
		t.Fatalf("into selection: %v", ev.Type)
	}
	out := o.DeepCopyObject().(*corev1.ConfigMap)
	out.Labels = nil
	if _, err := f.s.Update(ctx, k, "default", "s", out, Options{}); err != nil {
		t.Fatalf("update out: %v", err)
	}
	if ev := nextNonBookmark(t, w); ev.Type != watch.Deleted {
		t.Fatalf("out of selection: %v", ev.Type)
	}
	for {
		ev := next(t, w)
		if ev.Type == watch.Bookmark {
			if rv := rvOf(t, ev.Object); rv != f.st.Revision() {
				t.Errorf("bookmark rv %d, want %d", rv, f.st.Revision())
			}
			break
		}
	}
}

func TestListPaging(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	for i := range 5 {
		if _, err := f.s.Create(ctx, k, "default", cm("c"+strconv.Itoa(i), nil), Options{}); err != nil {
			t.Fatalf("create: %v", err)
		}
	}
	var names []string
	opts := ListOptions{Limit: 2}
	for {
		obj, err := f.s.List(ctx, k, "default", opts)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		l := obj.(*corev1.ConfigMapList)
		for _, it := range l.Items {
			names = append(names, it.Name)
		}
		if l.Continue == "" {
			break
		}
		if l.RemainingItemCount == nil || *l.RemainingItemCount <= 0 {
			t.Errorf("remainingItemCount = %v", l.RemainingItemCount)
		}
		opts.Continue = l.Continue
	}
	if diff := cmp.Diff([]string{"c0", "c1", "c2", "c3", "c4"}, names); diff != "" {
		t.Errorf("paged names (-want +got):\n%s", diff)
	}
	_, err := f.s.List(ctx, k, "default", ListOptions{ResourceVersion: strconv.FormatInt(f.st.Revision()+50, 10), ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	wantReason(t, err, metav1.StatusReasonTimeout)
	if err := f.st.Compact(ctx, f.st.Revision()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	_, err = f.s.List(ctx, k, "default", ListOptions{ResourceVersion: "1", ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	wantReason(t, err, metav1.StatusReasonExpired)
}

func TestStoredAsView(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	core := kind(t, "", "v1", "events")
	view := kind(t, "events.k8s.io", "v1", "events")
	w, err := f.s.Watch(ctx, core, "default", WatchOptions{})
	if err != nil {
		t.Fatalf("watch core events: %v", err)
	}
	defer w.Stop()
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: "e1"},
		EventTime:           metav1.NewMicroTime(time.Now()),
		Regarding:           corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p"},
		Reason:              "Started",
		Note:                "started",
		Type:                corev1.EventTypeNormal,
		Action:              "Start",
		ReportingController: "example.com/ctl",
		ReportingInstance:   "ctl-1",
	}
	if _, err := f.s.Create(ctx, view, "default", ev, Options{FieldManager: "ctl"}); err != nil {
		t.Fatalf("create view event: %v", err)
	}
	got := nextNonBookmark(t, w)
	ce, ok := got.Object.(*corev1.Event)
	if got.Type != watch.Added || !ok || ce.InvolvedObject.Name != "p" || ce.APIVersion != "v1" {
		t.Fatalf("core watch saw %v %#v", got.Type, got.Object)
	}
	back, err := f.s.Get(ctx, view, "default", "e1")
	if err != nil {
		t.Fatalf("get view event: %v", err)
	}
	if e := back.(*eventsv1.Event); e.Regarding.Name != "p" || e.APIVersion != "events.k8s.io/v1" {
		t.Errorf("view event %+v", e)
	}
}

func TestDeleteCollectionDryRun(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	for _, n := range []string{"x1", "x2"} {
		c := cm(n, nil)
		c.Labels = map[string]string{"grp": "x"}
		if _, err := f.s.Create(ctx, k, "default", c, Options{}); err != nil {
			t.Fatalf("create: %v", err)
		}
	}
	if _, err := f.s.Create(ctx, k, "default", cm("keep", nil), Options{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	rev := f.st.Revision()
	if _, _, err := f.s.Delete(ctx, k, "default", "x1", nil, true); err != nil {
		t.Fatalf("dry-run delete: %v", err)
	}
	if f.st.Revision() != rev {
		t.Errorf("dry-run delete wrote")
	}
	sel := labels.SelectorFromSet(labels.Set{"grp": "x"})
	out, err := f.s.DeleteCollection(ctx, k, "default", ListOptions{Label: sel}, nil, false)
	if err != nil {
		t.Fatalf("delete collection: %v", err)
	}
	if n := len(out.(*corev1.ConfigMapList).Items); n != 2 {
		t.Errorf("deleted %d objects, want 2", n)
	}
	left, err := f.s.List(ctx, k, "default", ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var names []string
	for _, it := range left.(*corev1.ConfigMapList).Items {
		names = append(names, it.Name)
	}
	if diff := cmp.Diff([]string{"keep"}, names); diff != "" {
		t.Errorf("left after delete collection (-want +got):\n%s", diff)
	}
}

// A binding hands the watches the pod it bound instead of decoding the
// stored state again: that pod must be what decoding the stored state
// gives, in both encodings clients read.
func TestBindWatchObjectIsStoredState(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "pods")
	p := pod("rich")
	p.Annotations = map[string]string{"note": "<tags> & ünïcode"}
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("0.1"), corev1.ResourceMemory: resource.MustParse("128Mi")}
	p.Spec.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](30)}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "no nodes", LastTransitionTime: metav1.NewTime(time.Unix(1700000000, 5))}}
	created, err := f.s.Create(ctx, k, "default", p, Options{FieldManager: "kubectl"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Create(ctx, k, "default", pod("plain"), Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Create(ctx, k, "default", pod("odd"), Options{}); err != nil {
		t.Fatal(err)
	}
	w, err := f.s.Watch(ctx, k, "default", WatchOptions{ResourceVersion: created.(*corev1.Pod).ResourceVersion, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for range 2 {
		nextNonBookmark(t, w) // the other creates
	}
	binds := []*corev1.Binding{
		{ObjectMeta: metav1.ObjectMeta{Name: "rich", Annotations: map[string]string{"by": "a <scheduler>"}}, Target: corev1.ObjectReference{Name: "n1"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Target: corev1.ObjectReference{Name: "n2"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "odd"}, Target: corev1.ObjectReference{Name: "n\xff3"}},
	}
	for _, b := range binds {
		if err := f.s.Bind(ctx, "default", b, Options{}); err != nil {
			t.Fatalf("bind %s: %v", b.Name, err)
		}
		ev := nextNonBookmark(t, w)
		got := ev.Object.(*corev1.Pod)
		o, err := f.st.Get(ctx, f.s.key(k, "default", b.Name))
		if err != nil {
			t.Fatal(err)
		}
		want, err := f.s.decode(k, o)
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.NodeName == "" || got.ResourceVersion != strconv.FormatInt(o.Revision, 10) {
			t.Fatalf("%s: watch event node %q at %s, stored at %d", b.Name, got.Spec.NodeName, got.ResourceVersion, o.Revision)
		}
		gj, _ := json.Marshal(got)
		wj, _ := json.Marshal(want)
		if string(gj) != string(wj) {
			t.Errorf("%s: JSON of the watch event's pod\n%s\nwant\n%s", b.Name, gj, wj)
		}
		gp, err1 := got.Marshal()
		wp, err2 := want.(*corev1.Pod).Marshal()
		if err1 != nil || err2 != nil || !bytes.Equal(gp, wp) {
			t.Errorf("%s: protobuf of the watch event's pod differs from the stored state's (%v, %v)", b.Name, err1, err2)
		}
	}
	c := &f.s.shared
	c.mu.Lock()
	n := len(c.pending)
	c.mu.Unlock()
	if n != 0 {
		t.Errorf("%d writes still expected after they returned", n)
	}
}
