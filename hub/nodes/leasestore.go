package nodes

import (
	"context"
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/storage"
)

// watchStored keeps l.stored equal to the stored Leases of
// kube-node-lease until ctx ends (see storage.Follow). The stored Leases
// are served to clients: the watch's objects are not shared.
func (l *Leases) watchStored(ctx context.Context) {
	storage.Follow(ctx, l.cfg.Storage, leasesKind, corev1.NamespaceNodeLease, storage.FollowOptions{Logger: l.cfg.Logger},
		storage.FollowFuncs{ReplaceFunc: l.replaceStored, ApplyFunc: l.applyStored})
}

// replaceStored makes a list of kube-node-lease the stored Leases. What
// the hub knew of a Lease the list lacks (deleted while the watch was
// down) goes as with a deletion event.
func (l *Leases) replaceStored(obj runtime.Object) error {
	list, ok := obj.(*coordinationv1.LeaseList)
	if !ok {
		return fmt.Errorf("list node leases: unexpected %T", obj)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stored = make(map[string]*coordinationv1.Lease, len(list.Items))
	for i := range list.Items {
		l.setStoredLocked(&list.Items[i])
	}
	for name := range l.renewals {
		if l.stored[name] == nil {
			delete(l.renewals, name)
		}
	}
	listed, err := parseRV(list.ResourceVersion)
	for name, w := range l.written {
		// A write the list is not older than, of a Lease it lacks,
		// was deleted since.
		if l.stored[name] == nil && err == nil && w.rv <= listed {
			delete(l.written, name)
		}
	}
	l.synced = true
	return nil
}

// applyStored records a change of a stored Lease.
func (l *Leases) applyStored(ev watch.EventType, obj runtime.Object) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ev == watch.Deleted {
		delete(l.stored, lease.Name)
		delete(l.renewals, lease.Name)
		delete(l.written, lease.Name)
		return
	}
	l.setStoredLocked(lease)
}

// setStoredLocked records the stored state of a Lease; a renewal made on
// an older state is void.
func (l *Leases) setStoredLocked(lease *coordinationv1.Lease) {
	l.stored[lease.Name] = lease
	if w, ok := l.written[lease.Name]; ok {
		if rv, err := parseRV(lease.ResourceVersion); err == nil && rv >= w.rv {
			delete(l.written, lease.Name)
		}
	}
	if r, ok := l.renewals[lease.Name]; ok && strconv.FormatInt(r.base, 10) != lease.ResourceVersion {
		delete(l.renewals, lease.Name)
	}
}

// heldLocked says whether node's Lease must not be renewed now: a
// client's write of it is under way, or done but not yet among the stored
// Leases, and a renewal could reach watches before the write.
func (l *Leases) heldLocked(node string) bool {
	// A write the stored Leases never show (it failed after all) holds
	// them back for a second at most.
	w, written := l.written[node]
	return l.writes[node] > 0 || written && l.cfg.Now().Sub(w.at) < time.Second
}

// revision returns the store's current revision, or 0 if the storage does
// not tell it (every renewal is then replayed to a resuming watch).
func (l *Leases) revision() int64 {
	if r, ok := l.cfg.Storage.(interface{ Revision() int64 }); ok {
		return r.Revision()
	}
	return 0
}

// parseRV parses a resourceVersion the storage produced.
func parseRV(rv string) (int64, error) {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("parse resource version %q: invalid", rv)
	}
	return n, nil
}

// renewedLocked returns lease with the renewTime of its renewal in memory,
// if there is one for its stored state; lease itself otherwise. Called
// with mu held; lease is not modified.
func (l *Leases) renewedLocked(lease *coordinationv1.Lease) (*coordinationv1.Lease, bool) {
	if lease.Namespace != corev1.NamespaceNodeLease {
		return lease, false
	}
	r, ok := l.renewals[lease.Name]
	if !ok || strconv.FormatInt(r.base, 10) != lease.ResourceVersion {
		return lease, false
	}
	if lease.Spec.RenewTime != nil && !lease.Spec.RenewTime.Before(&r.renewTime) {
		return lease, false
	}
	out := lease.DeepCopy()
	rt := r.renewTime
	out.Spec.RenewTime = &rt
	return out, true
}
