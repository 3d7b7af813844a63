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
// memory and passes each change on to the node's sinks (the eBPF dataplane
// and the DNS server). While the hub is out of reach the informers keep
// their stores and the sinks keep what they were given; when the watches
// resume (or re-list) the sinks get the differences.
type serviceWatch struct {
	services, slices cache.Store
	ctrls            []cache.Controller
}

func newServiceWatch(a *Agent, sinks []serviceSink) *serviceWatch {
	w := &serviceWatch{}
	var ctrl cache.Controller
	w.services, ctrl = newInformer(&listWatch{
		keep: a.keep(keptServices), // local state: offline.go
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.client.Services(metav1.NamespaceAll).List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.client.Services(metav1.NamespaceAll).Watch(ctx, o)
		},
	}, &corev1.Service{}, serviceHandler(sinks))
	w.ctrls = append(w.ctrls, ctrl)
	w.slices, ctrl = newInformer(&listWatch{
		keep: a.keep(keptSlices),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.client.EndpointSlices(metav1.NamespaceAll).List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.client.EndpointSlices(metav1.NamespaceAll).Watch(ctx, o)
		},
	}, &discoveryv1.EndpointSlice{}, sliceHandler(sinks))
	w.ctrls = append(w.ctrls, ctrl)
	return w
}

// run runs the informers until ctx ends, each through goRun.
func (w *serviceWatch) run(ctx context.Context, goRun func(func())) {
	for _, c := range w.ctrls {
		goRun(func() { c.RunWithContext(ctx) })
	}
}

// waitSynced waits until both informers have listed once; false means ctx
// ended first.
func (w *serviceWatch) waitSynced(ctx context.Context) bool {
	synced := make([]cache.InformerSynced, 0, len(w.ctrls))
	for _, c := range w.ctrls {
		synced = append(synced, c.HasSynced)
	}
	return cache.WaitForCacheSync(ctx.Done(), synced...)
}

// servicesSynced tells whether the Service informer listed once.
func (w *serviceWatch) servicesSynced() bool { return w.ctrls[0].HasSynced() }

// deletedObject unwraps the tombstone a re-list leaves for an object whose
// delete event was missed.
func deletedObject(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

func serviceHandler(sinks []serviceSink) cache.ResourceEventHandler {
	upsert := func(obj any) {
		if svc, ok := obj.(*corev1.Service); ok {
			for _, s := range sinks {
				s.UpsertService(svc)
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { upsert(obj) },
		UpdateFunc: func(_, obj any) { upsert(obj) },
		DeleteFunc: func(obj any) {
			if svc, ok := deletedObject(obj).(*corev1.Service); ok {
				for _, s := range sinks {
					s.DeleteService(svc.Namespace, svc.Name)
				}
			}
		},
	}
}

func sliceHandler(sinks []serviceSink) cache.ResourceEventHandler {
	upsert := func(obj any) {
		if es, ok := obj.(*discoveryv1.EndpointSlice); ok {
			for _, s := range sinks {
				s.UpsertEndpointSlice(es)
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { upsert(obj) },
		UpdateFunc: func(_, obj any) { upsert(obj) },
		DeleteFunc: func(obj any) {
			if es, ok := deletedObject(obj).(*discoveryv1.EndpointSlice); ok {
				for _, s := range sinks {
					s.DeleteEndpointSlice(es.Namespace, es.Name)
				}
			}
		},
	}
}
