package storage

import (
	"bytes"
	"context"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"

	"github.com/tether-edge/tether/hub/registry"
)

// typedProtobuf encodes a list as the HTTP layer does for
// application/vnd.kubernetes.protobuf.
func typedProtobuf(t *testing.T, s *Storage, obj runtime.Object) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(s.scheme, s.scheme).Encode(obj, &buf); err != nil {
		t.Fatalf("encode %T: %v", obj, err)
	}
	return buf.Bytes()
}

// checkListProtobuf compares ListProtobuf's body with the protobuf
// encoding of List's answer and returns the list's items.
func checkListProtobuf(t *testing.T, s *Storage, k *registry.Kind, ns string, opts ListOptions) []runtime.Object {
	t.Helper()
	ctx := context.Background()
	want, err := s.List(ctx, k, ns, opts)
	if err != nil {
		t.Fatalf("list %s: %v", k.Resource, err)
	}
	got, ok, err := s.ListProtobuf(ctx, k, ns, opts)
	if err != nil || !ok {
		t.Fatalf("list %s as protobuf: ok %v, %v", k.Resource, ok, err)
	}
	wb := typedProtobuf(t, s, want)
	if got.Len() != len(wb) {
		t.Errorf("list %s: Len %d, body %d bytes", k.Resource, got.Len(), len(wb))
	}
	if gb := got.Bytes(); !bytes.Equal(gb, wb) {
		t.Errorf("list %s: protobuf differs from the typed list's (%d and %d bytes)", k.Resource, len(gb), len(wb))
	}
	items, err := meta.ExtractList(want)
	if err != nil {
		t.Fatal(err)
	}
	return items
}

func TestListProtobufMatchesTypedList(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	createListSamples(t, f)
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e"}, InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "p"},
		Reason: "Started", Message: "ünïcode", Type: corev1.EventTypeNormal, Count: 2}
	if _, err := f.s.Create(ctx, kind(t, "", "v1", "events"), "default", ev, Options{}); err != nil {
		t.Fatal(err)
	}

	for _, c := range listSampleKinds {
		checkListProtobuf(t, f.s, kind(t, c.group, c.version, c.resource), c.ns, ListOptions{})
	}
	// A kind stored as another kind is answered too: its items are
	// converted before they are encoded.
	checkListProtobuf(t, f.s, kind(t, "events.k8s.io", "v1", "events"), "default", ListOptions{})
	checkListProtobuf(t, f.s, kind(t, "", "v1", "events"), "default", ListOptions{})

	// Pages carry continue and remainingItemCount; selectors filter.
	cms := kind(t, "", "v1", "configmaps")
	if items := checkListProtobuf(t, f.s, cms, "", ListOptions{Limit: 1}); len(items) != 1 {
		t.Errorf("first page holds %d items, want 1", len(items))
	}
	if items := checkListProtobuf(t, f.s, cms, "", ListOptions{Label: labels.SelectorFromSet(labels.Set{"app": "x"})}); len(items) != 1 {
		t.Errorf("selected list holds %d items, want 1", len(items))
	}

	// An object changed since the last list is sent as it is now, not
	// as that list sent it.
	pods := kind(t, "", "v1", "pods")
	checkListProtobuf(t, f.s, pods, "default", ListOptions{})
	p, err := f.s.Get(ctx, pods, "default", "p")
	if err != nil {
		t.Fatal(err)
	}
	p.(*corev1.Pod).Labels["app"] = "y"
	if _, err := f.s.Update(ctx, pods, "default", "p", p, Options{}); err != nil {
		t.Fatal(err)
	}
	items := checkListProtobuf(t, f.s, pods, "default", ListOptions{})
	if len(items) != 1 || items[0].(*corev1.Pod).Labels["app"] != "y" {
		t.Fatalf("after the update the list holds %v", items)
	}

	// An empty list is answered too. Errors are List's. (Custom
	// resources have no protobuf encoding; see
	// TestCustomResourceListJSON.)
	checkListProtobuf(t, f.s, kind(t, "batch", "v1", "jobs"), "", ListOptions{})
	_, _, err = f.s.ListProtobuf(ctx, pods, "default", ListOptions{ResourceVersion: "x"})
	wantReason(t, err, metav1.StatusReasonBadRequest)
}

// TestProtoItemsBudgetAndAge: the item encodings kept stay within their
// byte budget, and an idle hub soon holds none of them.
func TestProtoItemsBudgetAndAge(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cms := kind(t, "", "v1", "configmaps")
	for i := range 20 {
		if _, err := f.s.Create(ctx, cms, "default", cm("c"+string(rune('a'+i)), map[string]string{"k": "v"}), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	if f.s.protos.budget != 64<<20 {
		t.Errorf("default budget %d, want 64 MiB", f.s.protos.budget)
	}
	if none, err := New(Config{Store: f.st, ListCacheBytes: -1}); err != nil || none.protos.budget != 0 {
		t.Errorf("ListCacheBytes -1: %v, budget %v", err, none)
	}
	c := &f.s.protos
	held := func() (int, int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.cur) + len(c.old), c.size
	}

	// Room for some: every list is still whole and right.
	c.mu.Lock()
	c.budget = 5 * (protoEntryOverhead + 200)
	c.mu.Unlock()
	for range 3 {
		checkListProtobuf(t, f.s, cms, "default", ListOptions{})
		if n, size := held(); size > c.budget || n == 0 || n >= 20 {
			t.Fatalf("%d encodings of %d bytes held, budget %d", n, size, c.budget)
		}
	}

	// Two turns without a list drop everything and stop the timer.
	c.mu.Lock()
	c.budget = 64 << 20
	c.mu.Unlock()
	checkListProtobuf(t, f.s, cms, "default", ListOptions{})
	if n, _ := held(); n != 20 {
		t.Fatalf("%d encodings held after a list of 20", n)
	}
	c.age()
	checkListProtobuf(t, f.s, cms, "default", ListOptions{}) // moves them back
	c.age()
	c.age()
	c.mu.Lock()
	n, size, timer := len(c.cur)+len(c.old), c.size, c.turn
	c.mu.Unlock()
	if n != 0 || size != 0 || timer != nil {
		t.Fatalf("after two idle turns: %d encodings, %d bytes, timer %v", n, size, timer)
	}

	// Without a budget (ListCacheBytes below zero) nothing is kept.
	c.mu.Lock()
	c.budget = 0
	c.mu.Unlock()
	checkListProtobuf(t, f.s, cms, "default", ListOptions{})
	if n, _ := held(); n != 0 {
		t.Fatalf("%d encodings held without a budget", n)
	}
}

// TestProtoItemSharedWithLists: a watch event's object encoded through
// ProtoItem is the item a protobuf list sends for its revision, kept for
// that list while clients list in protobuf, and not kept otherwise.
func TestProtoItemSharedWithLists(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	pods := kind(t, "", "v1", "pods")
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	created, err := f.s.Create(ctx, pods, "default", p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	itemKey := func(obj runtime.Object) (pendingKey, int64) {
		acc, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		rev, err := strconv.ParseInt(acc.GetResourceVersion(), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		k, err := f.s.served(pods)
		if err != nil {
			t.Fatal(err)
		}
		return pendingKey{kind: k, key: f.s.key(k, acc.GetNamespace(), acc.GetName())}, rev
	}

	// No protobuf list yet: the encoding is returned, not kept.
	item, ok := f.s.ProtoItem(pods, created)
	want, err := created.(*corev1.Pod).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !ok || !bytes.Equal(item, want) {
		t.Fatalf("item of the created pod: ok %v, equal %v", ok, bytes.Equal(item, want))
	}
	if key, rev := itemKey(created); f.s.protos.get(key, rev) != nil {
		t.Error("an item was kept though nobody lists in protobuf")
	}

	// After a protobuf list, the item of a change a watch encodes is
	// kept, and the next list sends those very bytes.
	checkListProtobuf(t, f.s, pods, "default", ListOptions{})
	cur, err := f.s.Get(ctx, pods, "default", "w")
	if err != nil {
		t.Fatal(err)
	}
	cur.(*corev1.Pod).Labels["app"] = "y"
	updated, err := f.s.Update(ctx, pods, "default", "w", cur, Options{})
	if err != nil {
		t.Fatal(err)
	}
	item, ok = f.s.ProtoItem(pods, updated)
	if want, _ := updated.(*corev1.Pod).Marshal(); !ok || !bytes.Equal(item, want) {
		t.Fatalf("item of the updated pod: ok %v", ok)
	}
	key, rev := itemKey(updated)
	if kept := f.s.protos.get(key, rev); len(kept) == 0 || &kept[0] != &item[0] {
		t.Fatal("the watch's item is not kept for the next list")
	}
	items := checkListProtobuf(t, f.s, pods, "default", ListOptions{})
	if len(items) != 1 || items[0].(*corev1.Pod).Labels["app"] != "y" {
		t.Fatalf("after the update the list holds %v", items)
	}
	body, _, err := f.s.ListProtobuf(ctx, pods, "default", ListOptions{})
	if err != nil || len(body.items) != 1 || &body.items[0][0] != &item[0] {
		t.Error("the list did not send the watch's item")
	}

	// Objects without a stored revision, and kinds without a protobuf
	// encoding, are left to the caller.
	bare := updated.DeepCopyObject()
	bare.(*corev1.Pod).ResourceVersion = ""
	if _, ok := f.s.ProtoItem(pods, bare); ok {
		t.Error("an object without a resourceVersion got an item")
	}
}
