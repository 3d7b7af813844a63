package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

const (
	// Namespace holds the presence Leases.
	Namespace = "kube-system"
	// NamePrefix starts each presence Lease's name; the hub's id follows.
	NamePrefix = "tether-hub-"
	// LabelPresence marks presence Leases.
	LabelPresence = "tether.io/hub-presence"
	// AnnotationEdgeAddress is the host:port edges dial for their tunnel.
	AnnotationEdgeAddress = "tether.io/edge-address"
	// AnnotationAPIAddress is the host:port of the hub's API, for the
	// other hubs.
	AnnotationAPIAddress = "tether.io/api-address"
	// AnnotationNodes lists the nodes whose tunnels the hub holds,
	// comma-separated and sorted.
	AnnotationNodes = "tether.io/nodes"
)

var leasesKind = registry.Lookup(schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"})

// Config configures a Directory. Storage, ID, EdgeAddress, APIAddress and
// Held are required.
type Config struct {
	// Storage is where presence Leases are kept.
	Storage storage.API
	// ID names this hub; stable across its restarts.
	ID string
	// EdgeAddress is the host:port of this hub's tunnel, APIAddress that
	// of its API.
	EdgeAddress, APIAddress string
	// Held returns the nodes whose tunnel this hub holds with heartbeats
	// arriving.
	Held func() []string
	// OnVouched receives, whenever it changes, the nodes other live hubs
	// hold, each with when its hub's presence expires.
	OnVouched func(map[string]time.Time)
	// Renew is how often the presence is renewed; zero means 5s.
	// Duration is how long it lasts unrenewed; zero means three Renews.
	Renew, Duration time.Duration
	// Dial opens hub-to-hub connections (see dial.go); nil leaves Dial
	// unable to reach other hubs.
	Dial *Dialer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives the directory's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Hub is another hub's, or this hub's, presence.
type Hub struct {
	ID                      string
	EdgeAddress, APIAddress string
	Nodes                   []string
	// Expires is when the presence lapses unless renewed.
	Expires time.Time
}

// Directory keeps this hub's presence and knows the others'.
type Directory struct {
	cfg Config

	mu   sync.Mutex
	hubs map[string]Hub // by Lease name, this hub's included
}

// New checks cfg and returns a Directory; Run keeps it.
func New(cfg Config) (*Directory, error) {
	if cfg.Storage == nil || cfg.ID == "" || cfg.EdgeAddress == "" || cfg.APIAddress == "" || cfg.Held == nil {
		return nil, errors.New("create hub directory: storage, id, addresses and held nodes are required")
	}
	if cfg.Renew <= 0 {
		cfg.Renew = 5 * time.Second
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 3 * cfg.Renew
	}
	if cfg.Duration < 2*cfg.Renew {
		return nil, fmt.Errorf("create hub directory: presence duration %v must be at least two renewals (%v)", cfg.Duration, 2*cfg.Renew)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Directory{cfg: cfg, hubs: map[string]Hub{}}, nil
}

// Run records this hub's presence and follows the others' until ctx
// ends; then it deletes this hub's presence.
func (d *Directory) Run(ctx context.Context) {
	go d.follow(ctx)
	d.keep(ctx)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, _, err := d.cfg.Storage.Delete(dctx, leasesKind, Namespace, d.name(), &metav1.DeleteOptions{}, false); err != nil && !apierrors.IsNotFound(err) {
		d.cfg.Logger.Info("delete hub presence", "err", err)
	}
}

func (d *Directory) name() string { return NamePrefix + d.cfg.ID }

// keep renews the presence every Renew, and within a second of a change
// of the held nodes.
func (d *Directory) keep(ctx context.Context) {
	tick := time.NewTicker(min(d.cfg.Renew, time.Second))
	defer tick.Stop()
	var written []string
	var at time.Time
	for {
		held := d.cfg.Held()
		now := d.cfg.Now()
		if at.IsZero() || now.Sub(at) >= d.cfg.Renew || !slices.Equal(held, written) {
			if err := d.write(ctx, held, now); err != nil {
				if ctx.Err() != nil {
					return
				}
				d.cfg.Logger.Warn("renew hub presence", "err", err)
			} else {
				written, at = held, now
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (d *Directory) write(ctx context.Context, held []string, now time.Time) error {
	renew := metav1.NewMicroTime(now)
	set := func(l *coordinationv1.Lease) {
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[LabelPresence] = "true"
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnotationEdgeAddress] = d.cfg.EdgeAddress
		l.Annotations[AnnotationAPIAddress] = d.cfg.APIAddress
		l.Annotations[AnnotationNodes] = strings.Join(held, ",")
		l.Spec.HolderIdentity = ptr.To(d.cfg.ID)
		l.Spec.LeaseDurationSeconds = ptr.To(int32((d.cfg.Duration + time.Second - 1) / time.Second))
		l.Spec.RenewTime = &renew
	}
	opts := storage.Options{FieldManager: "tether-hub"}
	_, err := d.cfg.Storage.GuaranteedUpdate(ctx, leasesKind, Namespace, d.name(), opts, func(cur runtime.Object) (runtime.Object, error) {
		l := cur.(*coordinationv1.Lease)
		set(l)
		return l, nil
	})
	if !apierrors.IsNotFound(err) {
		return err
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: d.name(), Namespace: Namespace}}
	set(l)
	l.Spec.AcquireTime = &renew
	_, err = d.cfg.Storage.Create(ctx, leasesKind, Namespace, l, opts)
	return err
}

// follow keeps hubs equal to the stored presences until ctx ends (see
// storage.Follow).
func (d *Directory) follow(ctx context.Context) {
	// Presences lapse without an event: the vouched nodes are
	// recomputed every second as well.
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		var last map[string]time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			v := d.vouched()
			if !sameKeys(v, last) && d.cfg.OnVouched != nil {
				d.cfg.OnVouched(v)
			}
			last = v
		}
	}()
	sel := labels.SelectorFromSet(labels.Set{LabelPresence: "true"})
	storage.Follow(ctx, d.cfg.Storage, leasesKind, Namespace, storage.FollowOptions{Label: sel, Logger: d.cfg.Logger},
		storage.FollowFuncs{ReplaceFunc: d.replace, ApplyFunc: d.apply})
}

// replace makes a list of presence Leases the known hubs.
func (d *Directory) replace(obj runtime.Object) error {
	list, ok := obj.(*coordinationv1.LeaseList)
	if !ok {
		return fmt.Errorf("list hub presences: unexpected %T", obj)
	}
	hubs := make(map[string]Hub, len(list.Items))
	for i := range list.Items {
		hubs[list.Items[i].Name] = hubOf(&list.Items[i])
	}
	d.set(hubs)
	return nil
}

// apply records a change of a presence Lease.
func (d *Directory) apply(ev watch.EventType, obj runtime.Object) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if ev == watch.Deleted {
		delete(d.hubs, l.Name)
		return
	}
	d.hubs[l.Name] = hubOf(l)
}

func (d *Directory) set(hubs map[string]Hub) {
	d.mu.Lock()
	d.hubs = hubs
	d.mu.Unlock()
}

// hubOf reads a presence Lease.
func hubOf(l *coordinationv1.Lease) Hub {
	h := Hub{ID: strings.TrimPrefix(l.Name, NamePrefix),
		EdgeAddress: l.Annotations[AnnotationEdgeAddress], APIAddress: l.Annotations[AnnotationAPIAddress]}
	if n := l.Annotations[AnnotationNodes]; n != "" {
		h.Nodes = strings.Split(n, ",")
	}
	if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
		h.Expires = l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	}
	return h
}

// Live returns the hubs whose presence has not lapsed, this one included,
// sorted by id.
func (d *Directory) Live() []Hub {
	now := d.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	var live []Hub
	for _, h := range d.hubs {
		if now.Before(h.Expires) {
			live = append(live, h)
		}
	}
	slices.SortFunc(live, func(a, b Hub) int { return strings.Compare(a.ID, b.ID) })
	return live
}

// vouched returns the nodes other live hubs hold, each with when its
// hub's presence lapses (the latest, should two claim it).
func (d *Directory) vouched() map[string]time.Time {
	v := map[string]time.Time{}
	for _, h := range d.Live() {
		if h.ID == d.cfg.ID {
			continue
		}
		for _, n := range h.Nodes {
			if h.Expires.After(v[n]) {
				v[n] = h.Expires
			}
		}
	}
	return v
}

// holder returns the API address of the live hub, other than this one,
// that holds node's tunnel.
func (d *Directory) holder(node string) (string, bool) {
	var best Hub
	for _, h := range d.Live() {
		if h.ID != d.cfg.ID && slices.Contains(h.Nodes, node) && h.Expires.After(best.Expires) {
			best = h
		}
	}
	return best.APIAddress, best.APIAddress != ""
}

// sameKeys reports whether a and b hold the same nodes with the same
// expiry.
func sameKeys(a, b map[string]time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !w.Equal(v) {
			return false
		}
	}
	return true
}
