package nodes

import (
	"context"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/storage"
)

// Zones knows every Node's site: the value of its
// topology.kubernetes.io/zone label. It is fed by a watch on Nodes and
// answers from memory, so that the node lifecycle controller's questions
// about site evidence and the node authorizer's about site key Secrets
// cost no store read.
type Zones struct {
	st  storage.API
	log *slog.Logger

	mu       sync.RWMutex
	zone     map[string]string              // node -> zone ("" for none)
	members  map[string]map[string]struct{} // zone -> nodes
	synced   chan struct{}
	once     sync.Once
	onChange []func(node, from, to string)
}

// NewZones returns a Zones that knows nothing until Run has listed Nodes.
func NewZones(cfg Config) *Zones {
	cfg.setDefaults()
	return &Zones{
		st:      cfg.Storage,
		log:     cfg.Logger,
		zone:    map[string]string{},
		members: map[string]map[string]struct{}{},
		synced:  make(chan struct{}),
	}
}

// OnChange registers f, called (outside Zones' lock, on the watch's
// goroutine) whenever a node appears, disappears or changes zone; from
// and to are "" for no zone, gone is reported as to == "" with Zone's
// known false. Register before Run.
func (z *Zones) OnChange(f func(node, from, to string)) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.onChange = append(z.onChange, f)
}

// Zone returns node's zone label and whether the Node exists.
func (z *Zones) Zone(node string) (zone string, known bool) {
	z.mu.RLock()
	defer z.mu.RUnlock()
	zone, known = z.zone[node]
	return zone, known
}

// Members returns the nodes whose zone is zone.
func (z *Zones) Members(zone string) []string {
	z.mu.RLock()
	defer z.mu.RUnlock()
	out := make([]string, 0, len(z.members[zone]))
	for n := range z.members[zone] {
		out = append(out, n)
	}
	return out
}

// AnyMember reports whether f holds for some node of zone.
func (z *Zones) AnyMember(zone string, f func(node string) bool) bool {
	for _, n := range z.Members(zone) {
		if f(n) {
			return true
		}
	}
	return false
}

// Synced reports whether the first list of Nodes has been taken in.
func (z *Zones) Synced() bool {
	select {
	case <-z.synced:
		return true
	default:
		return false
	}
}

// WaitSynced waits for the first list of Nodes.
func (z *Zones) WaitSynced(ctx context.Context) bool {
	select {
	case <-z.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

type zoneChange struct{ node, from, to string }

// setLocked records node's zone (gone: the Node was deleted) and returns
// the change, if any.
func (z *Zones) setLocked(node, zone string, gone bool) (zoneChange, bool) {
	old, had := z.zone[node]
	if gone {
		if !had {
			return zoneChange{}, false
		}
		delete(z.zone, node)
		z.dropMemberLocked(old, node)
		return zoneChange{node, old, ""}, true
	}
	if had && old == zone {
		return zoneChange{}, false
	}
	if had {
		z.dropMemberLocked(old, node)
	}
	z.zone[node] = zone
	if z.members[zone] == nil {
		z.members[zone] = map[string]struct{}{}
	}
	z.members[zone][node] = struct{}{}
	return zoneChange{node, old, zone}, true
}

func (z *Zones) dropMemberLocked(zone, node string) {
	if m := z.members[zone]; m != nil {
		delete(m, node)
		if len(m) == 0 {
			delete(z.members, zone)
		}
	}
}

func (z *Zones) notify(changes []zoneChange) {
	z.mu.RLock()
	fs := z.onChange
	z.mu.RUnlock()
	for _, c := range changes {
		for _, f := range fs {
			f(c.node, c.from, c.to)
		}
	}
}

func (z *Zones) apply(ev watch.EventType, n *corev1.Node) {
	z.mu.Lock()
	c, ok := z.setLocked(n.Name, n.Labels[corev1.LabelTopologyZone], ev == watch.Deleted)
	z.mu.Unlock()
	if ok {
		z.notify([]zoneChange{c})
	}
}

func (z *Zones) reset(items []corev1.Node) {
	var changes []zoneChange
	z.mu.Lock()
	seen := make(map[string]bool, len(items))
	for i := range items {
		n := &items[i]
		seen[n.Name] = true
		if c, ok := z.setLocked(n.Name, n.Labels[corev1.LabelTopologyZone], false); ok {
			changes = append(changes, c)
		}
	}
	for name := range z.zone {
		if !seen[name] {
			if c, ok := z.setLocked(name, "", true); ok {
				changes = append(changes, c)
			}
		}
	}
	z.mu.Unlock()
	z.once.Do(func() { close(z.synced) })
	z.notify(changes)
}

// Run keeps the zones current until ctx ends (see storage.Follow). Only a
// node's name and one label are read: the watch's objects are shared.
func (z *Zones) Run(ctx context.Context) {
	storage.Follow(ctx, z.st, nodesKind, "", storage.FollowOptions{Shared: true, Logger: z.log}, storage.FollowFuncs{
		ReplaceFunc: func(list runtime.Object) error {
			z.reset(list.(*corev1.NodeList).Items)
			return nil
		},
		ApplyFunc: func(ev watch.EventType, obj runtime.Object) {
			if n, ok := obj.(*corev1.Node); ok {
				z.apply(ev, n)
			}
		},
	})
}
