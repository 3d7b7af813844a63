package nodes

import (
	"context"
	"strconv"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// Serve returns api with the Leases of kube-node-lease answered as the
// package documentation describes ("Node Leases"): reads and watches show
// the renewals kept in memory, writes accept the resourceVersions those
// carry. Every other kind and namespace goes to api untouched.
func (l *Leases) Serve(api storage.API) storage.API {
	return &leaseAPI{API: api, l: l}
}

// leaseAPI is the storage the API server uses when node Leases are kept
// in memory.
type leaseAPI struct {
	storage.API
	l *Leases
}

// covers says whether a request of kind k in namespace may involve node
// Leases: leases in kube-node-lease or in all namespaces.
func covers(k *registry.Kind, namespace string) bool {
	return k.GroupResource() == leasesKind.GroupResource() && (namespace == "" || namespace == corev1.NamespaceNodeLease)
}

// Get implements storage.API.
func (a *leaseAPI) Get(ctx context.Context, k *registry.Kind, namespace, name string) (runtime.Object, error) {
	obj, err := a.API.Get(ctx, k, namespace, name)
	if err != nil || namespace != corev1.NamespaceNodeLease || !covers(k, namespace) {
		return obj, err
	}
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return obj, nil
	}
	a.l.mu.Lock()
	out, _ := a.l.renewedLocked(lease)
	a.l.mu.Unlock()
	return out, nil
}

// List implements storage.API.
func (a *leaseAPI) List(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (runtime.Object, error) {
	obj, err := a.API.List(ctx, k, namespace, opts)
	if err != nil || !covers(k, namespace) {
		return obj, err
	}
	list, ok := obj.(*coordinationv1.LeaseList)
	if !ok {
		return obj, nil
	}
	a.l.mu.Lock()
	for i := range list.Items {
		if out, ok := a.l.renewedLocked(&list.Items[i]); ok {
			list.Items[i] = *out
		}
	}
	a.l.mu.Unlock()
	return list, nil
}

// ListJSON answers plain JSON lists from the store's bytes where the
// wrapped storage can, except for lists that may hold node Leases.
func (a *leaseAPI) ListJSON(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (*storage.JSONList, bool, error) {
	jl, ok := a.API.(interface {
		ListJSON(context.Context, *registry.Kind, string, storage.ListOptions) (*storage.JSONList, bool, error)
	})
	if !ok || covers(k, namespace) {
		return nil, false, nil
	}
	return jl.ListJSON(ctx, k, namespace, opts)
}

// Update implements storage.API. A resourceVersion a renewal's read or
// watch event carried is taken as the stored one it renewed.
func (a *leaseAPI) Update(ctx context.Context, k *registry.Kind, namespace, name string, obj runtime.Object, opts storage.Options) (runtime.Object, error) {
	if namespace == corev1.NamespaceNodeLease && covers(k, namespace) {
		if m, err := meta.Accessor(obj); err == nil && m.GetResourceVersion() != "" {
			if cur, err := a.API.Get(ctx, k, namespace, name); err == nil {
				if cm, err := meta.Accessor(cur); err == nil {
					m.SetResourceVersion(a.l.precondition(m.GetResourceVersion(), cm.GetResourceVersion()))
				}
			}
		}
	}
	return a.API.Update(ctx, k, namespace, name, obj, opts)
}

// GuaranteedUpdate implements storage.API: the current object handed to
// tryUpdate carries the renewal in memory, so that a patch stores it, and
// a resourceVersion pinned from a renewal is taken as the stored one.
func (a *leaseAPI) GuaranteedUpdate(ctx context.Context, k *registry.Kind, namespace, name string, opts storage.Options, tryUpdate func(current runtime.Object) (runtime.Object, error)) (runtime.Object, error) {
	if namespace != corev1.NamespaceNodeLease || !covers(k, namespace) {
		return a.API.GuaranteedUpdate(ctx, k, namespace, name, opts, tryUpdate)
	}
	return a.API.GuaranteedUpdate(ctx, k, namespace, name, opts, func(cur runtime.Object) (runtime.Object, error) {
		stored := ""
		if lease, ok := cur.(*coordinationv1.Lease); ok {
			stored = lease.ResourceVersion
			a.l.mu.Lock()
			if out, ok := a.l.renewedLocked(lease); ok {
				*lease = *out
			}
			a.l.mu.Unlock()
		}
		obj, err := tryUpdate(cur)
		if err != nil || stored == "" {
			return obj, err
		}
		if m, err := meta.Accessor(obj); err == nil && m.GetResourceVersion() != "" {
			m.SetResourceVersion(a.l.precondition(m.GetResourceVersion(), stored))
		}
		return obj, nil
	})
}

// precondition returns the resourceVersion a write of a node Lease is
// checked against: stored when the client's rv is one the hub may have
// given for that stored state (not older than it, not newer than the
// store), rv itself otherwise.
func (l *Leases) precondition(rv, stored string) string {
	p, err := parseRV(rv)
	if err != nil {
		return rv
	}
	s, err := parseRV(stored)
	if err != nil || p < s {
		return rv
	}
	if cur := l.revision(); cur != 0 && p > cur {
		return rv
	}
	return strconv.FormatInt(s, 10)
}
