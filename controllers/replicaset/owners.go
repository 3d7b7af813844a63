package replicaset

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// owners is the kind whose objects a Controller keeps replicas for, as
// the controller sees them: apps/v1 ReplicaSets. For ReplicaSets the view
// is the object itself; for ReplicationControllers it is a conversion (see
// replicationControllers), so one sync loop serves both kinds, as in
// kube-controller-manager.
type owners struct {
	// gvk is the kind in the owner references of the pods.
	gvk schema.GroupVersionKind
	// name names the controller in logs and its work queue; component is
	// the source of its events.
	name, component string
	informer        cache.SharedIndexInformer
	// view returns the ReplicaSet view of a cached object, false for an
	// object of another type. The view may share memory with the cache.
	view func(obj any) (*appsv1.ReplicaSet, bool)
	// get reads one object from the hub, as a view.
	get func(ctx context.Context, namespace, name string) (*appsv1.ReplicaSet, error)
	// updateStatus writes the status of a view to the hub.
	updateStatus func(ctx context.Context, rs *appsv1.ReplicaSet) error
	// trimStatus, when set, drops from a computed status what the kind's
	// status cannot hold, so that it compares equal to a stored one.
	trimStatus func(st *appsv1.ReplicaSetStatus)
}

// replicaSets is owners for apps/v1 ReplicaSets.
func replicaSets(client kubernetes.Interface, inf informers.SharedInformerFactory) *owners {
	return &owners{
		gvk:       appsv1.SchemeGroupVersion.WithKind("ReplicaSet"),
		name:      "replicaset",
		component: "replicaset-controller",
		informer:  inf.Apps().V1().ReplicaSets().Informer(),
		view: func(obj any) (*appsv1.ReplicaSet, bool) {
			rs, ok := obj.(*appsv1.ReplicaSet)
			return rs, ok
		},
		get: func(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
			return client.AppsV1().ReplicaSets(ns).Get(ctx, name, metav1.GetOptions{})
		},
		updateStatus: func(ctx context.Context, rs *appsv1.ReplicaSet) error {
			_, err := client.AppsV1().ReplicaSets(rs.Namespace).UpdateStatus(ctx, rs, metav1.UpdateOptions{})
			return err
		},
	}
}

// cached returns the view of the cached object with the namespace/name
// key.
func (o *owners) cached(key string) (*appsv1.ReplicaSet, bool) {
	obj, exists, err := o.informer.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return nil, false
	}
	return o.view(obj)
}

// list returns the views of the cached objects of ns.
func (o *owners) list(ns string) []*appsv1.ReplicaSet {
	var out []*appsv1.ReplicaSet
	_ = cache.ListAllByNamespace(o.informer.GetIndexer(), ns, labels.Everything(), func(obj any) {
		if rs, ok := o.view(obj); ok {
			out = append(out, rs)
		}
	})
	return out
}

// controlledBy returns the views of the cached objects whose controller
// has the given UID.
func (o *owners) controlledBy(uid string) []*appsv1.ReplicaSet {
	var out []*appsv1.ReplicaSet
	for _, obj := range kit.ByIndex[any](o.informer.GetIndexer(), uid) {
		if rs, ok := o.view(obj); ok {
			out = append(out, rs)
		}
	}
	return out
}
