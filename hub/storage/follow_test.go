package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/registry"
)

// recorder is a Follower keeping config maps by name, and a log of what
// it was told.
type recorder struct {
	mu       sync.Mutex
	view     map[string]string // name -> data["v"]
	log      []string
	replaces int
	calls    atomic.Int64
}

func (r *recorder) Replace(list runtime.Object) error {
	r.calls.Add(1)
	l := list.(*corev1.ConfigMapList)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.view = map[string]string{}
	var names []string
	for _, c := range l.Items {
		r.view[c.Name] = c.Data["v"]
		names = append(names, c.Name)
	}
	r.replaces++
	r.log = append(r.log, "replace "+strings.Join(names, ","))
	return nil
}

func (r *recorder) Apply(ev watch.EventType, obj runtime.Object) {
	r.calls.Add(1)
	c := obj.(*corev1.ConfigMap)
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev == watch.Deleted {
		delete(r.view, c.Name)
	} else {
		r.view[c.Name] = c.Data["v"]
	}
	r.log = append(r.log, string(ev)+" "+c.Name+"="+c.Data["v"])
}

// waitFor waits until cond holds of the recorder.
func (r *recorder) waitFor(t *testing.T, what string, cond func(r *recorder) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		ok := cond(r)
		log := slices.Clone(r.log)
		r.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen; follower was told %q", what, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// faultyAPI is a Storage whose lists can be made to fail and whose
// watches can be ended, counting the lists.
type faultyAPI struct {
	API
	lists atomic.Int64

	mu          sync.Mutex
	down        bool
	watches     []watch.Interface
	beforeWatch func() // run once, before the next watch starts
}

func (a *faultyAPI) List(ctx context.Context, k *registry.Kind, ns string, opts ListOptions) (runtime.Object, error) {
	a.lists.Add(1)
	a.mu.Lock()
	down := a.down
	a.mu.Unlock()
	if down {
		return nil, errors.New("store unreachable")
	}
	return a.API.List(ctx, k, ns, opts)
}

func (a *faultyAPI) Watch(ctx context.Context, k *registry.Kind, ns string, opts WatchOptions) (watch.Interface, error) {
	a.mu.Lock()
	before := a.beforeWatch
	a.beforeWatch = nil
	a.mu.Unlock()
	if before != nil {
		before()
	}
	w, err := a.API.Watch(ctx, k, ns, opts)
	if err == nil {
		a.mu.Lock()
		a.watches = append(a.watches, w)
		a.mu.Unlock()
	}
	return w, err
}

// setDown makes lists fail, or work again, and ends the open watches.
func (a *faultyAPI) setDown(down bool) {
	a.mu.Lock()
	a.down = down
	ws := a.watches
	a.watches = nil
	a.mu.Unlock()
	for _, w := range ws {
		w.Stop()
	}
}

// levels is a slog handler counting records at Warn and above.
type levels struct{ warns atomic.Int64 }

func (h *levels) Enabled(context.Context, slog.Level) bool { return true }
func (h *levels) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warns.Add(1)
	}
	return nil
}
func (h *levels) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levels) WithGroup(string) slog.Handler      { return h }

// startFollow runs Follow of the config maps of namespace default until
// the test ends; it returns a channel closed when Follow has returned.
func startFollow(t *testing.T, ctx context.Context, api API, opts FollowOptions, r *recorder) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Follow(ctx, api, kind(t, "", "v1", "configmaps"), "default", opts, r)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return done
}

func labelled(name, v string, l map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}, Data: map[string]string{"v": v}}
}

func TestFollowSnapshotThenEvents(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	sel := map[string]string{"app": "x"}
	for _, c := range []*corev1.ConfigMap{labelled("a", "1", sel), labelled("b", "1", sel), labelled("other", "1", nil)} {
		if _, err := f.s.Create(ctx, k, "default", c, Options{}); err != nil {
			t.Fatalf("create %s: %v", c.Name, err)
		}
	}
	r := &recorder{}
	synced := make(chan struct{})
	var replacesAtSync int
	startFollow(t, ctx, f.s, FollowOptions{Label: labels.SelectorFromSet(sel), Synced: func() {
		r.mu.Lock()
		replacesAtSync = r.replaces
		r.mu.Unlock()
		close(synced)
	}}, r)
	select {
	case <-synced:
	case <-time.After(10 * time.Second):
		t.Fatal("not synced")
	}
	if replacesAtSync != 1 {
		t.Fatalf("synced after %d replaces, want 1", replacesAtSync)
	}
	if _, err := f.s.Create(ctx, k, "default", labelled("c", "1", sel), Options{}); err != nil {
		t.Fatalf("create c: %v", err)
	}
	if _, err := f.s.Create(ctx, k, "default", labelled("unselected", "1", nil), Options{}); err != nil {
		t.Fatalf("create unselected: %v", err)
	}
	if _, err := f.s.GuaranteedUpdate(ctx, k, "default", "a", Options{}, func(cur runtime.Object) (runtime.Object, error) {
		cur.(*corev1.ConfigMap).Data["v"] = "2"
		return cur, nil
	}); err != nil {
		t.Fatalf("update a: %v", err)
	}
	if _, _, err := f.s.Delete(ctx, k, "default", "b", nil, false); err != nil {
		t.Fatalf("delete b: %v", err)
	}
	want := []string{"replace a,b", "ADDED c=1", "MODIFIED a=2", "DELETED b=1"}
	r.waitFor(t, "the changes", func(r *recorder) bool { return len(r.log) >= len(want) })
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Equal(r.log, want) {
		t.Fatalf("follower was told %q, want %q", r.log, want)
	}
}

func TestFollowRelistSeesDeletionWhileDown(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	for _, name := range []string{"a", "b"} {
		if _, err := f.s.Create(ctx, k, "default", labelled(name, "1", nil), Options{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	api := &faultyAPI{API: f.s}
	r := &recorder{}
	startFollow(t, ctx, api, FollowOptions{Logger: slog.New(slog.DiscardHandler)}, r)
	r.waitFor(t, "first list", func(r *recorder) bool { return r.replaces == 1 && len(r.view) == 2 })

	// The watch ends and the store cannot be listed for a while, during
	// which b is deleted: no event tells of it.
	api.setDown(true)
	lists := api.lists.Load()
	deadline := time.Now().Add(10 * time.Second)
	for api.lists.Load() < lists+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, err := f.s.Delete(ctx, k, "default", "b", nil, false); err != nil {
		t.Fatalf("delete b: %v", err)
	}
	api.setDown(false)
	r.waitFor(t, "b gone after the relist", func(r *recorder) bool {
		_, hasB := r.view["b"]
		return r.replaces >= 2 && !hasB && r.view["a"] == "1"
	})
	// And the new watch goes on.
	if _, err := f.s.Create(ctx, k, "default", labelled("c", "1", nil), Options{}); err != nil {
		t.Fatalf("create c: %v", err)
	}
	r.waitFor(t, "c after the relist", func(r *recorder) bool { return r.view["c"] == "1" })
}

func TestFollowCompactedRevisionRelists(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	if _, err := f.s.Create(ctx, k, "default", labelled("a", "1", nil), Options{}); err != nil {
		t.Fatalf("create a: %v", err)
	}
	// Between the first list and its watch, c is written and the
	// store's history compacted past the list's revision.
	api := &faultyAPI{API: f.s, beforeWatch: func() {
		if _, err := f.s.Create(ctx, k, "default", labelled("c", "1", nil), Options{}); err != nil {
			t.Errorf("create c: %v", err)
		}
		if err := f.st.Compact(ctx, f.st.Revision()); err != nil {
			t.Errorf("compact: %v", err)
		}
	}}
	h := &levels{}
	r := &recorder{}
	startFollow(t, ctx, api, FollowOptions{Logger: slog.New(h)}, r)
	r.waitFor(t, "relist after 410", func(r *recorder) bool { return r.replaces == 2 && r.view["c"] == "1" })
	r.mu.Lock()
	log := slices.Clone(r.log)
	r.mu.Unlock()
	if want := []string{"replace a", "replace a,c"}; !slices.Equal(log, want) {
		t.Fatalf("follower was told %q, want %q", log, want)
	}
	// Listed again at once, as a matter of course: no failure reported.
	if n := h.warns.Load(); n != 0 {
		t.Fatalf("%d warnings for a compacted revision, want none", n)
	}
}

func TestFollowCancel(t *testing.T) {
	f := newFixture(t)
	r := &recorder{}
	for _, down := range []bool{false, true} {
		t.Run(fmt.Sprintf("down=%v", down), func(t *testing.T) {
			api := &faultyAPI{API: f.s, down: down}
			ctx, cancel := context.WithCancel(context.Background())
			done := startFollow(t, ctx, api, FollowOptions{Logger: slog.New(slog.DiscardHandler)}, r)
			if down {
				// In its pause after a failed list.
				for api.lists.Load() < 1 {
					time.Sleep(10 * time.Millisecond)
				}
			} else {
				r.waitFor(t, "first list", func(r *recorder) bool { return r.replaces >= 1 })
			}
			time.Sleep(50 * time.Millisecond)
			cancel()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Fatal("Follow did not return after its context ended")
			}
			calls := r.calls.Load()
			if _, err := f.s.Create(context.Background(), kind(t, "", "v1", "configmaps"), "default",
				labelled(fmt.Sprintf("after-%v", down), "1", nil), Options{}); err != nil {
				t.Fatalf("create: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			if n := r.calls.Load(); n != calls {
				t.Fatalf("follower called %d times after Follow returned", n-calls)
			}
		})
	}
}

func TestFollowBacksOffWhenStoreFails(t *testing.T) {
	f := newFixture(t)
	api := &faultyAPI{API: f.s}
	r := &recorder{}
	startFollow(t, context.Background(), api, FollowOptions{Logger: slog.New(slog.DiscardHandler)}, r)
	r.waitFor(t, "first list", func(r *recorder) bool { return r.replaces == 1 })
	// The store itself goes away: lists and watches fail from now on.
	start := api.lists.Load()
	if err := f.st.Close(); err != nil {
		t.Fatalf("close store: %v", err)
	}
	const window = 3 * time.Second
	time.Sleep(window)
	// Pauses of at least 50, 100, 200, 400, 800 and 1600 ms fill three
	// seconds with at most seven lists; a loop without them makes
	// thousands.
	if n := api.lists.Load() - start; n > 8 || n < 2 {
		t.Fatalf("%d lists in %v of a failing store, want 2 to 8", n, window)
	}
}
