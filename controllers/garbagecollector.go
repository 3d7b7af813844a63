package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// objectKey names one object of one resource.
type objectKey struct {
	gvr       schema.GroupVersionResource
	namespace string
	name      string
}

func (k objectKey) String() string {
	if k.namespace == "" {
		return k.gvr.GroupResource().String() + "/" + k.name
	}
	return k.gvr.GroupResource().String() + "/" + k.namespace + "/" + k.name
}

// garbageCollector deletes objects whose owners are all gone and carries
// out the foreground and orphan propagation policies.
//
// It keeps two indexes fed by every informer: the key of each object by
// UID, and the dependents of each owner UID. A queued key is reconciled as
// an owner (when it is being deleted with the foregroundDeletion or orphan
// finalizer) and as a dependent (when it has owner references).
type garbageCollector struct {
	m     *Manager
	meta  metadata.Interface // acts as the garbage collector's own identity
	log   *slog.Logger
	queue *kit.TypedQueue[objectKey]

	mu         sync.Mutex
	byUID      map[types.UID]objectKey
	dependents map[types.UID]map[objectKey]struct{}
	// unresolved are the dependents last seen with an owner of a kind
	// not served then; a discovery that finds new kinds queues them
	// again, as the owner may now be looked up (a custom resource whose
	// definition the informers had not caught up with, say).
	unresolved map[objectKey]struct{}
}

func newGarbageCollector(m *Manager, meta metadata.Interface, log *slog.Logger) *garbageCollector {
	return &garbageCollector{
		m:          m,
		meta:       meta,
		log:        log,
		queue:      kit.NewTypedQueue[objectKey]("garbagecollector"),
		byUID:      map[types.UID]objectKey{},
		dependents: map[types.UID]map[objectKey]struct{}{},
		unresolved: map[objectKey]struct{}{},
	}
}

// kindsAdded queues again the dependents whose owners were of kinds not
// served when they were looked at.
func (gc *garbageCollector) kindsAdded() {
	gc.mu.Lock()
	keys := slices.Collect(maps.Keys(gc.unresolved))
	clear(gc.unresolved)
	gc.mu.Unlock()
	for _, k := range keys {
		gc.queue.Add(k)
	}
}

// watch registers the collector's handlers on a resource's informer.
func (gc *garbageCollector) watch(w *watchedResource) {
	gvr := w.info.gvr
	keyOf := func(p *metav1.PartialObjectMetadata) objectKey {
		return objectKey{gvr: gvr, namespace: p.Namespace, name: p.Name}
	}
	_, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			p, ok := metaOf(obj)
			if !ok {
				return
			}
			gc.observe(keyOf(p), nil, p)
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := metaOf(oldObj)
			n, ok2 := metaOf(newObj)
			if !ok1 || !ok2 {
				return
			}
			gc.observe(keyOf(n), o, n)
		},
		DeleteFunc: func(obj any) {
			p, ok := metaOf(obj)
			if !ok {
				return
			}
			gc.forget(keyOf(p), p)
		},
	})
	if err != nil {
		gc.log.Warn("add event handler", "resource", gvr.String(), "err", err)
	}
}

// observe records an added or updated object and queues what it affects.
func (gc *garbageCollector) observe(key objectKey, old, cur *metav1.PartialObjectMetadata) {
	gc.mu.Lock()
	if old != nil && old.UID != cur.UID {
		gc.unindexLocked(key, old)
	}
	if old != nil {
		for _, ref := range old.OwnerReferences {
			if !hasOwner(cur.OwnerReferences, ref.UID) {
				gc.removeDependentLocked(ref.UID, key)
			}
		}
	}
	gc.byUID[cur.UID] = key
	for _, ref := range cur.OwnerReferences {
		deps := gc.dependents[ref.UID]
		if deps == nil {
			deps = map[objectKey]struct{}{}
			gc.dependents[ref.UID] = deps
		}
		deps[key] = struct{}{}
	}
	// Owners waiting on this object's deletion, or losing it as a
	// dependent, must be looked at again.
	var owners []objectKey
	refs := cur.OwnerReferences
	if old != nil {
		refs = append(slices.Clone(refs), old.OwnerReferences...)
	}
	for _, ref := range refs {
		if k, ok := gc.byUID[ref.UID]; ok {
			owners = append(owners, k)
		}
	}
	gc.mu.Unlock()

	if len(cur.OwnerReferences) > 0 || beingDeletedWith(cur) != "" {
		gc.queue.Add(key)
	}
	gc.queueDeleting(owners)
}

// forget removes a deleted object and queues its dependents, which may now
// be dangling, and its owners, which may be waiting for it.
func (gc *garbageCollector) forget(key objectKey, p *metav1.PartialObjectMetadata) {
	gc.mu.Lock()
	gc.unindexLocked(key, p)
	var deps, owners []objectKey
	for k := range gc.dependents[p.UID] {
		deps = append(deps, k)
	}
	for _, ref := range p.OwnerReferences {
		if k, ok := gc.byUID[ref.UID]; ok {
			owners = append(owners, k)
		}
	}
	gc.mu.Unlock()
	for _, k := range deps {
		gc.queue.Add(k)
	}
	gc.queueDeleting(owners)
	if key.namespace != "" {
		gc.m.ns.contentDeleted(key.namespace)
	}
}

// queueDeleting queues those owners that the cache shows being deleted.
func (gc *garbageCollector) queueDeleting(owners []objectKey) {
	for _, k := range owners {
		if p, ok := gc.cached(k); ok && p.DeletionTimestamp != nil {
			gc.queue.Add(k)
		}
	}
}

func (gc *garbageCollector) unindexLocked(key objectKey, p *metav1.PartialObjectMetadata) {
	if gc.byUID[p.UID] == key {
		delete(gc.byUID, p.UID)
	}
	for _, ref := range p.OwnerReferences {
		gc.removeDependentLocked(ref.UID, key)
	}
}

func (gc *garbageCollector) removeDependentLocked(owner types.UID, key objectKey) {
	if deps := gc.dependents[owner]; deps != nil {
		delete(deps, key)
		if len(deps) == 0 {
			delete(gc.dependents, owner)
		}
	}
}

func hasOwner(refs []metav1.OwnerReference, uid types.UID) bool {
	return slices.ContainsFunc(refs, func(r metav1.OwnerReference) bool { return r.UID == uid })
}

// beingDeletedWith returns the propagation finalizer of an object being
// deleted, or "".
func beingDeletedWith(p *metav1.PartialObjectMetadata) string {
	if p.DeletionTimestamp == nil {
		return ""
	}
	switch {
	case slices.Contains(p.Finalizers, metav1.FinalizerOrphanDependents):
		return metav1.FinalizerOrphanDependents
	case slices.Contains(p.Finalizers, metav1.FinalizerDeleteDependents):
		return metav1.FinalizerDeleteDependents
	}
	return ""
}

// cached returns an object from its informer's cache.
func (gc *garbageCollector) cached(k objectKey) (*metav1.PartialObjectMetadata, bool) {
	w := gc.m.watchedFor(k.gvr.GroupResource())
	if w == nil {
		return nil, false
	}
	var key string
	if k.namespace != "" {
		key = k.namespace + "/" + k.name
	} else {
		key = k.name
	}
	obj, ok, err := w.informer.GetIndexer().GetByKey(key)
	if err != nil || !ok {
		return nil, false
	}
	p, ok := obj.(*metav1.PartialObjectMetadata)
	return p, ok
}

// dependentsOf returns the cached dependents of an owner. A namespaced
// owner only owns objects of its own namespace.
func (gc *garbageCollector) dependentsOf(owner objectKey, uid types.UID, namespaced bool) []*metav1.PartialObjectMetadata {
	gc.mu.Lock()
	var keys []objectKey
	for k := range gc.dependents[uid] {
		if namespaced && k.namespace != owner.namespace {
			continue
		}
		keys = append(keys, k)
	}
	gc.mu.Unlock()
	var out []*metav1.PartialObjectMetadata
	for _, k := range keys {
		if p, ok := gc.cached(k); ok && hasOwner(p.OwnerReferences, uid) {
			out = append(out, p)
		}
	}
	return out
}

// sync reconciles one object as an owner being deleted and as a dependent.
func (gc *garbageCollector) sync(ctx context.Context, key objectKey) error {
	p, ok := gc.cached(key)
	if !ok {
		return nil
	}
	switch beingDeletedWith(p) {
	case metav1.FinalizerOrphanDependents:
		return gc.orphanDependents(ctx, key, p)
	case metav1.FinalizerDeleteDependents:
		if err := gc.deleteDependents(ctx, key, p); err != nil {
			return err
		}
	}
	if len(p.OwnerReferences) == 0 {
		return nil
	}
	return gc.attemptToDelete(ctx, key, p)
}

// ownerState is what the collector knows of an owner reference.
type ownerState int

const (
	ownerSolid   ownerState = iota // exists and is not deleted in the foreground
	ownerAbsent                    // no object with that UID
	ownerWaiting                   // being deleted in the foreground
)

// ownerStateOf looks an owner up in the cache and, when the cache does not
// show it, in the API, so an informer lagging behind never makes a
// dependent look dangling.
func (gc *garbageCollector) ownerStateOf(ctx context.Context, dependent objectKey, ref metav1.OwnerReference) (ownerState, error) {
	info, ok := gc.m.kindInfo(ref.APIVersion, ref.Kind)
	if !ok {
		// An unknown kind may be served later; never delete for it,
		// but look again once discovery finds new kinds. A discovery
		// that found it between the first look and the record has
		// queued the others already: look once more.
		gc.mu.Lock()
		gc.unresolved[dependent] = struct{}{}
		gc.mu.Unlock()
		if info, ok = gc.m.kindInfo(ref.APIVersion, ref.Kind); !ok {
			gc.log.Debug("owner kind not served", "object", dependent.String(), "apiVersion", ref.APIVersion, "kind", ref.Kind)
			return ownerSolid, nil
		}
	}
	ns := ""
	if info.namespaced {
		ns = dependent.namespace
		if ns == "" {
			// A cluster-scoped object cannot have a namespaced owner.
			return ownerAbsent, nil
		}
	}
	state := func(p *metav1.PartialObjectMetadata) ownerState {
		if p.UID != ref.UID {
			return ownerAbsent
		}
		if beingDeletedWith(p) == metav1.FinalizerDeleteDependents {
			return ownerWaiting
		}
		return ownerSolid
	}
	k := objectKey{gvr: info.gvr, namespace: ns, name: ref.Name}
	if w := gc.m.watchedFor(info.gvr.GroupResource()); w != nil {
		k.gvr = w.info.gvr
		if p, ok := gc.cached(k); ok && p.UID == ref.UID {
			return state(p), nil
		}
	}
	var (
		p   *metav1.PartialObjectMetadata
		err error
	)
	if ns != "" {
		p, err = gc.meta.Resource(k.gvr).Namespace(ns).Get(ctx, ref.Name, metav1.GetOptions{})
	} else {
		p, err = gc.meta.Resource(k.gvr).Get(ctx, ref.Name, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		return ownerAbsent, nil
	case err != nil:
		return ownerSolid, fmt.Errorf("get owner %s %s: %w", ref.Kind, ref.Name, err)
	}
	return state(p), nil
}

// attemptToDelete deletes a dependent that has no solid owner left, and
// strips references to absent or foreground-deleted owners from a
// dependent that still has one. It acts only on the object as the API
// shows it now, never on a cached copy that may miss a recent change (an
// orphaning that just stripped the reference, say).
func (gc *garbageCollector) attemptToDelete(ctx context.Context, key objectKey, p *metav1.PartialObjectMetadata) error {
	if p.DeletionTimestamp != nil {
		return nil // already on its way out
	}
	states := map[types.UID]ownerState{}
	c, err := gc.classify(ctx, key, p.OwnerReferences, states)
	if err != nil || len(c.gone) == 0 {
		return err
	}
	live, err := gc.get(ctx, key)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if live.UID != p.UID || live.DeletionTimestamp != nil {
		return nil
	}
	if c, err = gc.classify(ctx, key, live.OwnerReferences, states); err != nil || len(c.gone) == 0 {
		return err
	}
	if len(c.solid) > 0 {
		gc.log.Info("removing references to deleted owners", "object", key.String(), "count", len(c.gone))
		return gc.setOwnerReferences(ctx, key, live, c.solid)
	}

	policy := metav1.DeletePropagationBackground
	switch {
	case slices.Contains(live.Finalizers, metav1.FinalizerOrphanDependents):
		policy = metav1.DeletePropagationOrphan
	case slices.Contains(live.Finalizers, metav1.FinalizerDeleteDependents):
		policy = metav1.DeletePropagationForeground
	case c.waiting && gc.hasDependents(live.UID):
		// An owner deleted in the foreground waits for the whole tree.
		policy = metav1.DeletePropagationForeground
	}
	gc.log.Info("deleting object whose owners are gone", "object", key.String(), "propagation", policy)
	return gc.delete(ctx, key, live, policy)
}

// classified sorts a dependent's owner references.
type classified struct {
	solid   []metav1.OwnerReference
	gone    []metav1.OwnerReference // absent, or being deleted in the foreground
	waiting bool                    // some owner is being deleted in the foreground
}

// classify looks every owner up, reusing the states already in states.
func (gc *garbageCollector) classify(ctx context.Context, key objectKey, refs []metav1.OwnerReference, states map[types.UID]ownerState) (classified, error) {
	var c classified
	for _, ref := range refs {
		st, ok := states[ref.UID]
		if !ok {
			var err error
			if st, err = gc.ownerStateOf(ctx, key, ref); err != nil {
				return c, err
			}
			states[ref.UID] = st
		}
		switch st {
		case ownerSolid:
			c.solid = append(c.solid, ref)
		case ownerAbsent:
			c.gone = append(c.gone, ref)
		case ownerWaiting:
			c.waiting = true
			c.gone = append(c.gone, ref)
		}
	}
	return c, nil
}

// get reads an object's metadata from the API.
func (gc *garbageCollector) get(ctx context.Context, key objectKey) (*metav1.PartialObjectMetadata, error) {
	r := gc.meta.Resource(key.gvr)
	if key.namespace != "" {
		return r.Namespace(key.namespace).Get(ctx, key.name, metav1.GetOptions{})
	}
	return r.Get(ctx, key.name, metav1.GetOptions{})
}

func (gc *garbageCollector) hasDependents(uid types.UID) bool {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	return len(gc.dependents[uid]) > 0
}

// deleteDependents carries out foreground deletion: it queues every
// dependent for deletion and, once none that blocks its owner remains,
// removes the foregroundDeletion finalizer.
func (gc *garbageCollector) deleteDependents(ctx context.Context, key objectKey, p *metav1.PartialObjectMetadata) error {
	namespaced := key.namespace != ""
	blocking := 0
	for _, d := range gc.dependentsOf(key, p.UID, namespaced) {
		dk := gc.keyOf(d)
		if dk == nil {
			continue
		}
		if d.DeletionTimestamp == nil {
			gc.queue.Add(*dk)
		}
		for _, ref := range d.OwnerReferences {
			if ref.UID == p.UID && ref.BlockOwnerDeletion != nil && *ref.BlockOwnerDeletion {
				blocking++
			}
		}
	}
	if blocking > 0 {
		gc.log.Debug("waiting for blocking dependents", "object", key.String(), "count", blocking)
		return nil
	}
	gc.log.Info("dependents deleted; releasing owner", "object", key.String())
	return gc.removeFinalizer(ctx, key, p, metav1.FinalizerDeleteDependents)
}

// orphanDependents strips the owner's reference from all its dependents,
// then removes the orphan finalizer.
func (gc *garbageCollector) orphanDependents(ctx context.Context, key objectKey, p *metav1.PartialObjectMetadata) error {
	for _, d := range gc.dependentsOf(key, p.UID, key.namespace != "") {
		dk := gc.keyOf(d)
		if dk == nil {
			continue
		}
		var keep []metav1.OwnerReference
		for _, ref := range d.OwnerReferences {
			if ref.UID != p.UID {
				keep = append(keep, ref)
			}
		}
		gc.log.Info("orphaning dependent", "object", dk.String(), "owner", key.String())
		if err := gc.setOwnerReferences(ctx, *dk, d, keep); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	gc.log.Info("dependents orphaned; releasing owner", "object", key.String())
	return gc.removeFinalizer(ctx, key, p, metav1.FinalizerOrphanDependents)
}

func (gc *garbageCollector) keyOf(p *metav1.PartialObjectMetadata) *objectKey {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	k, ok := gc.byUID[p.UID]
	if !ok {
		return nil
	}
	return &k
}

// jsonPatchOp is one RFC 6902 operation.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// patch applies a JSON patch guarded by the object's UID and
// resourceVersion, so a change made meanwhile fails it and the key is
// reconciled again from fresh state.
func (gc *garbageCollector) patch(ctx context.Context, key objectKey, p *metav1.PartialObjectMetadata, ops ...jsonPatchOp) error {
	all := append([]jsonPatchOp{
		{Op: "test", Path: "/metadata/uid", Value: p.UID},
		{Op: "test", Path: "/metadata/resourceVersion", Value: p.ResourceVersion},
	}, ops...)
	body, err := json.Marshal(all)
	if err != nil {
		return err
	}
	r := gc.meta.Resource(key.gvr)
	if key.namespace != "" {
		_, err = r.Namespace(key.namespace).Patch(ctx, key.name, types.JSONPatchType, body, metav1.PatchOptions{})
	} else {
		_, err = r.Patch(ctx, key.name, types.JSONPatchType, body, metav1.PatchOptions{})
	}
	if err != nil {
		return fmt.Errorf("patch %s: %w", key, err)
	}
	return nil
}

func (gc *garbageCollector) setOwnerReferences(ctx context.Context, key objectKey, p *metav1.PartialObjectMetadata, refs []metav1.OwnerReference) error {
	if len(refs) == 0 {
		return gc.patch(ctx, key, p, jsonPatchOp{Op: "remove", Path: "/metadata/ownerReferences"})
	}
	return gc.patch(ctx, key, p, jsonPatchOp{Op: "replace", Path: "/metadata/ownerReferences", Value: refs})
}

func (gc *garbageCollector) removeFinalizer(ctx context.Context, key objectKey, p *metav1.PartialObjectMetadata, fin string) error {
	keep := slices.DeleteFunc(slices.Clone(p.Finalizers), func(f string) bool { return f == fin })
	if len(keep) == 0 {
		return gc.patch(ctx, key, p, jsonPatchOp{Op: "remove", Path: "/metadata/finalizers"})
	}
	return gc.patch(ctx, key, p, jsonPatchOp{Op: "replace", Path: "/metadata/finalizers", Value: keep})
}

// delete deletes an object with UID and resourceVersion preconditions, so
// neither an object recreated under the same name nor one changed since it
// was read is deleted; a change queues the object again.
func (gc *garbageCollector) delete(ctx context.Context, key objectKey, p *metav1.PartialObjectMetadata, policy metav1.DeletionPropagation) error {
	uid, rv := p.UID, p.ResourceVersion
	opts := metav1.DeleteOptions{
		Preconditions:     &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
		PropagationPolicy: &policy,
	}
	r := gc.meta.Resource(key.gvr)
	var err error
	if key.namespace != "" {
		err = r.Namespace(key.namespace).Delete(ctx, key.name, opts)
	} else {
		err = r.Delete(ctx, key.name, opts)
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, replaced or changed: its own event queues it again
	}
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}
