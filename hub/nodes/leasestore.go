package nodes

import (
	"context"
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/storage"
)

// watchStored keeps l.stored equal to the stored Leases of
// kube-node-lease until ctx ends: a list, then a watch from its revision,
// and again after the watch ends.
func (l *Leases) watchStored(ctx context.Context) {
	for ctx.Err() == nil {
		if err := l.syncStored(ctx); err != nil && ctx.Err() == nil {
			l.cfg.Logger.Warn("node lease watch ended; starting again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (l *Leases) syncStored(ctx context.Context) error {
	obj, err := l.cfg.Storage.List(ctx, leasesKind, corev1.NamespaceNodeLease, storage.ListOptions{})
	if err != nil {
		return fmt.Errorf("list node leases: %w", err)
	}
	list := obj.(*coordinationv1.LeaseList)
	l.mu.Lock()
	l.stored = make(map[string]*coordinationv1.Lease, len(list.Items))
	for i := range list.Items {
		l.setStoredLocked(&list.Items[i])
	}
	l.synced = true
	l.mu.Unlock()
	w, err := l.cfg.Storage.Watch(ctx, leasesKind, corev1.NamespaceNodeLease, storage.WatchOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		return fmt.Errorf("watch node leases: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("watch node leases: watch closed")
			}
			lease, isLease := ev.Object.(*coordinationv1.Lease)
			switch {
			case ev.Type == watch.Error:
				return fmt.Errorf("watch node leases: %w", apierrors.FromObject(ev.Object))
			case !isLease:
			case ev.Type == watch.Added || ev.Type == watch.Modified:
				l.mu.Lock()
				l.setStoredLocked(lease)
				l.mu.Unlock()
			case ev.Type == watch.Deleted:
				l.mu.Lock()
				delete(l.stored, lease.Name)
				delete(l.renewals, lease.Name)
				delete(l.written, lease.Name)
				l.mu.Unlock()
			}
		}
	}
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
