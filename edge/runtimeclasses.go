package edge

import (
	"context"
	"fmt"

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
type runtimeClassWatch struct {
	store cache.Store
	ctrl  cache.Controller
}

func newRuntimeClassWatch(a *Agent) *runtimeClassWatch {
	w := &runtimeClassWatch{}
	w.store, w.ctrl = newInformer(&listWatch{
		keep: a.keep(keptClasses),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.nodeAPI.RuntimeClasses().List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.nodeAPI.RuntimeClasses().Watch(ctx, o)
		},
	}, &nodev1.RuntimeClass{}, cache.ResourceEventHandlerFuncs{})
	return w
}

// handler returns the handler of the class named name.
func (w *runtimeClassWatch) handler(name string) (string, error) {
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
