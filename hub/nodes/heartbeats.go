package nodes

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// Heartbeats keeps in memory the Node status updates that only move
// conditions' lastHeartbeatTime forward (see the package documentation,
// "Node status heartbeats").
type Heartbeats struct {
	mu    sync.Mutex
	beats map[string]map[corev1.NodeConditionType]metav1.Time

	// held counts the updates kept in memory.
	held atomic.Int64
}

// NewHeartbeats returns an empty Heartbeats.
func NewHeartbeats() *Heartbeats {
	return &Heartbeats{beats: map[string]map[corev1.NodeConditionType]metav1.Time{}}
}

// Serve returns api with Node status heartbeats kept as the package
// documentation describes. Every other kind goes to api untouched.
func (h *Heartbeats) Serve(api storage.API) storage.API {
	return &heartbeatAPI{API: api, h: h}
}

// Collectors returns the heartbeat counter for the hub's /metrics.
func (h *Heartbeats) Collectors() []prometheus.Collector {
	return []prometheus.Collector{prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "tether_node_status_heartbeats_held_total",
		Help: "Node status updates that moved only conditions' lastHeartbeatTime, kept in memory instead of the store.",
	}, func() float64 { return float64(h.held.Load()) })}
}

// heartbeatAPI is the storage the API server uses when Node status
// heartbeats are kept in memory.
type heartbeatAPI struct {
	storage.API
	h *Heartbeats
}

func isNodes(k *registry.Kind) bool { return k.GroupResource() == nodesKind.GroupResource() }

// Get implements storage.API.
func (a *heartbeatAPI) Get(ctx context.Context, k *registry.Kind, namespace, name string) (runtime.Object, error) {
	obj, err := a.API.Get(ctx, k, namespace, name)
	if err != nil || !isNodes(k) {
		return obj, err
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	a.h.mu.Lock()
	defer a.h.mu.Unlock()
	out, _ := a.h.beatenLocked(n)
	return out, nil
}

// List implements storage.API.
func (a *heartbeatAPI) List(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (runtime.Object, error) {
	obj, err := a.API.List(ctx, k, namespace, opts)
	if err != nil || !isNodes(k) {
		return obj, err
	}
	list, ok := obj.(*corev1.NodeList)
	if !ok {
		return obj, nil
	}
	a.h.mu.Lock()
	defer a.h.mu.Unlock()
	for i := range list.Items {
		if out, ok := a.h.beatenLocked(&list.Items[i]); ok {
			list.Items[i] = *out
		}
	}
	return list, nil
}

// holding reports whether any heartbeat is kept in memory.
func (h *Heartbeats) holding() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.beats) > 0
}

// ListJSON answers plain JSON lists from the store's bytes where the
// wrapped storage can, except for lists of Nodes while heartbeats are held.
func (a *heartbeatAPI) ListJSON(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (*storage.JSONList, bool, error) {
	return storedJSON(ctx, a.API, !isNodes(k) || !a.h.holding(), k, namespace, opts)
}

// ListProtobuf answers plain protobuf lists from the wrapped storage's
// item encodings where it can, except for lists of Nodes while heartbeats
// are held.
func (a *heartbeatAPI) ListProtobuf(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (*storage.ProtoList, bool, error) {
	return storedProtobuf(ctx, a.API, !isNodes(k) || !a.h.holding(), k, namespace, opts)
}

// ProtoItem passes a watch event's protobuf item on to the wrapped
// storage (storage.Storage.ProtoItem), except for Nodes.
func (a *heartbeatAPI) ProtoItem(k *registry.Kind, obj runtime.Object) ([]byte, bool) {
	return storedItem(a.API, !isNodes(k), k, obj)
}

// GuaranteedUpdate implements storage.API. A patch of a Node's status
// whose result differs from the stored Node only in conditions'
// lastHeartbeatTime, each moved forward, is not stored: its heartbeats
// are kept in memory and the stored Node is returned with them.
func (a *heartbeatAPI) GuaranteedUpdate(ctx context.Context, k *registry.Kind, namespace, name string, opts storage.Options, tryUpdate func(current runtime.Object) (runtime.Object, error)) (runtime.Object, error) {
	if !isNodes(k) || opts.Subresource != "status" || opts.DryRun {
		return a.API.GuaranteedUpdate(ctx, k, namespace, name, opts, tryUpdate)
	}
	var beats map[corev1.NodeConditionType]metav1.Time
	obj, err := a.API.GuaranteedUpdate(ctx, k, namespace, name, opts, func(current runtime.Object) (runtime.Object, error) {
		beats = nil
		cur, ok := current.(*corev1.Node)
		if !ok {
			return tryUpdate(current)
		}
		// tryUpdate may change what it is given.
		cur = cur.DeepCopy()
		out, err := tryUpdate(current)
		if err != nil {
			return out, err
		}
		if next, ok := out.(*corev1.Node); ok {
			if b, ok := heartbeatOnly(cur, next); ok {
				// The stored state as read: the storage writes nothing.
				beats = b
				return cur, nil
			}
		}
		return out, nil
	})
	if err != nil {
		return obj, err
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	a.h.mu.Lock()
	defer a.h.mu.Unlock()
	if beats == nil {
		a.h.forgetLocked(n)
		return obj, nil
	}
	a.h.held.Add(1)
	held := a.h.beats[name]
	if held == nil {
		held = map[corev1.NodeConditionType]metav1.Time{}
		a.h.beats[name] = held
	}
	for t, at := range beats {
		if old, ok := held[t]; !ok || old.Before(&at) {
			held[t] = at
		}
	}
	out, _ := a.h.beatenLocked(n)
	return out, nil
}

// Delete implements storage.API: a deleted Node's heartbeats are dropped.
func (a *heartbeatAPI) Delete(ctx context.Context, k *registry.Kind, namespace, name string, opts *metav1.DeleteOptions, dryRun bool) (runtime.Object, bool, error) {
	obj, deleted, err := a.API.Delete(ctx, k, namespace, name, opts, dryRun)
	if err == nil && deleted && !dryRun && isNodes(k) {
		a.h.mu.Lock()
		delete(a.h.beats, name)
		a.h.mu.Unlock()
	}
	return obj, deleted, err
}

// DeleteCollection implements storage.API: the deleted Nodes' heartbeats
// are dropped.
func (a *heartbeatAPI) DeleteCollection(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions, del *metav1.DeleteOptions, dryRun bool) (runtime.Object, error) {
	obj, err := a.API.DeleteCollection(ctx, k, namespace, opts, del, dryRun)
	if err != nil || dryRun || !isNodes(k) {
		return obj, err
	}
	if list, ok := obj.(*corev1.NodeList); ok {
		a.h.mu.Lock()
		for _, n := range list.Items {
			if n.DeletionTimestamp == nil || len(n.Finalizers) == 0 {
				delete(a.h.beats, n.Name)
			}
		}
		a.h.mu.Unlock()
	}
	return obj, err
}

// heartbeatOnly reports whether next differs from cur only in its
// conditions' lastHeartbeatTime, each later than cur's, and returns the
// new heartbeats by condition type.
func heartbeatOnly(cur, next *corev1.Node) (map[corev1.NodeConditionType]metav1.Time, bool) {
	if len(cur.Status.Conditions) != len(next.Status.Conditions) {
		return nil, false
	}
	beats := map[corev1.NodeConditionType]metav1.Time{}
	strip := *next
	strip.Status.Conditions = slices.Clone(next.Status.Conditions)
	for i := range strip.Status.Conditions {
		c, was := &strip.Status.Conditions[i], &cur.Status.Conditions[i]
		if c.Type != was.Type {
			return nil, false
		}
		if c.LastHeartbeatTime.Equal(&was.LastHeartbeatTime) {
			continue
		}
		if !was.LastHeartbeatTime.Before(&c.LastHeartbeatTime) {
			return nil, false
		}
		beats[c.Type] = c.LastHeartbeatTime
		c.LastHeartbeatTime = was.LastHeartbeatTime
	}
	if len(beats) == 0 {
		return nil, false
	}
	// managedFields entries differ in their time at most; the storage
	// leaves those out of its comparison as well.
	strip.ManagedFields = cur.ManagedFields
	if !apiequality.Semantic.DeepEqual(cur, &strip) {
		return nil, false
	}
	return beats, true
}

// beatenLocked returns n with the heartbeats held for it that are later
// than its own, and whether there were any; n is left untouched.
func (h *Heartbeats) beatenLocked(n *corev1.Node) (*corev1.Node, bool) {
	held := h.beats[n.Name]
	if len(held) == 0 {
		return n, false
	}
	var out *corev1.Node
	for i, c := range n.Status.Conditions {
		at, ok := held[c.Type]
		if !ok || !c.LastHeartbeatTime.Before(&at) {
			continue
		}
		if out == nil {
			cp := *n
			cp.Status.Conditions = slices.Clone(n.Status.Conditions)
			out = &cp
		}
		out.Status.Conditions[i].LastHeartbeatTime = at
	}
	if out == nil {
		return n, false
	}
	return out, true
}

// forgetLocked drops the heartbeats held for n that its stored status
// has caught up with.
func (h *Heartbeats) forgetLocked(n *corev1.Node) {
	held := h.beats[n.Name]
	for _, c := range n.Status.Conditions {
		if at, ok := held[c.Type]; ok && !c.LastHeartbeatTime.Before(&at) {
			delete(held, c.Type)
		}
	}
	if len(held) == 0 {
		delete(h.beats, n.Name)
	}
}
