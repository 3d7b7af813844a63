package edge

import (
	"context"
	"fmt"
	"sync"
	"time"

	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// runtimeClassWatch keeps every RuntimeClass of the cluster in memory, as
// the kubelet's RuntimeClass manager does, so that a pod's
// spec.runtimeClassName maps to the handler its containers run with. The
// informer is kept in the local state: a node cut off from the hub, or
// restarted while cut off, still knows its classes.
//
// Unlike the kubelet's, the informer starts only when a pod of the node
// first names a class: a watch costs the hub tens of kilobytes per node,
// and most nodes run no pod with a class. A node restarted while cut off
// starts it when such a pod is started again, from the local state.
type runtimeClassWatch struct {
	store    cache.Store
	ctrl     cache.Controller
	wanted   chan struct{} // closed when a pod first names a class
	wantOnce sync.Once
}

func newRuntimeClassWatch(a *Agent) *runtimeClassWatch {
	w := &runtimeClassWatch{wanted: make(chan struct{})}
	w.store, w.ctrl = newInformer(&listWatch{
		keep: a.keep(keptClasses),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.client.RuntimeClasses().List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.client.RuntimeClasses().Watch(ctx, o)
		},
	}, &nodev1.RuntimeClass{}, cache.ResourceEventHandlerFuncs{})
	return w
}

// run runs the informer, once a pod has named a class, until ctx ends.
func (w *runtimeClassWatch) run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-w.wanted:
	}
	w.ctrl.RunWithContext(ctx)
}

// classSyncWait bounds how long the first pod to name a class waits for
// the informer it starts to read the classes.
const classSyncWait = 5 * time.Second

// handler returns the handler of the class named name. The first call
// starts the informer and waits a little for it; until it has read the
// classes, the answer is ErrSourceNotReady and the pod waits.
func (w *runtimeClassWatch) handler(name string) (string, error) {
	if w != nil {
		first := false
		w.wantOnce.Do(func() { close(w.wanted); first = true })
		if first {
			stop := make(chan struct{})
			t := time.AfterFunc(classSyncWait, func() { close(stop) })
			cache.WaitForCacheSync(stop, w.ctrl.HasSynced)
			t.Stop()
		}
	}
	if w == nil || !w.ctrl.HasSynced() {
		return "", fmt.Errorf("runtime classes not read yet: %w", ErrSourceNotReady)
	}
	obj, ok, err := w.store.GetByKey(name)
	if err != nil {
		return "", fmt.Errorf("read runtime class %s: %w", name, err)
	}
	if !ok {
		return "", runtimeClassNotFound{name}
	}
	return obj.(*nodev1.RuntimeClass).Handler, nil
}

// runtimeClassNotFound is the NotFound error of the kubelet's RuntimeClass
// lister, its error for a pod whose class does not exist; it is an
// ErrSourceNotFound.
type runtimeClassNotFound struct{ name string }

func (e runtimeClassNotFound) Error() string {
	return apierrors.NewNotFound(nodev1.Resource("runtimeclass"), e.name).Error()
}

func (runtimeClassNotFound) Is(target error) bool { return target == ErrSourceNotFound }

// RuntimeHandler implements Sources with the agent's RuntimeClass
// informer.
func (s agentSources) RuntimeHandler(className string) (string, error) {
	return s.a.classes.handler(className)
}
