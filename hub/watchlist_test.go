package hub_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"

	"github.com/tether-edge/tether/hub/hubtest"
)

// countingBody counts the bytes a response body delivers.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestInformerStreamsInitialList: a client-go informer (WatchListClient is
// on by default in client-go v0.37) fills its cache from one streaming
// watch against a real hub — no LIST, no refused request — and objects
// created while the initial events stream reach it exactly once. The
// hub's own controllers start their informers the same way, so the hub
// answers no watch with 422.
func TestInformerStreamsInitialList(t *testing.T) {
	const (
		ns      = "watchlist"
		before  = 1000
		during  = 200
		workers = 8
	)
	if !clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		t.Fatal("client-go feature WatchListClient is off; this test needs it on (KUBE_FEATURE_WatchListClient)")
	}
	h := hubtest.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	create := func(ctx context.Context, prefix string, n int) {
		workqueue.ParallelizeUntil(ctx, workers, n, func(i int) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", prefix, i)},
				Data: map[string]string{"key": strings.Repeat("v", 100)}}
			if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Errorf("create %s: %v", cm.Name, err)
			}
		})
	}
	created := time.Now()
	create(ctx, "before", before)
	t.Logf("created %d objects in %v", before, time.Since(created))

	// The informer's client records each request to the collection.
	var (
		mu       sync.Mutex
		requests []string
		bytes    atomic.Int64
	)
	icfg := *cfg
	icfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if !strings.HasSuffix(r.URL.Path, "/namespaces/"+ns+"/configmaps") {
				return rt.RoundTrip(r)
			}
			resp, err := rt.RoundTrip(r)
			code := 0
			if resp != nil {
				code = resp.StatusCode
				resp.Body = countingBody{ReadCloser: resp.Body, n: &bytes}
			}
			mu.Lock()
			requests = append(requests, fmt.Sprintf("%d %s", code, r.URL.RawQuery))
			mu.Unlock()
			return resp, err
		})
	})
	ics, err := kubernetes.NewForConfig(&icfg)
	if err != nil {
		t.Fatal(err)
	}
	var (
		addsMu sync.Mutex
		adds   = map[string]int{}
	)
	factory := informers.NewSharedInformerFactoryWithOptions(ics, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().ConfigMaps().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		// Only the test's objects: the hub publishes kube-root-ca.crt in
		// every namespace as well.
		AddFunc: func(obj any) {
			if name := obj.(*corev1.ConfigMap).Name; strings.HasPrefix(name, "before-") || strings.HasPrefix(name, "during-") {
				addsMu.Lock()
				adds[name]++
				addsMu.Unlock()
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	// Writes race with the initial stream.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		create(ctx, "during", during)
	}()
	start := time.Now()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	synced := time.Since(start)
	mu.Lock()
	syncBytes := bytes.Load()
	mu.Unlock()
	wg.Wait()
	for {
		addsMu.Lock()
		n := len(adds)
		addsMu.Unlock()
		if n == before+during {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("informer has %d objects, want %d", n, before+during)
		}
		time.Sleep(20 * time.Millisecond)
	}
	addsMu.Lock()
	for name, n := range adds {
		if n != 1 {
			t.Errorf("%s added %d times", name, n)
		}
	}
	addsMu.Unlock()
	mu.Lock()
	got := append([]string(nil), requests...)
	mu.Unlock()
	if len(got) != 1 || !strings.HasPrefix(got[0], "200 ") || !strings.Contains(got[0], "sendInitialEvents=true") {
		t.Fatalf("informer requests %q, want one streaming watch", got)
	}
	t.Logf("informer start with %d objects: %d request(s), %d bytes until synced, %v", before, len(got), syncBytes, synced)

	metrics, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(line, "apiserver_request_total") && strings.Contains(line, `code="422"`) &&
			strings.Contains(strings.ToLower(line), `verb="watch"`) {
			t.Errorf("hub refused watches: %s", line)
		}
	}
}
