// Package watchq is the watch machinery the SQL store backends share. A
// Watcher queues the events its store fans out to it under the store's
// lock, and hands them to its consumer either through a channel fed by a
// goroutine of its own or in batches through store.Batcher. A Set holds a
// store's watchers and routes each event only to those that may want it.
//
// What differs between the stores stays with them: how a watch replays
// the change log when the recent events in memory no longer reach back to
// its revision, any event a store's watcher declines beyond its resource
// and namespace, and Watch itself, with its locking and its checks of the
// revision asked for. The package takes no lock of a store: a method says
// when the caller must hold it, and Config.Remove takes it.
package watchq

import (
	"context"
	"maps"
	"sync"

	"k8s.io/apimachinery/pkg/selection"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/eventring"
)

// Config is what a store supplies to each of its watchers.
type Config struct {
	// Queue is how many events may wait for the consumer; one more ends
	// the watch with store.ErrWatchOverflow.
	Queue int
	// Replay delivers the change log's events in (from, to] that the
	// watch's resource and namespace select, oldest first, through send.
	// The events are the watch's own: send copies nothing. When send
	// reports false the watch ended, and Replay returns nil at once. It
	// runs in the watch's goroutine, without the store's lock.
	Replay func(ctx context.Context, from, to int64, send func(store.Event) bool) error
	// Remove takes the watcher out of the store's Set, under the store's
	// lock, which Remove takes.
	Remove func()
}

// Watcher is one watch of a store. It implements store.Watcher and
// store.Batcher.
type Watcher struct {
	cfg  Config
	opts store.WatchOptions
	out  chan store.Event
	// index is the field an equality term of the watch's field selector
	// requires, and value its value: the watch is routed only the events
	// whose object has (or had) that value. Empty: every event of the
	// resource is queued and filtered by the watch.
	index, value string

	// replay (from, to] from the change log before the queue, if to > from.
	replayFrom, replayTo int64

	mu     sync.Mutex
	queue  []*store.Event
	signal chan struct{}

	// ctx is the context given to Watch; the goroutine that feeds out
	// starts with the first call of Events (see store.Batcher).
	ctx     context.Context
	started sync.Once
	stopCtx func() bool // under mu

	endOnce sync.Once
	ended   chan struct{}
	err     error
}

// New returns a watcher for opts that ends with ctx once Begin is called.
func New(ctx context.Context, opts store.WatchOptions, cfg Config) *Watcher {
	w := &Watcher{
		cfg:    cfg,
		opts:   opts,
		ctx:    ctx,
		signal: make(chan struct{}, 1),
		ended:  make(chan struct{}),
	}
	w.index, w.value = watchIndex(opts)
	return w
}

// Options returns the options the watch was started with.
func (w *Watcher) Options() store.WatchOptions { return w.opts }

// Fill queues the events of ring after the watch's revision or, when the
// ring no longer reaches back to it, has the watch replay the change log
// up to head first. The store's lock is held, and the watcher is not yet
// in the store's Set.
func (w *Watcher) Fill(ring *eventring.Ring, head int64) {
	if recent, ok := ring.Since(w.opts.Revision); ok {
		for _, ev := range recent {
			if w.wants(ev) {
				w.queue = append(w.queue, ev)
			}
		}
	} else {
		w.replayFrom, w.replayTo = w.opts.Revision, head
	}
}

// Begin readies a watch the store has put in its Set, after releasing its
// lock: the events Fill queued are pending for a consumer of Next, and the
// watch ends with its context whichever way it is consumed.
func (w *Watcher) Begin() {
	// An event published or an end since the store's lock was released
	// may have signalled already: the signal is pending either way.
	select {
	case w.signal <- struct{}{}:
	default:
	}
	// A watch consumed through Next has no goroutine of its own to notice
	// the end of its context.
	stop := context.AfterFunc(w.ctx, w.Stop)
	w.mu.Lock()
	w.stopCtx = stop
	w.mu.Unlock()
	select {
	case <-w.ended:
		// Ended before the registration was recorded.
		stop()
	default:
	}
}

// Events implements store.Watcher.
func (w *Watcher) Events() <-chan store.Event {
	w.started.Do(func() {
		w.out = make(chan store.Event, 64)
		go w.run(w.ctx)
	})
	return w.out
}

// Batches implements store.Batcher: a watch with no change log to replay
// can be consumed through Next.
func (w *Watcher) Batches() bool { return w.replayTo <= w.replayFrom }

// Ready implements store.Batcher.
func (w *Watcher) Ready() <-chan struct{} { return w.signal }

// Next implements store.Batcher: the queued events, filtered, and copied
// unless the watch is read-only.
func (w *Watcher) Next() ([]store.Event, bool) {
	select {
	case <-w.ended:
		return nil, true
	default:
	}
	w.mu.Lock()
	q := w.queue
	w.queue = nil
	w.mu.Unlock()
	evs := make([]store.Event, 0, len(q))
	for _, ev := range q {
		if e, ok := w.filter(*ev, w.opts.ReadOnly); ok {
			evs = append(evs, e)
		}
	}
	return evs, false
}

// Err implements store.Watcher.
func (w *Watcher) Err() error {
	<-w.ended
	return w.err
}

// Stop implements store.Watcher.
func (w *Watcher) Stop() {
	w.cfg.Remove()
	w.End(nil)
}

// End ends the watch with err, if it has not ended; nil is a clean end.
// It does not take the watcher out of the store's Set.
func (w *Watcher) End(err error) {
	w.endOnce.Do(func() {
		w.err = err
		close(w.ended)
		w.mu.Lock()
		stop := w.stopCtx
		w.mu.Unlock()
		if stop != nil {
			stop()
		}
		// A consumer of Next learns of the end from Ready.
		select {
		case w.signal <- struct{}{}:
		default:
		}
	})
}

func (w *Watcher) wants(ev *store.Event) bool {
	k := ev.Object.Key
	return (w.opts.Resource == "" || w.opts.Resource == k.Resource) &&
		(w.opts.Namespace == "" || w.opts.Namespace == k.Namespace)
}

// Push queues one event; called with the store lock held. It reports false
// when the watcher overflowed and must be dropped.
func (w *Watcher) Push(ev *store.Event) bool {
	if !w.wants(ev) {
		return true
	}
	w.mu.Lock()
	if len(w.queue) >= w.cfg.Queue {
		w.queue = nil
		w.mu.Unlock()
		w.End(store.ErrWatchOverflow)
		return false
	}
	w.queue = append(w.queue, ev)
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
	return true
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.out)
	defer w.cfg.Remove()
	if w.replayTo > w.replayFrom {
		err := w.cfg.Replay(ctx, w.replayFrom, w.replayTo, func(ev store.Event) bool {
			return w.send(ctx, ev, true)
		})
		if err == nil {
			err = w.errOr(nil)
		}
		if err != nil {
			if ctx.Err() != nil {
				err = nil
			}
			w.End(err)
			return
		}
	}
	for {
		w.mu.Lock()
		q := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, ev := range q {
			if !w.send(ctx, *ev, w.opts.ReadOnly) {
				return
			}
		}
		if len(q) > 0 {
			continue
		}
		select {
		case <-w.signal:
		case <-w.ended:
			return
		case <-ctx.Done():
			w.End(nil)
			return
		}
	}
}

// send filters and delivers one event; false when the watch ended. An
// event that shares the store's state is copied unless shared says the
// consumer may have it as it is: it was read for this watch alone, or the
// watch is read-only.
func (w *Watcher) send(ctx context.Context, ev store.Event, shared bool) bool {
	ev, ok := w.filter(ev, shared)
	if !ok {
		return true
	}
	select {
	case <-w.ended:
		return false
	default:
	}
	select {
	case w.out <- ev:
		return true
	case <-w.ended:
		return false
	case <-ctx.Done():
		w.End(nil)
		return false
	}
}

// filter applies the watch's selectors to one event, and copies what it
// delivers out of the store's state unless shared says the consumer may
// have it as it is.
func (w *Watcher) filter(ev store.Event, shared bool) (store.Event, bool) {
	ev, ok := store.FilterEvent(w.opts.Label, w.opts.Field, ev)
	if !ok {
		return ev, false
	}
	if !shared {
		ev.Object = cloneObject(ev.Object)
		if ev.Prev != nil {
			p := cloneObject(*ev.Prev)
			ev.Prev = &p
		}
	}
	return ev, true
}

func (w *Watcher) errOr(def error) error {
	select {
	case <-w.ended:
		return w.err
	default:
		return def
	}
}

func cloneObject(o store.Object) store.Object {
	o.Value = append([]byte{}, o.Value...)
	o.Labels = maps.Clone(o.Labels)
	o.Fields = maps.Clone(o.Fields)
	return o
}

// watchIndex returns the field and value of the first equality term of a
// field selector, if any. A thousand agents each watching the pods bound to
// their node would otherwise wake a thousand goroutines per pod change.
func watchIndex(opts store.WatchOptions) (field, value string) {
	if opts.Resource == "" || opts.Field == nil {
		return "", ""
	}
	for _, r := range opts.Field.Requirements() {
		if r.Operator == selection.Equals || r.Operator == selection.DoubleEquals {
			return r.Field, r.Value
		}
	}
	return "", ""
}
