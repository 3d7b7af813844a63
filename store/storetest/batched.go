package storetest

import (
	"context"
	"sync"

	"github.com/tether-edge/tether/store"
)

// Batched returns s with every watch that offers it consumed through
// store.Batcher instead of Events, so that running the suite on it checks
// that way of taking events as well. Watches that cannot be batched (see
// Batcher.Batches) are left as they are.
func Batched(s store.Store) store.Store {
	if c, ok := s.(Compactor); ok {
		return struct {
			batchedStore
			Compactor
		}{batchedStore{s}, c}
	}
	return batchedStore{s}
}

type batchedStore struct{ store.Store }

func (b batchedStore) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher, error) {
	w, err := b.Store.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	bw, ok := w.(store.Batcher)
	if !ok || !bw.Batches() {
		return w, nil
	}
	bt := &batchedWatcher{Watcher: w, out: make(chan store.Event), done: make(chan struct{})}
	go bt.run(bw)
	return bt, nil
}

// batchedWatcher feeds the events it takes through Next to a channel of
// its own, as a consumer in the store's place would.
type batchedWatcher struct {
	store.Watcher
	out  chan store.Event
	once sync.Once
	done chan struct{}
}

func (w *batchedWatcher) run(b store.Batcher) {
	defer close(w.out)
	for {
		select {
		case <-b.Ready():
		case <-w.done:
			return
		}
		evs, ended := b.Next()
		for _, ev := range evs {
			select {
			case w.out <- ev:
			case <-w.done:
				return
			}
		}
		if ended {
			return
		}
	}
}

func (w *batchedWatcher) Events() <-chan store.Event { return w.out }

func (w *batchedWatcher) Stop() {
	w.once.Do(func() { close(w.done) })
	w.Watcher.Stop()
}
