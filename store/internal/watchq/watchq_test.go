package watchq

import (
	"context"
	"testing"
	"time"

	"github.com/tether-edge/tether/store"
)

func podEvent(rev int64) *store.Event {
	return &store.Event{Type: store.Added, Object: store.Object{
		Key: store.Key{Resource: "pods", Namespace: "ns", Name: "p"}, Value: []byte("{}"), Revision: rev}}
}

// TestBeginAfterEvents checks that a watch whose first events, or whose
// end, came between its registration and Begin (the store's lock is
// released in between) begins all the same, and that a consumer of Next
// finds them.
func TestBeginAfterEvents(t *testing.T) {
	for _, tc := range []struct {
		name string
		meet func(w *Watcher)
	}{
		{"event", func(w *Watcher) { w.Push(podEvent(2)) }},
		{"end", func(w *Watcher) { w.End(store.ErrWatchOverflow) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := New(context.Background(), store.WatchOptions{Resource: "pods", Revision: 1},
				Config{Queue: 10, Remove: func() {}})
			tc.meet(w)
			begun := make(chan struct{})
			go func() { w.Begin(); close(begun) }()
			select {
			case <-begun:
			case <-time.After(5 * time.Second):
				t.Fatal("Begin blocked")
			}
			defer w.Stop()
			select {
			case <-w.Ready():
			case <-time.After(5 * time.Second):
				t.Fatal("not ready")
			}
			evs, ended := w.Next()
			switch tc.name {
			case "event":
				if ended || len(evs) != 1 || evs[0].Object.Revision != 2 {
					t.Fatalf("next: %d events, ended %v", len(evs), ended)
				}
			case "end":
				if !ended || len(evs) != 0 || w.Err() != store.ErrWatchOverflow {
					t.Fatalf("next: %d events, ended %v, err %v", len(evs), ended, w.Err())
				}
			}
		})
	}
}
