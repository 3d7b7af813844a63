package peers

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// TestPresence runs two directories on one storage: each sees the other
// live with its addresses, learns the nodes the other holds and forgets
// them when it stops (its presence is deleted).
func TestPresence(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sq, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	stg, err := storage.New(storage.Config{Store: sq, Kinds: registry.All(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	nsKind := registry.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"})
	if _, err := stg.Create(t.Context(), nsKind, "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, storage.Options{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var vouched map[string]time.Time
	a, err := New(Config{Storage: stg, ID: "a", EdgeAddress: "10.0.0.1:6443", APIAddress: "10.0.0.1:6443",
		Held: func() []string { return nil }, Renew: 200 * time.Millisecond, Duration: 3 * time.Second, Logger: quiet,
		OnVouched: func(v map[string]time.Time) { mu.Lock(); vouched = v; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Storage: stg, ID: "b", EdgeAddress: "10.0.0.2:6443", APIAddress: "10.0.0.2:7443",
		Held: func() []string { return []string{"n1", "n2"} }, Renew: 200 * time.Millisecond, Duration: 3 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	go a.Run(ctxA)
	ctxB, stopB := context.WithCancel(context.Background())
	doneB := make(chan struct{})
	go func() { b.Run(ctxB); close(doneB) }()

	wait := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 10s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("two live hubs", func() bool { return len(a.Live()) == 2 })
	live := a.Live()
	if live[1].ID != "b" || live[1].EdgeAddress != "10.0.0.2:6443" || live[1].APIAddress != "10.0.0.2:7443" || !slices.Equal(live[1].Nodes, []string{"n1", "n2"}) {
		t.Fatalf("b as a sees it: %+v", live[1])
	}
	wait("b's nodes vouched for", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(vouched) == 2 && time.Until(vouched["n1"]) > 0
	})
	if addr, ok := a.holder("n2"); !ok || addr != "10.0.0.2:7443" {
		t.Fatalf("holder of n2: %q %v", addr, ok)
	}
	if _, ok := b.holder("n2"); ok {
		t.Fatal("b asks another hub for its own node")
	}
	stopB()
	<-doneB
	wait("b gone", func() bool { return len(a.Live()) == 1 })
	wait("b's nodes no longer vouched for", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(vouched) == 0
	})
}
