package localstate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/state"
)

// fakeHub answers a kept informer's lists and watches: each watch takes
// the next of watches, each list calls list.
type fakeHub struct {
	watches chan hubWatch
	list    func() (runtime.Object, error)

	mu       sync.Mutex
	lists    int
	watchRVs []string
}

type hubWatch struct {
	w   watch.Interface
	err error
}

func newFakeHub() *fakeHub { return &fakeHub{watches: make(chan hubWatch, 4)} }

func (h *fakeHub) listFunc(context.Context, metav1.ListOptions) (runtime.Object, error) {
	h.mu.Lock()
	h.lists++
	h.mu.Unlock()
	if h.list == nil {
		return nil, errors.New("no list")
	}
	return h.list()
}

func (h *fakeHub) watchFunc(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	select {
	case r := <-h.watches:
		h.mu.Lock()
		h.watchRVs = append(h.watchRVs, opts.ResourceVersion)
		h.mu.Unlock()
		return r.w, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// events sends evs on a watch that stays open after them.
func (h *fakeHub) events(evs ...watch.Event) {
	w := watch.NewFakeWithChanSize(len(evs), false)
	for _, ev := range evs {
		w.Action(ev.Type, ev.Object)
	}
	h.watches <- hubWatch{w: w}
}

func (h *fakeHub) counts() (int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lists, slices.Clone(h.watchRVs)
}

// recorder is a handler that writes down what it hears.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
}

func (r *recorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func (r *recorder) handler() cache.ResourceEventHandler {
	name := func(obj any) string { return obj.(metav1.Object).GetName() }
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if initial {
				r.add("load " + name(obj))
				return
			}
			r.add("add " + name(obj))
		},
		UpdateFunc: func(_, obj any) { r.add("update " + name(obj)) },
		DeleteFunc: func(obj any) { r.add("delete " + name(obj)) },
	}
}

// waitFor waits until the recorder heard n events.
func (r *recorder) waitFor(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := r.events()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("heard %v, want %d events", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func openState(t *testing.T, opts Options) *State {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "state.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func configMap(name, rv string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: name, UID: types.UID("uid-" + name), ResourceVersion: rv,
	}}
}

// seed writes objs of kind and the watch's resourceVersion.
func seed(t *testing.T, s *State, kind, watchName, rv string, objs ...protoObject) {
	t.Helper()
	var ops []state.Op
	for _, o := range objs {
		b, err := o.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, state.Op{Key: state.Key{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName(), UID: string(o.GetUID())}, Value: b})
	}
	if err := s.DB().Commit(ops, map[string]string{watchName: rv}); err != nil {
		t.Fatal(err)
	}
}

// stored returns name@resourceVersion of the objects of kind in s, and
// marks tombstones.
func stored(t *testing.T, s *State, kind string) []string {
	t.Helper()
	rows, err := s.DB().List(kind, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		cm := &corev1.ConfigMap{}
		if err := cm.Unmarshal(r.Value); err != nil {
			t.Fatal(err)
		}
		e := r.Name + "@" + cm.ResourceVersion
		if r.Gone {
			e += " gone"
		}
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

func watchRV(t *testing.T, s *State, name string) string {
	t.Helper()
	rv, err := s.DB().Watch(name)
	if err != nil {
		t.Fatal(err)
	}
	return rv
}

func run(t *testing.T, c cache.Controller) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunWithContext(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestInformerStartsFromLocalStateAndResumes(t *testing.T) {
	s := openState(t, Options{})
	seed(t, s, "configmaps", "configmaps", "10", configMap("a", "7"), configMap("b", "10"))
	hub := newFakeHub()
	var loaded []any
	rec := &recorder{}
	spec := Spec{State: s, Kind: "configmaps", Watch: "configmaps", OnLoad: func(objs []any) { loaded = objs }}
	store, c := NewInformer(spec, hub.listFunc, hub.watchFunc, &corev1.ConfigMap{}, rec.handler())

	// Before it runs: the store holds what was kept and counts as
	// synced, at the stored resourceVersion.
	if keys := store.ListKeys(); len(keys) != 2 || len(loaded) != 2 {
		t.Fatalf("store %v, loaded %d objects; want both kept ConfigMaps", keys, len(loaded))
	}
	if !c.HasSynced() || c.LastSyncResourceVersion() != "10" {
		t.Fatalf("synced %v at %q; want synced at 10", c.HasSynced(), c.LastSyncResourceVersion())
	}

	hub.events(watch.Event{Type: watch.Added, Object: configMap("c", "11")})
	run(t, c)
	got := rec.waitFor(t, 3)
	if initial := slices.Sorted(slices.Values(got[:2])); !slices.Equal(initial, []string{"load a", "load b"}) || got[2] != "add c" {
		t.Fatalf("handler heard %v; want the kept objects first, then the watch's", got)
	}
	lists, rvs := hub.counts()
	if lists != 0 || len(rvs) != 1 || rvs[0] != "10" {
		t.Fatalf("%d lists, watches from %q; want no list and a watch from 10", lists, rvs)
	}
	if got, want := stored(t, s, "configmaps"), []string{"a@7", "b@10", "c@11"}; !slices.Equal(got, want) {
		t.Errorf("local state holds %v, want %v", got, want)
	}
	if rv := watchRV(t, s, "configmaps"); rv != "11" {
		t.Errorf("stored resourceVersion %q, want 11", rv)
	}
}

func TestInformerWritesBeforeHandlersHear(t *testing.T) {
	rec := &recorder{}
	var mu sync.Mutex
	var problems []string
	var s *State
	s = openState(t, Options{AfterPersist: func(kind string, ev watch.EventType, obj metav1.Object) {
		rows, err := s.DB().List(kind, obj.GetNamespace(), obj.GetName())
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		case ev == watch.Deleted && len(rows) != 0:
			problems = append(problems, fmt.Sprintf("%s %s: still stored", ev, obj.GetName()))
		case ev != watch.Deleted && len(rows) != 1:
			problems = append(problems, fmt.Sprintf("%s %s: not stored", ev, obj.GetName()))
		}
		if n := len(rec.events()); n != expectHeard(ev) {
			problems = append(problems, fmt.Sprintf("%s %s: handler already heard %d events", ev, obj.GetName(), n))
		}
	}})
	seed(t, s, "configmaps", "configmaps", "1")
	hub := newFakeHub()
	_, c := NewInformer(Spec{State: s, Kind: "configmaps", Watch: "configmaps"}, hub.listFunc, hub.watchFunc, &corev1.ConfigMap{}, rec.handler())
	hub.events(
		watch.Event{Type: watch.Added, Object: configMap("a", "2")},
		watch.Event{Type: watch.Modified, Object: configMap("a", "3")},
		watch.Event{Type: watch.Deleted, Object: configMap("a", "4")},
	)
	run(t, c)
	if got := rec.waitFor(t, 3); !slices.Equal(got, []string{"add a", "update a", "delete a"}) {
		t.Fatalf("handler heard %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
}

// expectHeard is how many events the handler of
// TestInformerWritesBeforeHandlersHear heard before ev was written.
func expectHeard(ev watch.EventType) int {
	switch ev {
	case watch.Added:
		return 0
	case watch.Modified:
		return 1
	default:
		return 2
	}
}

func TestInformerRelistsOnGone(t *testing.T) {
	s := openState(t, Options{})
	seed(t, s, "configmaps", "configmaps", "7", configMap("a", "5"), configMap("b", "6"), configMap("c", "7"))
	hub := newFakeHub()
	hub.list = func() (runtime.Object, error) {
		return &corev1.ConfigMapList{
			ListMeta: metav1.ListMeta{ResourceVersion: "9"},
			Items:    []corev1.ConfigMap{*configMap("b", "6"), *configMap("c", "9"), *configMap("d", "8")},
		}, nil
	}
	rec := &recorder{}
	_, c := NewInformer(Spec{State: s, Kind: "configmaps", Watch: "configmaps"}, hub.listFunc, hub.watchFunc, &corev1.ConfigMap{}, rec.handler())
	hub.watches <- hubWatch{err: apierrors.NewResourceExpired("too old resource version: 7 (8)")}
	hub.events() // the watch after the list
	run(t, c)
	got := rec.waitFor(t, 6)
	if initial := slices.Sorted(slices.Values(got[:3])); !slices.Equal(initial, []string{"load a", "load b", "load c"}) {
		t.Fatalf("handler heard %v first; want the kept objects", got)
	}
	// b is unchanged: its pod (if it were one) keeps running untouched.
	if changes := slices.Sorted(slices.Values(got[3:])); !slices.Equal(changes, []string{"add d", "delete a", "update c"}) {
		t.Fatalf("after the list the handler heard %v", got[3:])
	}
	if got, want := stored(t, s, "configmaps"), []string{"b@6", "c@9", "d@8"}; !slices.Equal(got, want) {
		t.Errorf("local state holds %v, want %v", got, want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		lists, rvs := hub.counts()
		if lists == 1 && slices.Equal(rvs, []string{"7", "9"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lists, watches from %q; want one list and watches from 7, then 9", lists, rvs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rv := watchRV(t, s, "configmaps"); rv != "9" {
		t.Errorf("stored resourceVersion %q, want 9", rv)
	}
}

func TestInformerTombstones(t *testing.T) {
	s := openState(t, Options{})
	seed(t, s, "configmaps", "configmaps", "3", configMap("a", "3"))
	spec := Spec{State: s, Kind: "configmaps", Watch: "configmaps", Tombstones: true}
	hub := newFakeHub()
	rec := &recorder{}
	_, c := NewInformer(spec, hub.listFunc, hub.watchFunc, &corev1.ConfigMap{}, rec.handler())
	hub.events(watch.Event{Type: watch.Deleted, Object: configMap("a", "4")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunWithContext(ctx); close(done) }()
	got := rec.waitFor(t, 2)
	cancel()
	<-done
	if !slices.Equal(got, []string{"load a", "delete a"}) {
		t.Fatalf("handler heard %v", got)
	}
	if got, want := stored(t, s, "configmaps"), []string{"a@4 gone"}; !slices.Equal(got, want) {
		t.Fatalf("local state holds %v, want %v", got, want)
	}

	// The next start loads the tombstone, not the object, and hands it
	// to OnTombstone when it runs.
	var tombs []string
	spec.OnTombstone = func(obj any) { tombs = append(tombs, obj.(metav1.Object).GetName()) }
	store, c := NewInformer(spec, hub.listFunc, hub.watchFunc, &corev1.ConfigMap{}, (&recorder{}).handler())
	if keys := store.ListKeys(); len(keys) != 0 {
		t.Fatalf("store holds %v, want nothing", keys)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	c.RunWithContext(ctx)
	if !slices.Equal(tombs, []string{"a"}) {
		t.Fatalf("OnTombstone had %v, want a", tombs)
	}
}

func TestForget(t *testing.T) {
	s := openState(t, Options{})
	seed(t, s, "configmaps", "configmaps/default/a", "5", configMap("a", "5"))
	seed(t, s, "configmaps", "configmaps/default/b", "6", configMap("b", "6"))
	s.Forget("configmaps", "configmaps/default/a", "default", "a")
	if got, want := stored(t, s, "configmaps"), []string{"b@6"}; !slices.Equal(got, want) {
		t.Errorf("local state holds %v, want %v", got, want)
	}
	if rv := watchRV(t, s, "configmaps/default/a"); rv != "" {
		t.Errorf("forgotten watch still at %q", rv)
	}
	if rv := watchRV(t, s, "configmaps/default/b"); rv != "6" {
		t.Errorf("other watch at %q, want 6", rv)
	}
}

// TestInformerWritesOnlyWhatChanged: with Spec.Changed, an update that
// changes nothing it counts reaches the handlers but leaves the local
// state's copy, and a restart resumes past it with the older copy.
func TestInformerWritesOnlyWhatChanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	withData := func(name, rv, v string) *corev1.ConfigMap {
		cm := configMap(name, rv)
		cm.Data = map[string]string{"k": v}
		return cm
	}
	seed(t, s, "configmaps", "configmaps", "10", withData("a", "7", "one"))
	changed := func(old, cur runtime.Object) bool {
		return old.(*corev1.ConfigMap).Data["k"] != cur.(*corev1.ConfigMap).Data["k"]
	}
	spec := Spec{State: s, Kind: "configmaps", Watch: "configmaps", Changed: changed}
	hub := newFakeHub()
	rec := &recorder{}
	store, c := NewInformer(spec, hub.listFunc, hub.watchFunc, &corev1.ConfigMap{}, rec.handler())
	relabelled := withData("a", "11", "one")
	relabelled.Labels = map[string]string{"seen": "yes"}
	hub.events(watch.Event{Type: watch.Modified, Object: relabelled})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunWithContext(ctx); close(done) }()
	rec.waitFor(t, 2)
	if o, _, _ := store.GetByKey("default/a"); o.(*corev1.ConfigMap).ResourceVersion != "11" {
		t.Errorf("store holds a@%s, want the update a@11", o.(*corev1.ConfigMap).ResourceVersion)
	}
	if got, want := stored(t, s, "configmaps"), []string{"a@7"}; !slices.Equal(got, want) {
		t.Errorf("after an update that changed nothing counted the local state holds %v, want %v", got, want)
	}
	cancel()
	<-done
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// The restart starts from the older copy and resumes after the update.
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if rv := watchRV(t, s, "configmaps"); rv != "11" {
		t.Errorf("stored resourceVersion %q after the restart, want 11", rv)
	}
	spec.State = s
	hub = newFakeHub()
	rec = &recorder{}
	_, c = NewInformer(spec, hub.listFunc, hub.watchFunc, &corev1.ConfigMap{}, rec.handler())
	hub.events(watch.Event{Type: watch.Modified, Object: withData("a", "12", "two")})
	run(t, c)
	rec.waitFor(t, 2)
	if got, want := stored(t, s, "configmaps"), []string{"a@12"}; !slices.Equal(got, want) {
		t.Errorf("after an update that counts the local state holds %v, want %v", got, want)
	}
	if _, rvs := hub.counts(); len(rvs) != 1 || rvs[0] != "11" {
		t.Errorf("watches from %q; want one from 11", rvs)
	}
}

// TestInformerRelistWritesOnlyWhatChanged: a relist applies Spec.Changed
// as the watch does.
func TestInformerRelistWritesOnlyWhatChanged(t *testing.T) {
	s := openState(t, Options{})
	withData := func(name, rv, v string) *corev1.ConfigMap {
		cm := configMap(name, rv)
		cm.Data = map[string]string{"k": v}
		return cm
	}
	seed(t, s, "configmaps", "configmaps", "7", withData("a", "5", "one"), withData("b", "6", "one"))
	hub := newFakeHub()
	hub.list = func() (runtime.Object, error) {
		return &corev1.ConfigMapList{
			ListMeta: metav1.ListMeta{ResourceVersion: "9"},
			Items:    []corev1.ConfigMap{*withData("a", "8", "one"), *withData("b", "9", "two")},
		}, nil
	}
	changed := func(old, cur runtime.Object) bool {
		return old.(*corev1.ConfigMap).Data["k"] != cur.(*corev1.ConfigMap).Data["k"]
	}
	rec := &recorder{}
	store, c := NewInformer(Spec{State: s, Kind: "configmaps", Watch: "configmaps", Changed: changed},
		hub.listFunc, hub.watchFunc, &corev1.ConfigMap{}, rec.handler())
	hub.watches <- hubWatch{err: apierrors.NewResourceExpired("too old resource version: 7 (8)")}
	hub.events() // the watch after the list
	run(t, c)
	got := rec.waitFor(t, 4)
	if changes := slices.Sorted(slices.Values(got[2:])); !slices.Equal(changes, []string{"update a", "update b"}) {
		t.Fatalf("after the list the handler heard %v, want both updates", got[2:])
	}
	if o, _, _ := store.GetByKey("default/a"); o.(*corev1.ConfigMap).ResourceVersion != "8" {
		t.Errorf("store holds a@%s, want the listed a@8", o.(*corev1.ConfigMap).ResourceVersion)
	}
	if got, want := stored(t, s, "configmaps"), []string{"a@5", "b@9"}; !slices.Equal(got, want) {
		t.Errorf("local state holds %v, want %v: only b changed what counts", got, want)
	}
	if rv := watchRV(t, s, "configmaps"); rv != "9" {
		t.Errorf("stored resourceVersion %q, want 9", rv)
	}
}
