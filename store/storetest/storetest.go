// Package storetest checks that an implementation of [store.Store] keeps
// every promise of the store contract. Backends call [Run] from their tests.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tether-edge/tether/store"
)

// Opener opens the store kept in dir. Calling it again with the same dir
// after closing the first store must reopen the same data.
type Opener func(t *testing.T, dir string) store.Store

// Compactor is implemented by backends that can compact their change log on
// demand; the compaction tests are skipped for backends without it.
type Compactor interface {
	Compact(ctx context.Context, rev int64) error
}

// Run runs the conformance suite as subtests of t. The backend must end a
// watch with store.ErrWatchOverflow once its consumer is more than 20,000
// events behind, and accept values of at least 1 MiB.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"CreateGet", testCreateGet},
		{"Update", testUpdate},
		{"Delete", testDelete},
		{"TooLarge", testTooLarge},
		{"ConcurrentCreate", testConcurrentCreate},
		{"ConcurrentUpdate", testConcurrentUpdate},
		{"List", testList},
		{"ListPaging", testListPaging},
		{"Restart", testRestart},
		{"Compaction", testCompaction},
		{"Watch", testWatch},
		{"WatchReplay", testWatchReplay},
		{"WatchReplayLive", testWatchReplayLive},
		{"WatchSelectors", testWatchSelectors},
		{"WatchScope", testWatchScope},
		{"WatchErrors", testWatchErrors},
		{"WatchStop", testWatchStop},
		{"WatchOverflow", testWatchOverflow},
		{"Close", testClose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, open) })
	}
}

func openNew(t *testing.T, open Opener) (store.Store, string) {
	t.Helper()
	dir := t.TempDir()
	s := open(t, dir)
	t.Cleanup(func() { s.Close() })
	return s, dir
}

func pod(ns, name, value string, lbl map[string]string) store.Object {
	return store.Object{
		Key:    store.Key{Resource: "pods", Namespace: ns, Name: name},
		Value:  []byte(value),
		Labels: lbl,
		Fields: map[string]string{"metadata.namespace": ns, "metadata.name": name},
	}
}

func mustCreate(t *testing.T, s store.Store, o store.Object) int64 {
	t.Helper()
	rev, err := s.Create(context.Background(), o)
	if err != nil {
		t.Fatalf("Create(%v): %v", o.Key, err)
	}
	return rev
}

func mustUpdate(t *testing.T, s store.Store, o store.Object, expected int64) int64 {
	t.Helper()
	rev, err := s.Update(context.Background(), o, expected)
	if err != nil {
		t.Fatalf("Update(%v): %v", o.Key, err)
	}
	return rev
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %v, want %v", what, err, want)
	}
}

// objCmp compares objects treating nil and empty maps and values alike.
var objCmp = cmp.Options{
	cmp.Transformer("emptyMap", func(m map[string]string) map[string]string {
		if len(m) == 0 {
			return nil
		}
		return m
	}),
	cmp.Transformer("emptyBytes", func(b []byte) string { return string(b) }),
}

func testCreateGet(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	r0 := s.Revision()
	o := pod("ns", "a", `{"a":1}`, map[string]string{"app": "x"})
	rev := mustCreate(t, s, o)
	if rev <= r0 || s.Revision() != rev {
		t.Fatalf("Create revision %d, before %d, Revision() %d", rev, r0, s.Revision())
	}
	_, err := s.Create(ctx, o)
	wantErr(t, "second Create", err, store.ErrExists)
	if s.Revision() != rev {
		t.Fatalf("failed Create moved revision to %d", s.Revision())
	}
	got, err := s.Get(ctx, o.Key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	want := o
	want.Revision = rev
	if d := cmp.Diff(want, got, objCmp); d != "" {
		t.Fatalf("Get (-want +got):\n%s", d)
	}
	// Returned data belongs to the caller.
	got.Value[0] = 'X'
	got.Labels["app"] = "changed"
	again, _ := s.Get(ctx, o.Key)
	if d := cmp.Diff(want, again, objCmp); d != "" {
		t.Fatalf("Get after modifying a result (-want +got):\n%s", d)
	}
	// Data handed in is not retained.
	o2 := pod("ns", "b", "v", map[string]string{"app": "y"})
	rev2 := mustCreate(t, s, o2)
	o2.Value[0] = 'Z'
	o2.Labels["app"] = "changed"
	got2, _ := s.Get(ctx, o2.Key)
	if string(got2.Value) != "v" || got2.Labels["app"] != "y" || got2.Revision != rev2 {
		t.Fatalf("store retained caller data: %+v", got2)
	}
	_, err = s.Get(ctx, store.Key{Resource: "pods", Namespace: "ns", Name: "missing"})
	wantErr(t, "Get missing", err, store.ErrNotFound)
	// Cluster-scoped keys and the same name in another resource are distinct.
	mustCreate(t, s, store.Object{Key: store.Key{Resource: "nodes", Name: "a"}, Value: []byte("n")})
	mustCreate(t, s, store.Object{Key: store.Key{Resource: "secrets", Namespace: "ns", Name: "a"}, Value: []byte("s")})
	if g, err := s.Get(ctx, store.Key{Resource: "nodes", Name: "a"}); err != nil || string(g.Value) != "n" {
		t.Fatalf("Get node: %v %q", err, g.Value)
	}
}

func testUpdate(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	o := pod("ns", "a", "v1", map[string]string{"app": "x"})
	r1 := mustCreate(t, s, o)
	o.Value = []byte("v2")
	r2 := mustUpdate(t, s, o, r1)
	if r2 <= r1 {
		t.Fatalf("Update revision %d not above %d", r2, r1)
	}
	o.Value = []byte("v3")
	_, err := s.Update(ctx, o, r1)
	wantErr(t, "Update with stale revision", err, store.ErrConflict)
	if g, _ := s.Get(ctx, o.Key); string(g.Value) != "v2" || g.Revision != r2 {
		t.Fatalf("conflicting Update changed the object: %q at %d", g.Value, g.Revision)
	}
	// Unconditional update.
	r3 := mustUpdate(t, s, o, 0)
	if r3 <= r2 {
		t.Fatalf("unconditional Update revision %d not above %d", r3, r2)
	}
	// No-op updates, conditional or not, write nothing.
	w, err := s.Watch(ctx, store.WatchOptions{Resource: "pods", Revision: r3})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Stop()
	for _, exp := range []int64{0, r3} {
		same := pod("ns", "a", "v3", map[string]string{"app": "x"})
		r, err := s.Update(ctx, same, exp)
		if err != nil || r != r3 {
			t.Fatalf("no-op Update(expected %d) = %d, %v; want %d, nil", exp, r, err, r3)
		}
	}
	if s.Revision() != r3 {
		t.Fatalf("no-op Update moved revision from %d to %d", r3, s.Revision())
	}
	// Label and field changes alone are writes.
	o.Labels = map[string]string{"app": "y"}
	r4 := mustUpdate(t, s, o, r3)
	o.Fields = map[string]string{"metadata.namespace": "ns", "metadata.name": "a", "spec.nodeName": "n1"}
	r5 := mustUpdate(t, s, o, r4)
	evs := collect(t, w, 2)
	if evs[0].Object.Revision != r4 || evs[1].Object.Revision != r5 {
		t.Fatalf("events after no-op updates at %d, %d; want %d, %d", evs[0].Object.Revision, evs[1].Object.Revision, r4, r5)
	}
	_, err = s.Update(ctx, pod("ns", "missing", "v", nil), 0)
	wantErr(t, "Update missing", err, store.ErrNotFound)
	_, err = s.Update(ctx, pod("ns", "missing", "v", nil), 5)
	wantErr(t, "conditional Update missing", err, store.ErrNotFound)
}

func testDelete(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	o := pod("ns", "a", "v1", map[string]string{"app": "x"})
	r1 := mustCreate(t, s, o)
	_, err := s.Delete(ctx, o.Key, r1+100)
	wantErr(t, "Delete with wrong revision", err, store.ErrConflict)
	got, err := s.Delete(ctx, o.Key, r1)
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if got.Revision <= r1 || got.Revision != s.Revision() {
		t.Fatalf("Delete revision %d; created at %d, store at %d", got.Revision, r1, s.Revision())
	}
	want := o
	want.Revision = got.Revision
	if d := cmp.Diff(want, got, objCmp); d != "" {
		t.Fatalf("Delete result (-want +got):\n%s", d)
	}
	_, err = s.Get(ctx, o.Key)
	wantErr(t, "Get deleted", err, store.ErrNotFound)
	_, err = s.Delete(ctx, o.Key, 0)
	wantErr(t, "Delete deleted", err, store.ErrNotFound)
	// Re-create after delete, then delete unconditionally.
	r2 := mustCreate(t, s, o)
	if r2 <= got.Revision {
		t.Fatalf("re-Create revision %d not above %d", r2, got.Revision)
	}
	if _, err := s.Delete(ctx, o.Key, 0); err != nil {
		t.Fatalf("unconditional Delete: %v", err)
	}
}

func testTooLarge(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	big := make([]byte, 64<<20)
	o := pod("ns", "big", "", nil)
	o.Value = big
	_, err := s.Create(ctx, o)
	wantErr(t, "Create 64 MiB", err, store.ErrTooLarge)
	o.Value = make([]byte, 1<<20)
	r := mustCreate(t, s, o)
	o.Value = big
	_, err = s.Update(ctx, o, r)
	wantErr(t, "Update 64 MiB", err, store.ErrTooLarge)
	if g, err := s.Get(ctx, o.Key); err != nil || len(g.Value) != 1<<20 {
		t.Fatalf("Get after too-large Update: %d bytes, %v", len(g.Value), err)
	}
}

func testConcurrentCreate(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	const n = 32
	for round := range 5 {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, errs[i] = s.Create(context.Background(), pod("ns", fmt.Sprintf("same-%d", round), fmt.Sprint(i), nil))
			})
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, store.ErrExists):
				t.Fatalf("concurrent Create: %v", err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d concurrent Creates of one key succeeded, want 1", round, wins)
		}
	}
}

func testConcurrentUpdate(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	k := store.Key{Resource: "configmaps", Namespace: "ns", Name: "counter"}
	mustCreate(t, s, store.Object{Key: k, Value: []byte("0")})
	const workers, each = 16, 20
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for done := 0; done < each; {
				cur, err := s.Get(ctx, k)
				if err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				var v int
				fmt.Sscan(string(cur.Value), &v)
				cur.Value = []byte(fmt.Sprint(v + 1))
				_, err = s.Update(ctx, cur, cur.Revision)
				switch {
				case err == nil:
					done++
				case !errors.Is(err, store.ErrConflict):
					t.Errorf("Update: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	got, _ := s.Get(ctx, k)
	if string(got.Value) != fmt.Sprint(workers*each) {
		t.Fatalf("counter = %s after %d read-modify-write updates", got.Value, workers*each)
	}
}

func names(objs []store.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Namespace+"/"+o.Name)
	}
	return out
}

func testList(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	// Created out of order; lists come back by namespace, then name.
	for _, k := range []struct{ ns, name, app string }{
		{"b", "z", "web"}, {"a", "y", "db"}, {"b", "a", "db"}, {"a", "x", "web"}, {"c", "m", ""},
	} {
		var l map[string]string
		if k.app != "" {
			l = map[string]string{"app": k.app}
		}
		mustCreate(t, s, pod(k.ns, k.name, k.ns+k.name, l))
	}
	mustCreate(t, s, store.Object{Key: store.Key{Resource: "services", Namespace: "a", Name: "svc"}, Value: []byte("s")})
	deleted := mustCreate(t, s, pod("a", "gone", "g", nil))
	if _, err := s.Delete(ctx, store.Key{Resource: "pods", Namespace: "a", Name: "gone"}, deleted); err != nil {
		t.Fatal(err)
	}
	sel := func(s string) labels.Selector {
		l, err := labels.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	tests := []struct {
		name string
		opts store.ListOptions
		want []string
	}{
		{"all", store.ListOptions{}, []string{"a/x", "a/y", "b/a", "b/z", "c/m"}},
		{"namespace", store.ListOptions{Namespace: "b"}, []string{"b/a", "b/z"}},
		{"label", store.ListOptions{Label: sel("app=web")}, []string{"a/x", "b/z"}},
		{"label exists", store.ListOptions{Label: sel("app")}, []string{"a/x", "a/y", "b/a", "b/z"}},
		{"label notin", store.ListOptions{Label: sel("app notin (web)")}, []string{"a/y", "b/a", "c/m"}},
		{"field", store.ListOptions{Field: fields.OneTermEqualSelector("metadata.name", "a")}, []string{"b/a"}},
		{"field not", store.ListOptions{Field: fields.OneTermNotEqualSelector("metadata.namespace", "a")}, []string{"b/a", "b/z", "c/m"}},
		{"both", store.ListOptions{Namespace: "a", Label: sel("app=db"), Field: fields.Everything()}, []string{"a/y"}},
		{"none", store.ListOptions{Label: sel("app=nothing")}, nil},
	}
	for _, tt := range tests {
		tt.opts.Resource = "pods"
		res, err := s.List(ctx, tt.opts)
		if err != nil {
			t.Fatalf("%s: List: %v", tt.name, err)
		}
		if d := cmp.Diff(tt.want, names(res.Objects)); d != "" {
			t.Errorf("%s: List (-want +got):\n%s", tt.name, d)
		}
		if res.Revision != s.Revision() || res.Continue != "" {
			t.Errorf("%s: List revision %d continue %q; store at %d", tt.name, res.Revision, res.Continue, s.Revision())
		}
		for _, o := range res.Objects {
			g, _ := s.Get(ctx, o.Key)
			if d := cmp.Diff(g, o, objCmp); d != "" {
				t.Errorf("%s: listed object differs from Get (-get +list):\n%s", tt.name, d)
			}
		}
		// A read-only list has the same content; only who owns it differs.
		tt.opts.ReadOnly = true
		ro, err := s.List(ctx, tt.opts)
		if err != nil {
			t.Fatalf("%s: read-only List: %v", tt.name, err)
		}
		if d := cmp.Diff(res, ro, objCmp); d != "" {
			t.Errorf("%s: read-only List differs (-copied +read-only):\n%s", tt.name, d)
		}
	}
	res, _ := s.List(ctx, store.ListOptions{Resource: "nothing"})
	if len(res.Objects) != 0 {
		t.Fatalf("List of unknown resource: %v", names(res.Objects))
	}
}

func testListPaging(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	var want []string
	for ns := range 3 {
		for i := range 17 {
			o := pod(fmt.Sprintf("ns%d", ns), fmt.Sprintf("p%03d", i), "v", map[string]string{"even": fmt.Sprint(i%2 == 0)})
			mustCreate(t, s, o)
			want = append(want, o.Namespace+"/"+o.Name)
		}
	}
	for _, limit := range []int64{1, 5, 17, 50, 51, 100} {
		var got []string
		opts := store.ListOptions{Resource: "pods", Limit: limit}
		pages := 0
		for {
			res, err := s.List(ctx, opts)
			if err != nil {
				t.Fatalf("limit %d: List: %v", limit, err)
			}
			pages++
			if int64(len(res.Objects)) > limit {
				t.Fatalf("limit %d: page of %d", limit, len(res.Objects))
			}
			got = append(got, names(res.Objects)...)
			if res.Continue == "" {
				break
			}
			if res.Remaining != int64(len(want)-len(got)) {
				t.Errorf("limit %d: Remaining %d, want %d", limit, res.Remaining, len(want)-len(got))
			}
			opts.Continue = res.Continue
			// Writes between pages do not disturb paging of existing objects.
			mustCreate(t, s, store.Object{Key: store.Key{Resource: "other", Name: fmt.Sprint(pages, limit)}, Value: []byte("x")})
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("limit %d: paged list (-want +got):\n%s", limit, d)
		}
	}
	// Paging with a selector.
	var got []string
	opts := store.ListOptions{Resource: "pods", Namespace: "ns1", Limit: 3, Label: labels.SelectorFromSet(labels.Set{"even": "true"})}
	for {
		res, err := s.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, names(res.Objects)...)
		if res.Continue == "" {
			break
		}
		opts.Continue = res.Continue
	}
	if len(got) != 9 {
		t.Fatalf("filtered paging returned %d objects, want 9: %v", len(got), got)
	}
}

func testRestart(t *testing.T, open Opener) {
	dir := t.TempDir()
	ctx := context.Background()
	s := open(t, dir)
	a := pod("ns", "a", "va", map[string]string{"app": "x"})
	ra := mustCreate(t, s, a)
	b := pod("ns", "b", "vb", nil)
	rb := mustCreate(t, s, b)
	b.Value = []byte("vb2")
	rb = mustUpdate(t, s, b, rb)
	c := pod("ns", "c", "vc", nil)
	mustCreate(t, s, c)
	del, err := s.Delete(ctx, c.Key, 0)
	if err != nil {
		t.Fatal(err)
	}
	last := s.Revision()
	if last != del.Revision {
		t.Fatalf("Revision() %d after delete at %d", last, del.Revision)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s = open(t, dir)
	defer s.Close()
	if s.Revision() != last {
		t.Fatalf("Revision after restart %d, want %d", s.Revision(), last)
	}
	res, err := s.List(ctx, store.ListOptions{Resource: "pods"})
	if err != nil {
		t.Fatal(err)
	}
	a.Revision, b.Revision = ra, rb
	if d := cmp.Diff([]store.Object{a, b}, res.Objects, objCmp); d != "" {
		t.Fatalf("List after restart (-want +got):\n%s", d)
	}
	r := mustCreate(t, s, c)
	if r <= last {
		t.Fatalf("first write after restart at %d, not above %d", r, last)
	}
}

func testCompaction(t *testing.T, open Opener) {
	dir := t.TempDir()
	ctx := context.Background()
	s := open(t, dir)
	c, ok := s.(Compactor)
	if !ok {
		s.Close()
		t.Skip("backend cannot compact on demand")
	}
	o := pod("ns", "a", "v0", nil)
	rev := mustCreate(t, s, o)
	for i := range 50 {
		o.Value = []byte(fmt.Sprint("v", i+1))
		rev = mustUpdate(t, s, o, rev)
	}
	keep := mustCreate(t, s, pod("ns", "keep", "k", nil))
	mid := rev - 10
	page, err := s.List(ctx, store.ListOptions{Resource: "pods", Limit: 1})
	if err != nil || page.Continue == "" {
		t.Fatalf("List page: %v, continue %q", err, page.Continue)
	}
	if err := c.Compact(ctx, mid); err != nil {
		t.Fatalf("Compact: %v", err)
	}
	if s.CompactedRevision() != mid {
		t.Fatalf("CompactedRevision %d, want %d", s.CompactedRevision(), mid)
	}
	_, err = s.Watch(ctx, store.WatchOptions{Revision: mid - 1})
	wantErr(t, "Watch below compacted", err, store.ErrCompacted)
	// Watching from the compacted revision itself replays what follows.
	w, err := s.Watch(ctx, store.WatchOptions{Revision: mid})
	if err != nil {
		t.Fatalf("Watch at compacted: %v", err)
	}
	evs := collect(t, w, 11)
	w.Stop()
	if evs[0].Object.Revision != mid+1 || evs[0].Prev == nil || evs[0].Prev.Revision != mid {
		t.Fatalf("first event after compaction: %+v", evs[0])
	}
	mustCreate(t, s, pod("ns", "later", "l", nil))
	if err := c.Compact(ctx, s.Revision()); err != nil {
		t.Fatalf("Compact to current: %v", err)
	}
	_, err = s.List(ctx, store.ListOptions{Resource: "pods", Continue: page.Continue})
	wantErr(t, "List continue below compacted", err, store.ErrCompacted)
	compacted, last := s.CompactedRevision(), s.Revision()
	s.Close()
	s = open(t, dir)
	defer s.Close()
	if s.CompactedRevision() != compacted || s.Revision() != last {
		t.Fatalf("after restart compacted %d revision %d, want %d %d", s.CompactedRevision(), s.Revision(), compacted, last)
	}
	// Current state survives compaction of its history.
	if g, err := s.Get(ctx, o.Key); err != nil || string(g.Value) != "v50" || g.Revision != rev {
		t.Fatalf("Get after compaction: %q at %d, %v", g.Value, g.Revision, err)
	}
	if g, err := s.Get(ctx, store.Key{Resource: "pods", Namespace: "ns", Name: "keep"}); err != nil || g.Revision != keep {
		t.Fatalf("Get keep after compaction: %v", err)
	}
	if r := mustCreate(t, s, pod("ns", "new", "n", nil)); r <= last {
		t.Fatalf("write after compaction and restart at %d, not above %d", r, last)
	}
	_, err = s.Watch(ctx, store.WatchOptions{Revision: compacted - 1})
	wantErr(t, "Watch below compacted after restart", err, store.ErrCompacted)
}

func collect(t *testing.T, w store.Watcher, n int) []store.Event {
	t.Helper()
	var out []store.Event
	timeout := time.After(20 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended after %d of %d events: %v", len(out), n, w.Err())
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("timed out after %d of %d events", len(out), n)
		}
	}
	return out
}

func expectQuiet(t *testing.T, w store.Watcher) {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if ok {
			t.Fatalf("unexpected event %v %v at %d", ev.Type, ev.Object.Key, ev.Object.Revision)
		}
		t.Fatalf("watch ended: %v", w.Err())
	case <-time.After(100 * time.Millisecond):
	}
}

type evSummary struct {
	Type     store.EventType
	Key      string
	Value    string
	Revision int64
	PrevRev  int64
}

func summarize(evs []store.Event) []evSummary {
	var out []evSummary
	for _, e := range evs {
		s := evSummary{Type: e.Type, Key: e.Object.Key.String(), Value: string(e.Object.Value), Revision: e.Object.Revision}
		if e.Prev != nil {
			s.PrevRev = e.Prev.Revision
		}
		out = append(out, s)
	}
	return out
}

// history writes a fixed sequence and returns the events it must produce.
func history(t *testing.T, s store.Store) []evSummary {
	ctx := context.Background()
	a := pod("ns", "a", "a1", nil)
	r1 := mustCreate(t, s, a)
	a.Value = []byte("a2")
	r2 := mustUpdate(t, s, a, r1)
	b := pod("ns", "b", "b1", nil)
	r3 := mustCreate(t, s, b)
	d, err := s.Delete(ctx, a.Key, r2)
	if err != nil {
		t.Fatal(err)
	}
	a.Value = []byte("a3")
	r5 := mustCreate(t, s, a)
	return []evSummary{
		{store.Added, "pods/ns/a", "a1", r1, 0},
		{store.Modified, "pods/ns/a", "a2", r2, r1},
		{store.Added, "pods/ns/b", "b1", r3, 0},
		{store.Deleted, "pods/ns/a", "a2", d.Revision, r2},
		{store.Added, "pods/ns/a", "a3", r5, 0},
	}
}

func testWatch(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	w, err := s.Watch(ctx, store.WatchOptions{Resource: "pods", Revision: s.Revision()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// A read-only watch sees the same events; only who owns them differs.
	ro, err := s.Watch(ctx, store.WatchOptions{Resource: "pods", Revision: s.Revision(), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Stop()
	want := history(t, s)
	for _, w := range []store.Watcher{w, ro} {
		evs := collect(t, w, len(want))
		if d := cmp.Diff(want, summarize(evs)); d != "" {
			t.Fatalf("events (-want +got):\n%s", d)
		}
		if evs[1].Prev == nil || string(evs[1].Prev.Value) != "a1" {
			t.Fatalf("Modified event Prev: %+v", evs[1].Prev)
		}
		expectQuiet(t, w)
	}
	// Replayed, read-only or not.
	for _, readOnly := range []bool{false, true} {
		w, err := s.Watch(ctx, store.WatchOptions{Resource: "pods", Revision: want[0].Revision - 1, ReadOnly: readOnly})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, summarize(collect(t, w, len(want)))); d != "" {
			t.Fatalf("replayed events, read-only %v (-want +got):\n%s", readOnly, d)
		}
		w.Stop()
	}
}

func testWatchReplay(t *testing.T, open Opener) {
	dir := t.TempDir()
	s := open(t, dir)
	start := s.Revision()
	want := history(t, s)
	check := func(s store.Store, what string) {
		t.Helper()
		for i := range want {
			from := start
			if i > 0 {
				from = want[i-1].Revision
			}
			w, err := s.Watch(context.Background(), store.WatchOptions{Resource: "pods", Revision: from})
			if err != nil {
				t.Fatalf("%s: Watch from %d: %v", what, from, err)
			}
			evs := collect(t, w, len(want)-i)
			if d := cmp.Diff(want[i:], summarize(evs)); d != "" {
				t.Fatalf("%s: replay from %d (-want +got):\n%s", what, from, d)
			}
			expectQuiet(t, w)
			w.Stop()
		}
	}
	check(s, "before restart")
	s.Close()
	s = open(t, dir)
	defer s.Close()
	check(s, "after restart")
}

func testWatchReplayLive(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	const writers, each = 8, 150
	var mu sync.Mutex
	var acked []int64
	var wg sync.WaitGroup
	startWriters := func(phase int) {
		for g := range writers {
			wg.Go(func() {
				for i := range each {
					r, err := s.Create(ctx, pod("ns", fmt.Sprintf("p%d-%d-%d", phase, g, i), "v", nil))
					if err != nil {
						t.Errorf("Create: %v", err)
						return
					}
					mu.Lock()
					acked = append(acked, r)
					mu.Unlock()
				}
			})
		}
	}
	startWriters(0)
	wg.Wait()
	// Watches starting at various points of the history, while more
	// writes arrive, must see every later revision exactly once in order.
	startWriters(1)
	var watchers []store.Watcher
	var froms []int64
	for _, frac := range []int{0, 1, 2, 3} {
		from := int64(0)
		mu.Lock()
		if frac > 0 {
			from = acked[len(acked)*frac/4-1]
		}
		mu.Unlock()
		w, err := s.Watch(ctx, store.WatchOptions{Resource: "pods", Revision: from})
		if err != nil {
			t.Fatalf("Watch from %d: %v", from, err)
		}
		defer w.Stop()
		watchers = append(watchers, w)
		froms = append(froms, from)
	}
	wg.Wait()
	slices.Sort(acked)
	for i, w := range watchers {
		var want []int64
		for _, r := range acked {
			if r > froms[i] {
				want = append(want, r)
			}
		}
		evs := collect(t, w, len(want))
		got := make([]int64, len(evs))
		for j, e := range evs {
			got[j] = e.Object.Revision
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("watch from %d (-want +got):\n%s", froms[i], d)
		}
		expectQuiet(t, w)
	}
}

func testWatchSelectors(t *testing.T, open Opener) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := context.Background()
	start := s.Revision()
	opts := store.WatchOptions{Resource: "pods", Revision: start, Label: labels.SelectorFromSet(labels.Set{"app": "a"})}
	live, err := s.Watch(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	fopts := store.WatchOptions{Resource: "pods", Revision: start, Field: fields.OneTermEqualSelector("spec.nodeName", "n1")}
	flive, err := s.Watch(ctx, fopts)
	if err != nil {
		t.Fatal(err)
	}
	f2opts := store.WatchOptions{Resource: "pods", Revision: start, Field: fields.OneTermEqualSelector("spec.nodeName", "n2")}
	f2live, err := s.Watch(ctx, f2opts)
	if err != nil {
		t.Fatal(err)
	}
	o := pod("ns", "p", "1", map[string]string{"app": "b"})
	r1 := mustCreate(t, s, o) // not selected
	o.Labels = map[string]string{"app": "a"}
	r2 := mustUpdate(t, s, o, r1) // enters: Added
	o.Value = []byte("2")
	r3 := mustUpdate(t, s, o, r2) // stays: Modified
	o.Labels = map[string]string{"app": "c"}
	r4 := mustUpdate(t, s, o, r3) // leaves: Deleted with previous state at r4
	o.Value = []byte("3")
	r5 := mustUpdate(t, s, o, r4) // outside: nothing
	o.Labels = map[string]string{"app": "a"}
	o.Fields = map[string]string{"spec.nodeName": "n1"}
	r6 := mustUpdate(t, s, o, r5) // enters both
	o.Fields = map[string]string{"spec.nodeName": "n2"}
	r7 := mustUpdate(t, s, o, r6) // leaves n1 for n2
	d, err := s.Delete(ctx, o.Key, r7)
	if err != nil {
		t.Fatal(err)
	}
	want := []evSummary{
		{store.Added, "pods/ns/p", "1", r2, 0},
		{store.Modified, "pods/ns/p", "2", r3, r2},
		{store.Deleted, "pods/ns/p", "2", r4, r3},
		{store.Added, "pods/ns/p", "3", r6, 0},
		{store.Modified, "pods/ns/p", "3", r7, r6},
		{store.Deleted, "pods/ns/p", "3", d.Revision, r7},
	}
	fwant := []evSummary{
		{store.Added, "pods/ns/p", "3", r6, 0},
		{store.Deleted, "pods/ns/p", "3", r7, r6},
	}
	f2want := []evSummary{
		{store.Added, "pods/ns/p", "3", r7, 0},
		{store.Deleted, "pods/ns/p", "3", d.Revision, r7},
	}
	check := func(w store.Watcher, want []evSummary, what string) {
		t.Helper()
		evs := collect(t, w, len(want))
		if d := cmp.Diff(want, summarize(evs)); d != "" {
			t.Fatalf("%s (-want +got):\n%s", what, d)
		}
		for _, e := range evs {
			if e.Type == store.Added && e.Prev != nil {
				t.Fatalf("%s: Added event with Prev", what)
			}
		}
		if evs[2%len(evs)].Type == store.Deleted && evs[2%len(evs)].Object.Labels["app"] == "c" {
			t.Fatalf("%s: Deleted transition carries the new state", what)
		}
		expectQuiet(t, w)
		w.Stop()
	}
	check(live, want, "live label watch")
	check(flive, fwant, "live field watch")
	check(f2live, f2want, "live field watch of the second node")
	s.Close()
	s = open(t, dir)
	defer s.Close()
	w, err := s.Watch(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	check(w, want, "replayed label watch")
	w, err = s.Watch(ctx, fopts)
	if err != nil {
		t.Fatal(err)
	}
	check(w, fwant, "replayed field watch")
	w, err = s.Watch(ctx, f2opts)
	if err != nil {
		t.Fatal(err)
	}
	check(w, f2want, "replayed field watch of the second node")
}

func testWatchScope(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	from := s.Revision()
	all, err := s.Watch(ctx, store.WatchOptions{Revision: from})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Stop()
	nsw, err := s.Watch(ctx, store.WatchOptions{Resource: "pods", Namespace: "b", Revision: from})
	if err != nil {
		t.Fatal(err)
	}
	defer nsw.Stop()
	r1 := mustCreate(t, s, pod("a", "p", "1", nil))
	r2 := mustCreate(t, s, store.Object{Key: store.Key{Resource: "nodes", Name: "n"}, Value: []byte("n")})
	r3 := mustCreate(t, s, pod("b", "p", "2", nil))
	r4 := mustCreate(t, s, store.Object{Key: store.Key{Resource: "secrets", Namespace: "b", Name: "s"}, Value: []byte("s")})
	got := summarize(collect(t, all, 4))
	var revs []int64
	for _, e := range got {
		revs = append(revs, e.Revision)
	}
	if d := cmp.Diff([]int64{r1, r2, r3, r4}, revs); d != "" {
		t.Fatalf("watch of everything (-want +got):\n%s", d)
	}
	if e := collect(t, nsw, 1); e[0].Object.Revision != r3 {
		t.Fatalf("namespace watch got revision %d, want %d", e[0].Object.Revision, r3)
	}
	expectQuiet(t, nsw)
}

func testWatchErrors(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	mustCreate(t, s, pod("ns", "a", "v", nil))
	_, err := s.Watch(ctx, store.WatchOptions{Revision: s.Revision() + 1})
	wantErr(t, "Watch from the future", err, store.ErrFutureRevision)
	w, err := s.Watch(ctx, store.WatchOptions{Revision: s.Revision()})
	if err != nil {
		t.Fatalf("Watch from current revision: %v", err)
	}
	w.Stop()
}

func testWatchStop(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx, cancel := context.WithCancel(context.Background())
	w1, err := s.Watch(ctx, store.WatchOptions{Revision: s.Revision()})
	if err != nil {
		t.Fatal(err)
	}
	w2, err := s.Watch(context.Background(), store.WatchOptions{Revision: s.Revision()})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	w2.Stop()
	w2.Stop()
	for i, w := range []store.Watcher{w1, w2} {
		drainClosed(t, w)
		if err := w.Err(); err != nil {
			t.Fatalf("watch %d ended with %v, want nil", i, err)
		}
	}
	mustCreate(t, s, pod("ns", "a", "v", nil)) // no stopped watcher blocks writes
}

func drainClosed(t *testing.T, w store.Watcher) int {
	t.Helper()
	n := 0
	timeout := time.After(30 * time.Second)
	for {
		select {
		case _, ok := <-w.Events():
			if !ok {
				return n
			}
			n++
		case <-timeout:
			t.Fatalf("watch not closed after %d events", n)
		}
	}
}

func testWatchOverflow(t *testing.T, open Opener) {
	s, _ := openNew(t, open)
	ctx := context.Background()
	from := s.Revision()
	slow, err := s.Watch(ctx, store.WatchOptions{Revision: from})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Stop()
	fast, err := s.Watch(ctx, store.WatchOptions{Revision: from})
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Stop()
	const total = 25_000
	received := make(chan int, 1)
	go func() {
		n := 0
		for range fast.Events() {
			n++
			if n == total {
				break
			}
		}
		received <- n
	}()
	var wg sync.WaitGroup
	const writers = 50
	value := make([]byte, 64)
	for g := range writers {
		wg.Go(func() {
			for i := range total / writers {
				if _, err := s.Create(ctx, store.Object{Key: store.Key{Resource: "events", Namespace: "ns", Name: fmt.Sprint(g, "-", i)}, Value: value}); err != nil {
					t.Errorf("Create: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := drainClosed(t, slow); n >= total {
		t.Fatalf("slow watch received all %d events", n)
	}
	wantErr(t, "slow watch", slow.Err(), store.ErrWatchOverflow)
	select {
	case n := <-received:
		if n != total {
			t.Fatalf("fast watch received %d of %d events: %v", n, total, fast.Err())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fast watch did not receive all events")
	}
	// The overflowed consumer may watch again from its last revision.
	w, err := s.Watch(ctx, store.WatchOptions{Revision: from})
	if err != nil {
		t.Fatalf("Watch again after overflow: %v", err)
	}
	w.Stop()
}

func testClose(t *testing.T, open Opener) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := context.Background()
	w, err := s.Watch(ctx, store.WatchOptions{Revision: s.Revision()})
	if err != nil {
		t.Fatal(err)
	}
	// Writes racing with Close either succeed durably or fail with ErrClosed.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok []store.Key
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				k := store.Key{Resource: "pods", Namespace: "ns", Name: fmt.Sprint(g, "-", i)}
				_, err := s.Create(ctx, store.Object{Key: k, Value: []byte("v")})
				if errors.Is(err, store.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Create: %v", err)
					return
				}
				mu.Lock()
				ok = append(ok, k)
				mu.Unlock()
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	drainClosed(t, w)
	wantErr(t, "watch after Close", w.Err(), store.ErrClosed)
	s.Close()
	_, err = s.Create(ctx, pod("ns", "late", "v", nil))
	wantErr(t, "Create after Close", err, store.ErrClosed)
	_, err = s.Update(ctx, pod("ns", "late", "v", nil), 0)
	wantErr(t, "Update after Close", err, store.ErrClosed)
	_, err = s.Delete(ctx, store.Key{Resource: "pods", Namespace: "ns", Name: "late"}, 0)
	wantErr(t, "Delete after Close", err, store.ErrClosed)
	_, err = s.Get(ctx, store.Key{Resource: "pods", Namespace: "ns", Name: "late"})
	wantErr(t, "Get after Close", err, store.ErrClosed)
	_, err = s.List(ctx, store.ListOptions{Resource: "pods"})
	wantErr(t, "List after Close", err, store.ErrClosed)
	_, err = s.Watch(ctx, store.WatchOptions{})
	wantErr(t, "Watch after Close", err, store.ErrClosed)
	s = open(t, dir)
	defer s.Close()
	for _, k := range ok {
		if _, err := s.Get(ctx, k); err != nil {
			t.Fatalf("acknowledged write %v lost across Close: %v", k, err)
		}
	}
}
