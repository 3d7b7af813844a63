package apiextensions

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// simpleKinds builds a definition's kinds with no schema: enough for the
// controller, which only registers them.
func simpleKinds(crd *apiextensionsv1.CustomResourceDefinition) ([]*registry.Kind, error) {
	var out []*registry.Kind
	for _, v := range crd.Spec.Versions {
		out = append(out, &registry.Kind{
			GVK:      schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind},
			Resource: crd.Spec.Names.Plural, Singular: crd.Spec.Names.Singular,
			Namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped, HasStatus: true,
			New:           func() runtime.Object { return &unstructured.Unstructured{} },
			TypeConverter: managedfields.NewDeducedTypeConverter(), NoProtobuf: true,
		})
	}
	return out, nil
}

type fixture struct {
	st   *storage.Storage
	reg  *registry.Registry
	crd  *registry.Kind
	path string
}

func newFixture(t *testing.T, path string) *fixture {
	t.Helper()
	db, err := sqlite.Open(sqlite.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	reg, err := registry.New(registry.Config{Extra: Kinds()})
	if err != nil {
		t.Fatal(err)
	}
	st, err := storage.New(storage.Config{Store: db, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Bootstrap(context.Background(), storage.BootstrapConfig{AdvertiseAddress: "192.0.2.10", Port: 6443}); err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, reg: reg, crd: reg.Lookup(gvrCRD), path: path}
}

// start runs a controller until the test ends and waits until it has
// handled what is stored.
func (f *fixture) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := New(Config{Storage: f.st, Registry: f.reg, Kinds: simpleKinds})
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if !c.WaitSynced(wctx) {
		t.Fatal("controller not synced")
	}
}

func (f *fixture) get(t *testing.T, name string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	obj, err := f.st.Get(context.Background(), f.crd, "", name)
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*apiextensionsv1.CustomResourceDefinition)
}

// within polls cond until it holds or d passes.
func within(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

var widgetsGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

func TestControllerEstablishesWithinASecond(t *testing.T) {
	f := newFixture(t, filepath.Join(t.TempDir(), "db"))
	f.start(t)
	if _, err := f.st.Create(context.Background(), f.crd, "", widgetCRD(), storage.Options{}); err != nil {
		t.Fatal(err)
	}
	if !within(time.Second, func() bool {
		return apihelpers.IsCRDConditionTrue(f.get(t, "widgets.example.com"), apiextensionsv1.Established)
	}) {
		t.Fatalf("not Established within 1s: %+v", f.get(t, "widgets.example.com").Status)
	}
	crd := f.get(t, "widgets.example.com")
	if !apihelpers.IsCRDConditionTrue(crd, apiextensionsv1.NamesAccepted) || crd.Status.AcceptedNames.Plural != "widgets" {
		t.Errorf("status %+v", crd.Status)
	}
	if f.reg.Lookup(widgetsGVR) == nil {
		t.Error("widgets not registered")
	}
}

func TestControllerRefusesConflictingNames(t *testing.T) {
	f := newFixture(t, filepath.Join(t.TempDir(), "db"))
	f.start(t)
	ctx := context.Background()
	if _, err := f.st.Create(ctx, f.crd, "", widgetCRD(), storage.Options{}); err != nil {
		t.Fatal(err)
	}
	other := widgetCRD()
	other.Name, other.Spec.Names.Plural, other.Spec.Names.Singular, other.Spec.Names.ListKind = "gadgets.example.com", "gadgets", "gadget", "GadgetList"
	if _, err := f.st.Create(ctx, f.crd, "", other, storage.Options{}); err != nil {
		t.Fatal(err)
	}
	if !within(time.Second, func() bool {
		return apihelpers.IsCRDConditionFalse(f.get(t, "gadgets.example.com"), apiextensionsv1.NamesAccepted)
	}) {
		t.Fatalf("names accepted: %+v", f.get(t, "gadgets.example.com").Status)
	}
	c := apihelpers.FindCRDCondition(f.get(t, "gadgets.example.com"), apiextensionsv1.NamesAccepted)
	if c.Reason != "KindConflict" || c.Message != `"Widget" is already in use` {
		t.Errorf("NamesAccepted %s: %s", c.Reason, c.Message)
	}
	if f.reg.Lookup(widgetsGVR.GroupVersion().WithResource("gadgets")) != nil {
		t.Error("gadgets registered despite the conflict")
	}
}

func TestControllerServesStoredDefinitionsOnStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	f := newFixture(t, path)
	if _, err := f.st.Create(context.Background(), f.crd, "", widgetCRD(), storage.Options{}); err != nil {
		t.Fatal(err)
	}
	f.start(t) // WaitSynced: served before it returns
	if f.reg.Lookup(widgetsGVR) == nil {
		t.Fatal("stored definition not served once synced")
	}
}

func TestControllerRemovesObjectsOnDeletion(t *testing.T) {
	f := newFixture(t, filepath.Join(t.TempDir(), "db"))
	f.start(t)
	ctx := context.Background()
	if _, err := f.st.Create(ctx, f.crd, "", widgetCRD(), storage.Options{}); err != nil {
		t.Fatal(err)
	}
	if !within(time.Second, func() bool { return f.reg.Lookup(widgetsGVR) != nil }) {
		t.Fatal("not served")
	}
	k := f.reg.Lookup(widgetsGVR)
	mk := func(ns, name string, fins ...string) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(k.GVK)
		u.SetNamespace(ns)
		u.SetName(name)
		u.SetFinalizers(fins)
		if _, err := f.st.Create(ctx, k, ns, u, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("default", "a")
	mk("kube-system", "b")
	mk("default", "held", "example.com/hold")
	if _, _, err := f.st.Delete(ctx, f.crd, "", "widgets.example.com", nil, false); err != nil {
		t.Fatal(err)
	}
	if !within(2*time.Second, func() bool {
		return apihelpers.IsCRDConditionTrue(f.get(t, "widgets.example.com"), apiextensionsv1.Terminating)
	}) {
		t.Fatal("not Terminating")
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(k.GVK)
	u.SetName("late")
	if _, err := f.st.Create(ctx, f.reg.Lookup(widgetsGVR), "default", u, storage.Options{}); !apierrors.IsForbidden(err) {
		t.Errorf("create while terminating: %v, want Forbidden", err)
	}
	left := func() int {
		l, err := f.st.List(ctx, f.reg.Lookup(widgetsGVR), "", storage.ListOptions{})
		if err != nil {
			return -1
		}
		return len(l.(*unstructured.UnstructuredList).Items)
	}
	if !within(2*time.Second, func() bool { return left() == 1 }) {
		t.Fatalf("%d objects left, want the held one", left())
	}
	time.Sleep(300 * time.Millisecond)
	if f.reg.Lookup(widgetsGVR) == nil {
		t.Fatal("unserved while an object is held")
	}
	_, err := f.st.GuaranteedUpdate(ctx, f.reg.Lookup(widgetsGVR), "default", "held", storage.Options{}, func(cur runtime.Object) (runtime.Object, error) {
		cur.(*unstructured.Unstructured).SetFinalizers(nil)
		return cur, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !within(2*time.Second, func() bool {
		_, err := f.st.Get(ctx, f.crd, "", "widgets.example.com")
		return apierrors.IsNotFound(err)
	}) {
		t.Fatalf("definition not deleted: %+v", f.get(t, "widgets.example.com"))
	}
	if f.reg.Lookup(widgetsGVR) != nil {
		t.Error("still served after deletion")
	}
}
