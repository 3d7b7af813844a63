package hub_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestInformersAcrossRestart writes 10,080 changes to objects of three kinds
// while client-go informers watch them, restarting the hub halfway. Every
// informer must see every change exactly once and in order, and after the
// restart the informers resume their watches from their last
// resourceVersion instead of listing again.
func TestInformersAcrossRestart(t *testing.T) {
	const (
		perKind   = 40
		perObject = 84 // 3 kinds × 40 objects × 84 writes = 10,080 writes
		ns        = "informers"
	)
	h := hubtest.Start(t, apiOnly...)
	// The informers' client counts the lists it sends; the hub's own
	// controllers list too, so the hub's metrics cannot tell them apart.
	var (
		lists      atomic.Int64
		restarted  atomic.Bool
		listsAfter atomic.Int64
	)
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			// A streaming list (a watch with sendInitialEvents) counts
			// as a list: it sends every object again.
			q := r.URL.Query()
			if r.Method == http.MethodGet && (q.Get("watch") == "" || q.Get("sendInitialEvents") == "true") && listPath.MatchString(r.URL.Path) {
				lists.Add(1)
				if restarted.Load() {
					listsAfter.Add(1)
				}
			}
			return rt.RoundTrip(r)
		})
	})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// What the informers saw: kind/name → the sequence numbers in order.
	var (
		mu   sync.Mutex
		seen = map[string][]int{}
	)
	record := func(kind string) cache.ResourceEventHandlerFuncs {
		add := func(obj any) {
			m := obj.(metav1.Object)
			seq, err := strconv.Atoi(m.GetAnnotations()["seq"])
			if err != nil {
				t.Errorf("%s %s without a seq annotation", kind, m.GetName())
				return
			}
			mu.Lock()
			seen[kind+"/"+m.GetName()] = append(seen[kind+"/"+m.GetName()], seq)
			mu.Unlock()
		}
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    add,
			UpdateFunc: func(_, obj any) { add(obj) },
			DeleteFunc: func(obj any) { t.Errorf("unexpected delete of %s %v", kind, obj) },
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	for kind, inf := range map[string]cache.SharedIndexInformer{
		"configmap": factory.Core().V1().ConfigMaps().Informer(),
		"secret":    factory.Core().V1().Secrets().Informer(),
		"lease":     factory.Coordination().V1().Leases().Informer(),
	} {
		if _, err := inf.AddEventHandler(record(kind)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	// Writers: one goroutine per object, writes held off while the hub
	// restarts so that no write is in flight across it.
	var (
		gate    sync.RWMutex
		written atomic.Int64
		wg      sync.WaitGroup
		client  atomic.Pointer[kubernetes.Clientset]
	)
	client.Store(clientFor(t, h))
	annotate := func(seq int) map[string]string { return map[string]string{"seq": strconv.Itoa(seq)} }
	write := func(kind, name string, seq int) error {
		c := client.Load()
		meta := metav1.ObjectMeta{Name: name, Annotations: annotate(seq)}
		var err error
		switch {
		case seq == 0 && kind == "configmap":
			_, err = c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta}, metav1.CreateOptions{})
		case seq == 0 && kind == "secret":
			_, err = c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: meta}, metav1.CreateOptions{})
		case seq == 0:
			_, err = c.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: meta}, metav1.CreateOptions{})
		default:
			patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"seq":"%d"}}}`, seq))
			switch kind {
			case "configmap":
				_, err = c.CoreV1().ConfigMaps(ns).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{})
			case "secret":
				_, err = c.CoreV1().Secrets(ns).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{})
			default:
				_, err = c.CoordinationV1().Leases(ns).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{})
			}
		}
		return err
	}
	for _, kind := range []string{"configmap", "secret", "lease"} {
		for i := range perKind {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := fmt.Sprintf("%s-%d", kind, i)
				for seq := 0; seq < perObject; seq++ {
					gate.RLock()
					err := write(kind, name, seq)
					gate.RUnlock()
					if err != nil {
						t.Errorf("write %s %s seq %d: %v", kind, name, seq, err)
						return
					}
					written.Add(1)
				}
			}()
		}
	}

	total := int64(3 * perKind * perObject)
	for written.Load() < total/2 {
		time.Sleep(10 * time.Millisecond)
	}
	gate.Lock()
	before := written.Load()
	restarted.Store(true)
	h.Stop()
	h.Restart()
	client.Store(clientFor(t, h))
	gate.Unlock()
	t.Logf("restarted the hub after %d of %d writes", before, total)
	wg.Wait()

	// Wait for the informers to catch up.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		mu.Lock()
		done := 0
		for _, s := range seen {
			if len(s) > 0 && s[len(s)-1] == perObject-1 {
				done++
			}
		}
		mu.Unlock()
		if done == 3*perKind {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("informers saw the last write of only %d of %d objects", done, 3*perKind)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	events := 0
	for key, s := range seen {
		events += len(s)
		for i, seq := range s {
			if seq != i {
				t.Errorf("%s: informer saw sequence %v, want 0..%d once each in order", key, s, perObject-1)
				break
			}
		}
	}
	mu.Unlock()
	if int64(events) != total {
		t.Errorf("informers saw %d events for %d writes", events, total)
	}

	// After the restart the informers resumed their watches: no list.
	if n := listsAfter.Load(); n != 0 {
		t.Errorf("informers sent %d lists after the hub restarted, want 0 (resume from resourceVersion)", n)
	}
	if n := lists.Load(); n == 0 {
		t.Error("the informers' lists were not seen at all; the request counter is broken")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

var listPath = regexp.MustCompile(`/(configmaps|secrets|leases)$`)

// TestInformerRelistsBelowWindow holds an informer's watch back across a hub
// restart while the change log is compacted past the informer's
// resourceVersion: the resumed watch must get 410 Expired, and the informer
// relists and converges on the current state.
func TestInformerRelistsBelowWindow(t *testing.T) {
	const ns = "default"
	h := hubtest.Start(t, append(apiOnly, "--change-log-retain=50", "--compact-interval=100ms")...)
	cs := clientFor(t, h)

	var (
		lists   atomic.Int32
		expired atomic.Int32
		gateMu  sync.Mutex
		gate    = make(chan struct{})
		current atomic.Pointer[kubernetes.Clientset]
	)
	close(gate) // open
	current.Store(cs)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			lists.Add(1)
			return current.Load().CoreV1().ConfigMaps(ns).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				// A streaming list: client-go's reflector lists this way
				// first, and falls back to List only if it fails.
				lists.Add(1)
			}
			gateMu.Lock()
			g := gate
			gateMu.Unlock()
			select {
			case <-g:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			w, err := current.Load().CoreV1().ConfigMaps(ns).Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			// Pass events through, counting 410 Expired errors.
			return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				if st, ok := ev.Object.(*metav1.Status); ev.Type == watch.Error && ok && st.Code == 410 {
					expired.Add(1)
				}
				return ev, true
			}), nil
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	if n := lists.Load(); n != 1 {
		t.Fatalf("%d lists before the test, want 1", n)
	}

	// A watch that ends within a second of starting makes the reflector
	// relist on its own; let it run past that first.
	time.Sleep(1500 * time.Millisecond)
	gateMu.Lock()
	gate = make(chan struct{}) // closed again below
	gateMu.Unlock()
	h.Stop()
	h.Restart("--change-log-retain=50", "--compact-interval=100ms")
	cs = clientFor(t, h)
	current.Store(cs)
	for i := range 200 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("late-%d", i)}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // several compaction rounds
	gateMu.Lock()
	close(gate)
	gateMu.Unlock()

	deadline := time.Now().Add(time.Minute)
	for len(inf.GetStore().ListKeys()) < 200 {
		if time.Now().After(deadline) {
			t.Fatalf("informer holds %d configmaps, want at least 200", len(inf.GetStore().ListKeys()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := expired.Load(); n == 0 {
		t.Error("the resumed watch got no 410 Expired")
	}
	if n := lists.Load(); n < 2 {
		t.Errorf("informer listed %d times: a resume below the window must end in 410 and a relist", n)
	}
}
