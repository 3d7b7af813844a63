package eventring

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"weak"

	"github.com/tether-edge/tether/store"
)

func event(rev int64, size int, prev bool) *store.Event {
	ev := &store.Event{Type: store.Added, Object: store.Object{
		Key:   store.Key{Resource: "pods", Namespace: "ns", Name: "p"},
		Value: []byte(strings.Repeat("x", size)), Revision: rev,
	}}
	if prev {
		p := ev.Object
		p.Value = []byte(strings.Repeat("y", size))
		p.Revision = rev - 1
		ev.Type, ev.Prev = store.Modified, &p
	}
	return ev
}

func revisions(evs []*store.Event) []int64 {
	var out []int64
	for _, ev := range evs {
		out = append(out, ev.Object.Revision)
	}
	return out
}

func TestCountBound(t *testing.T) {
	r := New(3, 1<<30, 10)
	if got, ok := r.Since(10); !ok || len(got) != 0 {
		t.Fatalf("empty ring since its base: %v %v", got, ok)
	}
	for rev := int64(11); rev <= 15; rev++ {
		r.Add(event(rev, 10, false))
	}
	if r.Len() != 3 || r.Base() != 12 {
		t.Fatalf("len %d base %d, want 3 and 12", r.Len(), r.Base())
	}
	if _, ok := r.Since(11); ok {
		t.Fatal("a revision before the base is covered")
	}
	got, ok := r.Since(12)
	if !ok || !slices.Equal(revisions(got), []int64{13, 14, 15}) {
		t.Fatalf("since 12: %v %v", revisions(got), ok)
	}
	got, _ = r.Since(14)
	if len(got) != 1 || got[0].Object.Revision != 15 {
		t.Fatalf("since 14: %v", revisions(got))
	}
	if got, ok := r.Since(15); !ok || len(got) != 0 {
		t.Fatalf("since the newest: %v %v", revisions(got), ok)
	}
}

// TestByteBound checks that the states an event holds, before and after
// the change, count against the byte bound, and that the newest event
// stays however large it is.
func TestByteBound(t *testing.T) {
	r := New(1000, 1000, 0)
	for rev := int64(1); rev <= 10; rev++ {
		r.Add(event(rev, 100, false))
	}
	if r.Len() != 10 || r.Bytes() != 1000 {
		t.Fatalf("len %d bytes %d, want 10 and 1000", r.Len(), r.Bytes())
	}
	// A modification holds two states: it pushes out two additions.
	r.Add(event(11, 100, true))
	if r.Len() != 9 || r.Bytes() != 1000 || r.Base() != 2 {
		t.Fatalf("len %d bytes %d base %d, want 9, 1000 and 2", r.Len(), r.Bytes(), r.Base())
	}
	r.Add(event(12, 5000, false))
	if r.Len() != 1 || r.Base() != 11 {
		t.Fatalf("after an event past the bound: len %d base %d, want 1 and 11", r.Len(), r.Base())
	}
	if got, ok := r.Since(11); !ok || len(got) != 1 || got[0].Object.Revision != 12 {
		t.Fatalf("since 11: %v %v", revisions(got), ok)
	}
	labelled := event(13, 0, false)
	labelled.Object.Labels = map[string]string{"app": "web"}
	labelled.Object.Fields = map[string]string{"spec.nodeName": "n1"}
	if c := Cost(labelled); c != int64(len("app")+len("web")+len("spec.nodeName")+len("n1")) {
		t.Fatalf("cost of labels and fields: %d", c)
	}
}

// TestDroppedEventsAreReleased checks that an event leaving the ring is
// garbage at once, not when the slice is next moved.
func TestDroppedEventsAreReleased(t *testing.T) {
	r := New(100, 1<<30, 0)
	first := event(1, 1<<20, false)
	gone := weak.Make(first)
	r.Add(first)
	first = nil
	for rev := int64(2); rev <= 101; rev++ {
		r.Add(event(rev, 1, false))
	}
	if r.Len() != 100 || r.Base() != 1 {
		t.Fatalf("len %d base %d, want 100 and 1", r.Len(), r.Base())
	}
	runtime.GC()
	if gone.Value() != nil {
		t.Fatal("the dropped event is still reachable from the ring")
	}
}

// TestBackingArrayStaysSmall checks the amortized compaction: a ring kept
// full for a long time never holds more than twice its events.
func TestBackingArrayStaysSmall(t *testing.T) {
	r := New(50, 1<<30, 0)
	for rev := int64(1); rev <= 10_000; rev++ {
		r.Add(event(rev, 1, false))
		if cap(r.events) > 4*50 || len(r.events) > 2*50 {
			t.Fatalf("after %d events: len %d cap %d", rev, len(r.events), cap(r.events))
		}
	}
	got, ok := r.Since(r.Base())
	if !ok || len(got) != 50 || got[0].Object.Revision != 9951 || got[49].Object.Revision != 10_000 {
		t.Fatalf("since the base: %d events, %v", len(got), ok)
	}
	r.Reset(20_000)
	if r.Len() != 0 || r.Bytes() != 0 || r.Base() != 20_000 {
		t.Fatalf("after reset: len %d bytes %d base %d", r.Len(), r.Bytes(), r.Base())
	}
}
