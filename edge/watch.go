package edge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/localstate"
)

// Reflectors re-list whenever a watch fails in a way they do not recognise
// as "the server is unreachable", and whenever a watch ends within a second
// without events. Over a tunnel to a hub that restarts, both happen all the
// time although nothing was lost: the hub keeps its change log, so a watch
// resumed from the last resourceVersion gets exactly what was missed. The
// agent's list-watchers make both cases look like what they are, so that
// reflectors resume instead of re-listing. A watch whose resourceVersion the
// hub no longer has still gets 410 Gone, and that re-lists as it must.

// listWatch is a cache.ListerWatcher with the behaviour above.
type listWatch struct {
	list  func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
	watch func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	// keep, when set, makes the informer a kept informer: its objects
	// and resourceVersion are kept in the agent's local state
	// (edge/localstate).
	keep *localstate.Spec
}

var (
	_ cache.ListerWatcher            = (*listWatch)(nil)
	_ cache.ListerWatcherWithContext = (*listWatch)(nil)
)

func (lw *listWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(context.Background(), opts)
}

func (lw *listWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(context.Background(), opts)
}

func (lw *listWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return lw.list(ctx, opts)
}

func (lw *listWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := lw.watch(ctx, opts)
	if err != nil {
		var status apierrors.APIStatus
		if errors.As(err, &status) || ctx.Err() != nil {
			return nil, err
		}
		// The request never got an answer from the hub: the tunnel
		// was down or went down. Say so in the terms reflectors retry.
		return nil, fmt.Errorf("hub unreachable: %w: %w", syscall.ECONNREFUSED, err)
	}
	return holdWatch(w, time.Second), nil
}

// heldWatch passes events through, but when its watch ends without any
// event it closes no earlier than min after it started.
type heldWatch struct {
	in      watch.Interface
	out     chan watch.Event
	stopped chan struct{}
	once    sync.Once
}

func holdWatch(in watch.Interface, min time.Duration) watch.Interface {
	h := &heldWatch{in: in, out: make(chan watch.Event), stopped: make(chan struct{})}
	go h.run(min)
	return h
}

func (h *heldWatch) run(min time.Duration) {
	defer close(h.out)
	start := time.Now()
	events := 0
	for ev := range h.in.ResultChan() {
		if localstate.BrokenStream(ev) {
			// The connection under the watch broke; what the hub
			// sent so far was delivered. End the watch like a
			// normal close so that it resumes.
			h.in.Stop()
			break
		}
		events++
		select {
		case h.out <- ev:
		case <-h.stopped:
			return
		}
	}
	if events > 0 {
		return
	}
	t := time.NewTimer(min - time.Since(start))
	defer t.Stop()
	select {
	case <-t.C:
	case <-h.stopped:
	}
}

func (h *heldWatch) Stop() {
	h.once.Do(func() {
		close(h.stopped)
		h.in.Stop()
	})
}

func (h *heldWatch) ResultChan() <-chan watch.Event { return h.out }

// newInformer returns a store and the controller that fills it from lw, and
// from the local state when lw keeps its objects there.
func newInformer(lw *listWatch, obj runtime.Object, h cache.ResourceEventHandler) (cache.Store, cache.Controller) {
	if lw.keep != nil {
		return localstate.NewInformer(*lw.keep, lw.list, lw.watch, obj, h)
	}
	return cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher:   lw,
		ObjectType:      obj,
		Handler:         h,
		MinWatchTimeout: localstate.MinWatchTimeout,
	})
}
