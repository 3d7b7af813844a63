package rbac

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// stored is an authorizer following a real storage over SQLite, whose
// admission includes the authorizer's escalation checks.
type stored struct {
	a   *Authorizer
	st  *storage.Storage
	ctx context.Context
}

func newStored(t *testing.T, namespaces ...string) *stored {
	t.Helper()
	db, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a := New(Config{Logger: quiet})
	st, err := storage.New(storage.Config{Store: db, Kinds: registry.All(), Logger: quiet, Admission: []storage.Admitter{a.Admitter()}})
	if err != nil {
		t.Fatal(err)
	}
	a.SetStorage(st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if !a.WaitSynced(wctx) {
		t.Fatal("authorizer did not sync")
	}
	s := &stored{a: a, st: st, ctx: ctx}
	for _, ns := range namespaces {
		s.create(t, nil, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	return s
}

func kindFor(t *testing.T, obj runtime.Object) *registry.Kind {
	t.Helper()
	switch obj.(type) {
	case *corev1.Namespace:
		return registry.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"})
	case *rbacv1.Role:
		return kindOf(resRoles)
	case *rbacv1.ClusterRole:
		return kindOf(resClusterRoles)
	case *rbacv1.RoleBinding:
		return kindOf(resRoleBindings)
	case *rbacv1.ClusterRoleBinding:
		return kindOf(resClusterRoleBindings)
	}
	t.Fatalf("no kind for %T", obj)
	return nil
}

// as returns a context carrying u; nil u is the hub's own writes.
func (s *stored) as(u *auth.User) context.Context {
	if u == nil {
		return s.ctx
	}
	return auth.WithUser(s.ctx, u)
}

func (s *stored) create(t *testing.T, u *auth.User, obj runtime.Object) {
	t.Helper()
	if _, err := s.tryCreate(t, u, obj); err != nil {
		t.Fatalf("create %T: %v", obj, err)
	}
}

func (s *stored) tryCreate(t *testing.T, u *auth.User, obj runtime.Object) (runtime.Object, error) {
	t.Helper()
	ns := ""
	if m, ok := obj.(metav1.Object); ok {
		ns = m.GetNamespace()
	}
	return s.st.Create(s.as(u), kindFor(t, obj), ns, obj.DeepCopyObject(), storage.Options{})
}

// eventually retries f for up to a second.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 1s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
