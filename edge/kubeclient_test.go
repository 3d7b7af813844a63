package edge

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge/kube"
)

// TestAPICallsShareOneStream checks that the agent's API client speaks
// HTTP/2 over the stream its dialer opens, so that its watches and calls
// share one tunnel stream, and that a server speaking HTTP/1.1 and HTTP/2
// as the hub's tunnel server does sees them so.
func TestAPICallsShareOneStream(t *testing.T) {
	var (
		mu     sync.Mutex
		protos = map[string]int{}
	)
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		protos[r.Proto]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			// Held open, as a watch is, until the test ends.
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		fmt.Fprint(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`)
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	defer close(release)

	var dials atomic.Int32
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, srv.Listener.Addr().String())
	}
	var counters apiCounters
	c, err := kube.New(restConfig(dial, "test", &counters))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		w, err := c.Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: fmt.Sprintf("spec.nodeName=n%d", i)})
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		defer w.Stop()
	}
	for range 5 {
		if _, err := c.Pods("default").List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatalf("list: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if protos["HTTP/2.0"] != 8 || len(protos) != 1 {
		t.Errorf("requests by protocol: %v, want 8 over HTTP/2.0", protos)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d streams dialed for three watches and five lists, want one", n)
	}
	if got := counters.watches.Load(); got != 3 {
		t.Errorf("%d watches counted, want 3", got)
	}
}
