package nodes

import (
	"context"
	"errors"
	"strconv"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	return storedJSON(ctx, a.API, !covers(k, namespace), k, namespace, opts)
}

// ListProtobuf answers plain protobuf lists from the wrapped storage's
// item encodings where it can, except for lists that may hold node Leases.
func (a *leaseAPI) ListProtobuf(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (*storage.ProtoList, bool, error) {
	return storedProtobuf(ctx, a.API, !covers(k, namespace), k, namespace, opts)
}

// ProtoItem passes a watch event's protobuf item on to the wrapped
// storage (storage.Storage.ProtoItem), except for Leases, whose watch
// events may carry renewals held in memory.
func (a *leaseAPI) ProtoItem(k *registry.Kind, obj runtime.Object) ([]byte, bool) {
	return storedItem(a.API, !covers(k, ""), k, obj)
}

// storedItem passes a watch event's object on to api's protobuf item
// cache when may is set and api has one; a wrapper whose watch events are
// not the stored objects clears may for them.
func storedItem(api storage.API, may bool, k *registry.Kind, obj runtime.Object) ([]byte, bool) {
	pi, ok := api.(interface {
		ProtoItem(*registry.Kind, runtime.Object) ([]byte, bool)
	})
	if !ok || !may {
		return nil, false
	}
	return pi.ProtoItem(k, obj)
}

// storedJSON passes a plain JSON list on to api's stored-bytes answer
// when may is set and api has one; a wrapper that changes what List
// returns clears may for the lists it changes.
func storedJSON(ctx context.Context, api storage.API, may bool, k *registry.Kind, namespace string, opts storage.ListOptions) (*storage.JSONList, bool, error) {
	jl, ok := api.(interface {
		ListJSON(context.Context, *registry.Kind, string, storage.ListOptions) (*storage.JSONList, bool, error)
	})
	if !ok || !may {
		return nil, false, nil
	}
	return jl.ListJSON(ctx, k, namespace, opts)
}

// storedProtobuf is storedJSON for plain protobuf lists.
func storedProtobuf(ctx context.Context, api storage.API, may bool, k *registry.Kind, namespace string, opts storage.ListOptions) (*storage.ProtoList, bool, error) {
	pl, ok := api.(interface {
		ListProtobuf(context.Context, *registry.Kind, string, storage.ListOptions) (*storage.ProtoList, bool, error)
	})
	if !ok || !may {
		return nil, false, nil
	}
	return pl.ListProtobuf(ctx, k, namespace, opts)
}

// Update implements storage.API. A resourceVersion a renewal's read or
// watch event carried is taken as the stored one it renewed; a Lease whose
// renewTime is older than the renewal in memory was read before it and
// conflicts, as it would have after a stored renewal.
func (a *leaseAPI) Update(ctx context.Context, k *registry.Kind, namespace, name string, obj runtime.Object, opts storage.Options) (runtime.Object, error) {
	if namespace != corev1.NamespaceNodeLease || !covers(k, namespace) {
		return a.API.Update(ctx, k, namespace, name, obj, opts)
	}
	if opts.DryRun {
		return a.update(ctx, k, namespace, name, obj, opts)
	}
	done := a.l.clientWrite(name)
	out, err := a.update(ctx, k, namespace, name, obj, opts)
	done(out)
	return out, err
}

func (a *leaseAPI) update(ctx context.Context, k *registry.Kind, namespace, name string, obj runtime.Object, opts storage.Options) (runtime.Object, error) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok || lease.ResourceVersion == "" {
		return a.API.Update(ctx, k, namespace, name, obj, opts)
	}
	cur, err := a.API.Get(ctx, k, namespace, name)
	if err != nil {
		return a.API.Update(ctx, k, namespace, name, obj, opts)
	}
	stored := cur.(*coordinationv1.Lease)
	rv := a.l.precondition(lease.ResourceVersion, stored.ResourceVersion)
	if rv == stored.ResourceVersion {
		a.l.mu.Lock()
		renewed, ok := a.l.renewedLocked(stored)
		a.l.mu.Unlock()
		if ok && (lease.Spec.RenewTime == nil || lease.Spec.RenewTime.Before(renewed.Spec.RenewTime)) {
			return nil, apierrors.NewConflict(leasesKind.GroupResource(), name,
				errors.New("the object has been modified; please apply your changes to the latest version and try again"))
		}
	}
	lease.ResourceVersion = rv
	return a.API.Update(ctx, k, namespace, name, obj, opts)
}

// GuaranteedUpdate implements storage.API: the current object handed to
// tryUpdate carries the renewal in memory, so that a patch stores it, and
// a resourceVersion pinned from a renewal is taken as the stored one.
func (a *leaseAPI) GuaranteedUpdate(ctx context.Context, k *registry.Kind, namespace, name string, opts storage.Options, tryUpdate func(current runtime.Object) (runtime.Object, error)) (runtime.Object, error) {
	if namespace != corev1.NamespaceNodeLease || !covers(k, namespace) {
		return a.API.GuaranteedUpdate(ctx, k, namespace, name, opts, tryUpdate)
	}
	done := func(runtime.Object) {}
	if !opts.DryRun {
		done = a.l.clientWrite(name)
	}
	out, err := a.API.GuaranteedUpdate(ctx, k, namespace, name, opts, func(cur runtime.Object) (runtime.Object, error) {
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
	done(out)
	return out, err
}

// Apply implements storage.API: the renewal in memory is stored first, so
// that the applied Lease keeps it.
func (a *leaseAPI) Apply(ctx context.Context, k *registry.Kind, namespace, name string, patch []byte, opts storage.Options) (runtime.Object, bool, error) {
	if namespace != corev1.NamespaceNodeLease || !covers(k, namespace) || opts.DryRun {
		return a.API.Apply(ctx, k, namespace, name, patch, opts)
	}
	done := a.l.clientWrite(name)
	out, created, err := a.apply(ctx, k, namespace, name, patch, opts)
	done(out)
	return out, created, err
}

func (a *leaseAPI) apply(ctx context.Context, k *registry.Kind, namespace, name string, patch []byte, opts storage.Options) (runtime.Object, bool, error) {
	a.l.mu.Lock()
	r, ok := a.l.renewals[name]
	a.l.mu.Unlock()
	if ok {
		_, err := a.API.GuaranteedUpdate(ctx, k, namespace, name, storage.Options{FieldManager: "tether-hub"}, func(cur runtime.Object) (runtime.Object, error) {
			lease := cur.(*coordinationv1.Lease)
			if lease.ResourceVersion != strconv.FormatInt(r.base, 10) {
				return nil, errRenewalVoid
			}
			rt := r.renewTime
			lease.Spec.RenewTime = &rt
			return lease, nil
		})
		if err != nil && !errors.Is(err, errRenewalVoid) && !apierrors.IsNotFound(err) {
			return nil, false, err
		}
	}
	return a.API.Apply(ctx, k, namespace, name, patch, opts)
}

var errRenewalVoid = errors.New("renewal made on an older Lease")

// clientWrite holds back renewals of node's Lease until the returned
// function has been called with the write's result and the stored Leases
// show it: a renewal made on the Lease before the write could otherwise
// reach watches after a renewTime newer than the one the write stores.
func (l *Leases) clientWrite(node string) func(runtime.Object) {
	l.mu.Lock()
	l.writes[node]++
	l.mu.Unlock()
	return func(obj runtime.Object) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.writes[node]--; l.writes[node] <= 0 {
			delete(l.writes, node)
		}
		lease, ok := obj.(*coordinationv1.Lease)
		if !ok || lease == nil {
			return
		}
		rv, err := parseRV(lease.ResourceVersion)
		if err != nil {
			return
		}
		if cur := l.stored[node]; cur != nil {
			if s, err := parseRV(cur.ResourceVersion); err == nil && s >= rv {
				return
			}
		}
		if rv > l.written[node].rv {
			l.written[node] = writtenMark{rv: rv, at: l.cfg.Now()}
		}
	}
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
