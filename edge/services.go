package edge

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// serviceWatch keeps every Service and EndpointSlice of the cluster in
// memory for the node's data plane and DNS, which program them from these
// stores.
type serviceWatch struct {
	services, slices cache.Store
	ctrls            []cache.Controller
}

func newServiceWatch(a *Agent) *serviceWatch {
	w := &serviceWatch{}
	var ctrl cache.Controller
	w.services, ctrl = newInformer(&listWatch{
		keep: a.keep(keptServices), // local state: offline.go
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.core.Services(metav1.NamespaceAll).List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.core.Services(metav1.NamespaceAll).Watch(ctx, o)
		},
	}, &corev1.Service{}, cache.ResourceEventHandlerFuncs{})
	w.ctrls = append(w.ctrls, ctrl)
	w.slices, ctrl = newInformer(&listWatch{
		keep: a.keep(keptSlices),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.discovery.EndpointSlices(metav1.NamespaceAll).List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.discovery.EndpointSlices(metav1.NamespaceAll).Watch(ctx, o)
		},
	}, &discoveryv1.EndpointSlice{}, cache.ResourceEventHandlerFuncs{})
	w.ctrls = append(w.ctrls, ctrl)
	return w
}

func (w *serviceWatch) run(ctx context.Context) {
	for _, c := range w.ctrls {
		go c.RunWithContext(ctx)
	}
}
