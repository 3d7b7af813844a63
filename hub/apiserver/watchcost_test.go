package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestWatchGoroutines checks what a watch costs in goroutines: a fleet
// holds a few per node, so each is one goroutine on the server, its
// request's, with the storage's and the store's work done in it. The
// watches must still deliver, and leave nothing behind when they stop.
func TestWatchGoroutines(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	cms := h.cs.CoreV1().ConfigMaps("default")
	// One request first, so that the connection and its goroutines exist.
	list, err := cms.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	settle := func() int {
		time.Sleep(300 * time.Millisecond)
		return runtime.NumGoroutine()
	}
	// The server's goroutines are those running tether's code.
	serving := func() int {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		n := 0
		for _, g := range strings.Split(b.String(), "\n\n") {
			if strings.Contains(g, "tether/hub/") || strings.Contains(g, "tether/store/") {
				n++
			}
		}
		return n
	}
	before := settle()
	servingBefore := serving()
	const n = 200
	watches := make([]watch.Interface, n)
	for i := range watches {
		w, err := cms.Watch(ctx, metav1.ListOptions{FieldSelector: fmt.Sprintf("metadata.name=cm-%d", i), ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		watches[i] = w
	}
	held := settle()
	onServer := float64(serving()-servingBefore) / n
	t.Logf("%d goroutines before, %d with %d watches (%.2f per watch, the client's included); %.2f per watch on the server",
		before, held, n, float64(held-before)/n, onServer)
	if onServer > 1.1 {
		t.Errorf("%.2f goroutines per watch on the server, want 1 (the request's)", onServer)
	}
	for _, i := range []int{0, n - 1} {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-watches[i].ResultChan():
			if ev.Type != watch.Added || ev.Object.(*corev1.ConfigMap).Name != fmt.Sprintf("cm-%d", i) {
				t.Errorf("watch %d: %s %v", i, ev.Type, ev.Object)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("watch %d saw no event", i)
		}
	}
	for _, w := range watches {
		w.Stop()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		after := settle()
		if after <= before+5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the watches stopped, %d before", after, before)
		}
	}
}
