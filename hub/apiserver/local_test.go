package apiserver

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
)

// denyUser forbids everything to one user name.
type denyUser string

func (d denyUser) Authorize(u *auth.User, a Attributes) error {
	if u.Name == string(d) {
		return apierrors.NewForbidden(schema.GroupResource{Group: a.Group, Resource: a.Kind}, a.Name, errors.New("denied"))
	}
	return nil
}

// client-go through LocalTransport: the same API, served in-process.
func TestLocalTransport(t *testing.T) {
	stg, quiet := newTestStorage(t)
	ctx := context.Background()
	s, err := New(Config{Storage: stg, Kinds: registry.All(), Authorizer: denyUser("mallory"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	client := func(name string) *kubernetes.Clientset {
		u := &auth.User{Name: name, Groups: []string{"system:authenticated"}}
		return kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://hub.invalid", Transport: s.LocalTransport(u)})
	}
	cs := client("controller")
	before := runtime.NumGoroutine()

	w, err := cs.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=c"})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Added || ev.Object.(*corev1.ConfigMap).ResourceVersion != cm.ResourceVersion {
			t.Fatalf("watch event %s %v", ev.Type, ev.Object)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event")
	}
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "c", metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v" {
		t.Fatalf("get: %v %v", got, err)
	}
	l, err := cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("list: %v %v", l, err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}
	if err := cs.CoreV1().ConfigMaps("default").Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client("mallory").CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list as a denied user: %v, want Forbidden", err)
	}
	// Stopping the watch ends its handler.
	w.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the watch stopped, %d before it started", runtime.NumGoroutine(), before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A request whose context ends before the answer returns at once.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := cs.CoreV1().ConfigMaps("default").List(cctx, metav1.ListOptions{}); err == nil {
		t.Fatal("list with a cancelled context succeeded")
	}
}
