package scheduler

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// TestEventsBoundWrites: a burst of events is recorded without waiting
// and written at the upstream scheduler's event rate (burst 100, then 50
// a second); what does not fit the broadcaster's queue is dropped, so a
// burst of bindings does not become as many event writes.
func TestEventsBoundWrites(t *testing.T) {
	var creates atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "unexpected", http.StatusMethodNotAllowed)
			return
		}
		creates.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.Copy(w, r.Body)
	}))
	defer srv.Close()
	ev, err := newEvents(&rest.Config{Host: srv.URL}, "default-scheduler", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ev.start(ctx)

	const burst = 3000
	start := time.Now()
	for i := range burst {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint("p", i), UID: types.UID(fmt.Sprint(i))}}
		ev.Event(pod, corev1.EventTypeNormal, "Scheduled", "Successfully assigned")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("recording %d events took %v; recording must not wait for writes", burst, d)
	}
	time.Sleep(time.Second)
	n := creates.Load()
	elapsed := time.Since(start).Seconds()
	if max := eventBurst + eventQPS*elapsed + 4; float64(n) > max {
		t.Errorf("%d events written in %.2fs, want at most %.0f", n, elapsed, max)
	}
	if n < eventBurst {
		t.Errorf("%d events written in %.2fs, want the burst of %d at once", n, elapsed, eventBurst)
	}
}
