package storage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// Watch implements API.
func (s *Storage) Watch(ctx context.Context, k *registry.Kind, namespace string, opts WatchOptions) (watch.Interface, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, err
	}
	fsel, err := s.fieldSelector(k, opts.Field)
	if err != nil {
		return nil, err
	}
	rv, err := parseRV(opts.ResourceVersion)
	if err != nil {
		return nil, err
	}
	if !k.Namespaced {
		namespace = ""
	}
	w := &watcher{out: make(chan watch.Event), done: make(chan struct{})}
	ctx, w.cancel = context.WithCancel(ctx)
	w.ctx = ctx
	initial := opts.SendInitialEvents == nil && rv == 0
	if opts.SendInitialEvents != nil {
		initial = *opts.SendInitialEvents
	}
	var events []watch.Event
	switch {
	case initial:
		// Synthetic ADDED events for a state not older than rv, then
		// changes from that state's revision. One unpaged read, so
		// that the synthetic events and the revision the watch starts
		// from describe the same state.
		if err := s.waitFor(ctx, rv); err != nil {
			w.cancel()
			return nil, err
		}
		res, err := s.st.List(ctx, store.ListOptions{Resource: s.resource(k), Namespace: namespace,
			Label: opts.Label, Field: fsel})
		if err != nil {
			w.cancel()
			return nil, storeError(err, k.GroupResource(), "")
		}
		rv = res.Revision
		events = make([]watch.Event, 0, len(res.Objects)+1)
		for _, o := range res.Objects {
			obj, err := s.decode(k, o)
			if err != nil {
				w.cancel()
				return nil, err
			}
			events = append(events, watch.Event{Type: watch.Added, Object: obj})
		}
		if opts.SendInitialEvents != nil && opts.AllowBookmarks {
			bm, err := s.bookmark(k, rv, map[string]string{metav1.InitialEventsAnnotationKey: "true"})
			if err != nil {
				w.cancel()
				return nil, err
			}
			events = append(events, watch.Event{Type: watch.Bookmark, Object: bm})
		}
	case rv == 0:
		// No initial events: changes after the current revision.
		rv = s.st.Revision()
	default:
		if err := s.waitFor(ctx, rv); err != nil {
			w.cancel()
			return nil, err
		}
	}
	// Events are decoded and let go: the store need not copy them.
	sw, err := s.st.Watch(ctx, store.WatchOptions{Resource: s.resource(k), Namespace: namespace,
		Label: opts.Label, Field: fsel, Revision: rv, ReadOnly: true})
	if errors.Is(err, store.ErrCompacted) {
		// Past authentication and admission: report as an ERROR event.
		st := expired(rv, s.st.CompactedRevision()).ErrStatus
		w.run = func(send func(watch.Event, bool) bool) {
			defer w.cancel()
			send(watch.Event{Type: watch.Error, Object: &st}, false)
		}
		return w, nil
	}
	if err != nil {
		w.cancel()
		return nil, storeError(err, k.GroupResource(), "")
	}
	// The store's watch ends with ctx, which Stop cancels, however its
	// events are taken.
	w.run = func(send func(watch.Event, bool) bool) {
		s.run(ctx, k, w, sw, events, rv, opts.AllowBookmarks, opts.Shared, send)
	}
	return w, nil
}

// run forwards store events as typed watch events to send, in the
// goroutine of whoever takes them (see watcher).
func (s *Storage) run(ctx context.Context, k *registry.Kind, w *watcher, sw store.Watcher, initial []watch.Event, rv int64, bookmarks, shared bool,
	deliver func(watch.Event, bool) bool) {
	// A watch that owns its objects gets a copy of the shared decoding:
	// copying is cheaper than decoding the change once more.
	decode := s.decodeOwned
	if shared {
		decode = s.decodeShared
	}
	defer w.cancel()
	defer sw.Stop()
	send := func(ev watch.Event, more bool) bool {
		select {
		case <-ctx.Done():
			return false
		case <-w.done:
			return false
		default:
		}
		return deliver(ev, more)
	}
	for i, ev := range initial {
		if !send(ev, i < len(initial)-1) {
			return
		}
	}
	var tick <-chan time.Time
	if bookmarks {
		t := time.NewTicker(s.bmk)
		defer t.Stop()
		tick = t.C
	}
	// A kind that leaves the registry (a deleted custom resource
	// definition) ends its watches, as upstream; one replaced by a kind
	// of the same GVK (a changed definition) serves them from then on.
	var changed <-chan struct{}
	if s.reg != nil {
		changed = s.reg.Changed()
		var ok bool
		if k, ok = s.kindServed(k); !ok {
			return
		}
	}
	last := rv
	// forward sends one store event on; false ends the watch.
	forward := func(ev store.Event, more bool) bool {
		var t watch.EventType
		switch ev.Type {
		case store.Added:
			t = watch.Added
		case store.Modified:
			t = watch.Modified
		case store.Deleted:
			t = watch.Deleted
		default:
			return true
		}
		obj, err := decode(k, ev.Object)
		if err != nil {
			s.log.Error("decode watch event", "key", ev.Object.Key.String(), "err", err)
			return false
		}
		last = ev.Object.Revision
		return send(watch.Event{Type: t, Object: obj}, more)
	}
	ended := func() {
		if err := sw.Err(); err != nil && !errors.Is(err, store.ErrWatchOverflow) && !errors.Is(err, context.Canceled) {
			s.log.Warn("watch ended", "resource", k.QualifiedResource(), "err", err)
		}
	}
	// Events are taken in this goroutine where the store allows it (see
	// store.Batcher), through its channel otherwise.
	var (
		events <-chan store.Event
		ready  <-chan struct{}
	)
	batches, ok := sw.(store.Batcher)
	if ok && batches.Batches() {
		ready = batches.Ready()
	} else {
		events = sw.Events()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.done:
			return
		case <-changed:
			changed = s.reg.Changed()
			var ok bool
			if k, ok = s.kindServed(k); !ok {
				return
			}
		case <-tick:
			obj, err := s.bookmark(k, last, nil)
			if err != nil {
				continue
			}
			if !send(watch.Event{Type: watch.Bookmark, Object: obj}, false) {
				return
			}
		case <-ready:
			evs, end := batches.Next()
			for i, ev := range evs {
				if !forward(ev, i < len(evs)-1) {
					return
				}
			}
			if end {
				ended()
				return
			}
		case ev, ok := <-events:
			if !ok {
				ended()
				return
			}
			if !forward(ev, len(events) > 0) {
				return
			}
		}
	}
}

// bookmark returns an empty object of the kind that carries only the
// resourceVersion rv and the given annotations.
func (s *Storage) bookmark(k *registry.Kind, rv int64, annotations map[string]string) (runtime.Object, error) {
	obj, err := s.newObjectOf(k)
	if err != nil {
		return nil, fmt.Errorf("make bookmark: %w", err)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, fmt.Errorf("make bookmark: %w", err)
	}
	m.SetResourceVersion(strconv.FormatInt(rv, 10))
	m.SetAnnotations(annotations)
	return obj, nil
}

// watcher is the watch.Interface handed to callers. Its events are made
// in the goroutine of whoever takes them: Stream runs the watch in the
// caller's, and ResultChan starts a goroutine that feeds the channel, for
// callers that select over it. A caller uses one or the other. The API
// server streams: a watch then costs one goroutine, its request's, and
// not three.
type watcher struct {
	run     func(send func(ev watch.Event, more bool) bool)
	started atomic.Bool
	out     chan watch.Event
	done    chan struct{}
	once    sync.Once
	ctx     context.Context // ends with the watch
	cancel  context.CancelFunc
}

func (w *watcher) Stop() {
	w.once.Do(func() {
		close(w.done)
		w.cancel()
	})
}

// ResultChan implements watch.Interface.
func (w *watcher) ResultChan() <-chan watch.Event {
	if w.started.CompareAndSwap(false, true) {
		go func() {
			defer close(w.out)
			w.run(func(ev watch.Event, _ bool) bool {
				select {
				case w.out <- ev:
					return true
				case <-w.done:
					return false
				case <-w.ctx.Done():
					return false
				}
			})
		}()
	}
	return w.out
}

// Stream delivers the watch's events to send, in the caller's goroutine,
// until send returns false, the watch ends or Stop is called; more says
// that another event is ready already, so a writer may hold back its
// flush. It must not be called after ResultChan, nor twice.
func (w *watcher) Stream(send func(ev watch.Event, more bool) bool) {
	if !w.started.CompareAndSwap(false, true) {
		panic("storage: watch streamed after it was started")
	}
	w.run(send)
}
