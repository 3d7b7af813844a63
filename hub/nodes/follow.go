package nodes

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// follow keeps an in-memory view of one kind current until ctx ends: a
// list handed to reset, then a watch from the list's revision whose
// changes go to apply, and the same again a second after the watch ends.
// The watch shares its decoded objects with the hub's other watches, so
// reset and apply must keep nothing of them they could change.
func follow(ctx context.Context, st storage.API, k *registry.Kind, what string, log func(msg string, args ...any),
	reset func(list runtime.Object), apply func(ev watch.EventType, obj runtime.Object)) {
	for ctx.Err() == nil {
		if err := followOnce(ctx, st, k, reset, apply); err != nil && ctx.Err() == nil {
			log(what+" watch ended; starting again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func followOnce(ctx context.Context, st storage.API, k *registry.Kind,
	reset func(runtime.Object), apply func(watch.EventType, runtime.Object)) error {
	list, err := st.List(ctx, k, "", storage.ListOptions{})
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	reset(list)
	w, err := st.Watch(ctx, k, "", storage.WatchOptions{ResourceVersion: lm.GetResourceVersion(), Shared: true})
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("watch closed")
			}
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				apply(ev.Type, ev.Object)
			case watch.Error:
				return fmt.Errorf("watch error: %v", ev.Object)
			}
		}
	}
}
