package nodes

import (
	"context"
	"strconv"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// leaseWatch is a watch of Leases that may hold node Leases: the stored
// changes of the wrapped storage's watch, with the renewals in memory
// sent between them as MODIFIED events (see the package documentation).
type leaseWatch struct {
	l     *Leases
	label labels.Selector
	field fields.Selector

	out  chan watch.Event
	done chan struct{}
	once sync.Once
	kick chan struct{}

	// pending names the node Leases renewed since they were last looked
	// at; guarded by l.mu.
	pending map[string]struct{}

	// Owned by run: the resourceVersion the client last received, the
	// stored revision of each node Lease it received, the renewTime of
	// the renewal it last received of each.
	last int64
	seen map[string]int64
	sent map[string]metav1.MicroTime
}

// notify marks node's Lease renewed; called with l.mu held.
func (w *leaseWatch) notify(node string) {
	w.pending[node] = struct{}{}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *leaseWatch) Stop() { w.once.Do(func() { close(w.done) }) }

func (w *leaseWatch) ResultChan() <-chan watch.Event { return w.out }

// Watch implements storage.API.
func (a *leaseAPI) Watch(ctx context.Context, k *registry.Kind, namespace string, opts storage.WatchOptions) (watch.Interface, error) {
	if !covers(k, namespace) {
		return a.API.Watch(ctx, k, namespace, opts)
	}
	rv := int64(0)
	if opts.ResourceVersion != "" {
		var err error
		if rv, err = parseRV(opts.ResourceVersion); err != nil {
			// The wrapped storage answers with the upstream error.
			return a.API.Watch(ctx, k, namespace, opts)
		}
	}
	if c, ok := a.API.(interface{ CompactedRevision() int64 }); ok && rv > 0 && rv < c.CompactedRevision() {
		// Too old: the wrapped storage ends the watch with 410 Expired
		// before any renewal could be sent.
		return a.API.Watch(ctx, k, namespace, opts)
	}
	l := a.l
	w := &leaseWatch{l: l, label: opts.Label, field: opts.Field, out: make(chan watch.Event), done: make(chan struct{}),
		kick: make(chan struct{}, 1), pending: map[string]struct{}{}, seen: map[string]int64{}, sent: map[string]metav1.MicroTime{}}
	// Registered before anything is read: every renewal made from here
	// on reaches the watch.
	l.mu.Lock()
	l.watches[w] = struct{}{}
	l.mu.Unlock()
	unregister := func() {
		l.mu.Lock()
		delete(l.watches, w)
		l.mu.Unlock()
	}
	initial := opts.SendInitialEvents == nil && rv == 0
	if opts.SendInitialEvents != nil {
		initial = *opts.SendInitialEvents
	}
	var first []watch.Event
	inner := opts
	if initial {
		// The initial state as a list shows it, renewals included; the
		// stored changes follow from the list's revision.
		obj, err := a.List(ctx, k, namespace, storage.ListOptions{Label: opts.Label, Field: opts.Field, ResourceVersion: opts.ResourceVersion})
		if err != nil {
			unregister()
			return nil, err
		}
		list := obj.(*coordinationv1.LeaseList)
		if w.last, err = parseRV(list.ResourceVersion); err != nil {
			unregister()
			return nil, err
		}
		first = make([]watch.Event, 0, len(list.Items)+1)
		for i := range list.Items {
			it := &list.Items[i]
			if it.Namespace == corev1.NamespaceNodeLease {
				w.seen[it.Name], _ = parseRV(it.ResourceVersion)
				if it.Spec.RenewTime != nil {
					w.sent[it.Name] = *it.Spec.RenewTime
				}
			}
			first = append(first, watch.Event{Type: watch.Added, Object: it})
		}
		if opts.SendInitialEvents != nil && opts.AllowBookmarks {
			bm := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{ResourceVersion: list.ResourceVersion,
				Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
			first = append(first, watch.Event{Type: watch.Bookmark, Object: bm})
		}
		inner.ResourceVersion, inner.SendInitialEvents = list.ResourceVersion, ptr.To(false)
	} else {
		w.last = rv
		if rv == 0 {
			w.last = l.revision()
		}
		// A client resuming from w.last has seen every renewal made
		// before that revision was current; later ones it may not have.
		l.mu.Lock()
		for name, r := range l.renewals {
			if r.at == 0 || r.at >= w.last {
				w.pending[name] = struct{}{}
			}
		}
		l.mu.Unlock()
	}
	iw, err := a.API.Watch(ctx, k, namespace, inner)
	if err != nil {
		unregister()
		return nil, err
	}
	go func() {
		defer unregister()
		w.run(ctx, iw, first)
	}()
	return w, nil
}

func (w *leaseWatch) run(ctx context.Context, iw watch.Interface, first []watch.Event) {
	defer close(w.out)
	defer iw.Stop()
	send := func(ev watch.Event) bool {
		select {
		case w.out <- ev:
			return true
		case <-ctx.Done():
			return false
		case <-w.done:
			return false
		}
	}
	for _, ev := range first {
		if !send(ev) {
			return
		}
	}
	for {
		if !w.flush(send) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-w.done:
			return
		case <-w.kick:
		case ev, ok := <-iw.ResultChan():
			if !ok {
				return
			}
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				ev = w.stored(ev)
			case watch.Bookmark:
				if m, err := meta.Accessor(ev.Object); err == nil {
					if rv, err := parseRV(m.GetResourceVersion()); err == nil && rv > w.last {
						w.last = rv
					}
				}
				// Renewals that this revision lets out go first.
				if !w.flush(send) {
					return
				}
			}
			if !send(ev) || ev.Type == watch.Error {
				return
			}
		}
	}
}

// stored notes a stored change and gives it the renewal in memory of the
// state it carries, if any.
func (w *leaseWatch) stored(ev watch.Event) watch.Event {
	lease, ok := ev.Object.(*coordinationv1.Lease)
	if !ok {
		return ev
	}
	rv, err := parseRV(lease.ResourceVersion)
	if err != nil {
		return ev
	}
	if rv > w.last {
		w.last = rv
	}
	if lease.Namespace != corev1.NamespaceNodeLease {
		return ev
	}
	if ev.Type == watch.Deleted {
		delete(w.seen, lease.Name)
		delete(w.sent, lease.Name)
		return ev
	}
	w.seen[lease.Name] = rv
	w.l.mu.Lock()
	out, _ := w.l.renewedLocked(lease)
	w.l.mu.Unlock()
	if out.Spec.RenewTime != nil {
		w.sent[lease.Name] = *out.Spec.RenewTime
	}
	ev.Object = out
	return ev
}

// flush sends a MODIFIED event for every pending renewal the client may
// get now: one made on a stored state the watch has delivered (or started
// after), not older than what it delivered of that Lease, and not sent
// yet. Its resourceVersion is the watch's last: renewals belong to no
// store revision, and any later one could be a stored change still on its
// way to this watch.
func (w *leaseWatch) flush(send func(watch.Event) bool) bool {
	var evs []watch.Event
	w.l.mu.Lock()
	for name := range w.pending {
		r, ok := w.l.renewals[name]
		cur := w.l.stored[name]
		if !ok || cur == nil || strconv.FormatInt(r.base, 10) != cur.ResourceVersion {
			delete(w.pending, name)
			continue
		}
		if r.base > w.last {
			continue // its stored state is still on its way
		}
		delete(w.pending, name)
		if s, ok := w.seen[name]; ok && s > r.base {
			continue
		}
		if s, ok := w.sent[name]; ok && !s.Before(&r.renewTime) {
			continue
		}
		if !w.matches(cur) {
			continue
		}
		out, ok := w.l.renewedLocked(cur)
		if !ok {
			continue
		}
		out.ResourceVersion = strconv.FormatInt(w.last, 10)
		w.sent[name] = r.renewTime
		evs = append(evs, watch.Event{Type: watch.Modified, Object: out})
	}
	w.l.mu.Unlock()
	for _, ev := range evs {
		if !send(ev) {
			return false
		}
	}
	return true
}

// matches says whether the watch's selectors select lease.
func (w *leaseWatch) matches(lease *coordinationv1.Lease) bool {
	if w.label != nil && !w.label.Matches(labels.Set(lease.Labels)) {
		return false
	}
	return w.field == nil || w.field.Matches(fields.Set{"metadata.name": lease.Name, "metadata.namespace": lease.Namespace})
}
