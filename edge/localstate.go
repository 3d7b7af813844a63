package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/state"
)

// The agent keeps what its node must run in a local state file
// (edge/state): the pods bound to the node, the ConfigMaps, Secrets and
// PersistentVolumeClaims they reference and the PersistentVolumes bound to
// those, the Services and EndpointSlices, the node's pod ranges, and the
// resourceVersion of every watch. Informers whose listWatch carries a
// keepSpec are "kept" informers:
//
//   - At construction they load their objects from the local state into
//     their store, so that sources and the data plane have them at once;
//     when they run, they hand them to their handlers first (the pod
//     manager starts the pods), before any request to the hub.
//   - They resume their watch from the stored resourceVersion; only a
//     watch the hub can no longer serve (410 Gone) makes them list, and
//     the list replaces the local state: what is gone from the hub is
//     deleted, and its handlers hear of it.
//   - Every event is written to the local state (with the watch's new
//     resourceVersion, in one transaction) before the store and the
//     handlers see it. A crash after the write and before the action is
//     harmless: the next start acts on what was written. Deleted pods
//     leave a tombstone until their worker removed them from the runtime,
//     so that a crash in between cannot leave a deleted pod running.

// stateFile is the local state's file in the data directory.
const stateFile = "state.db"

// Kinds and watches of the local state.
const (
	keptPods      = "pods"
	keptNodes     = "nodes"
	keptServices  = "services"
	keptSlices    = "endpointslices"
	keptClasses   = "runtimeclasses"
	keptConfigMap = string(refConfigMap)
	keptSecret    = string(refSecret)
	keptPVC       = string(refPVC)
	keptPV        = string(refPV)
)

// localState is an agent's handle on its local state file.
type localState struct {
	db  *state.Store
	log *slog.Logger
	// afterPersist, when set (by tests), is called after an event was
	// written to the local state and before the agent acts on it.
	afterPersist func(kind string, ev watch.EventType, obj metav1.Object)

	mu        sync.Mutex
	connected chan struct{} // closed and replaced at every tunnel connect

	hasNode atomic.Bool // the node's pod ranges were stored by an earlier run

	volumes localVolumes // local-path volume records (claims.go)
}

func openLocalState(dir string, log *slog.Logger, afterPersist func(kind string, ev watch.EventType, obj metav1.Object)) (*localState, error) {
	db, err := state.Open(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, err
	}
	return &localState{db: db, log: log, afterPersist: afterPersist, connected: make(chan struct{})}, nil
}

// persisted calls the afterPersist hook, if any.
func (l *localState) persisted(kind string, ev watch.EventType, obj metav1.Object) {
	if l.afterPersist != nil {
		l.afterPersist(kind, ev, obj)
	}
}

func (l *localState) close() {
	if err := l.db.Close(); err != nil {
		l.log.Warn("close local state", "err", err)
	}
}

// reconnected wakes the kept informers waiting to retry: the hub is back.
func (l *localState) reconnected() {
	l.mu.Lock()
	close(l.connected)
	l.connected = make(chan struct{})
	l.mu.Unlock()
}

func (l *localState) connectedCh() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.connected
}

// keepSpec says what a kept informer stores and where.
type keepSpec struct {
	local *localState
	kind  string // the objects' kind in the local state
	watch string // the watch's name in the local state
	// namespace and name restrict a watch of one object.
	namespace, name string
	// tombstones keeps deleted objects, marked gone, until forgotten.
	tombstones bool
	// onTombstone is called at run for each tombstone found at load.
	onTombstone func(obj any)
	// onLoad is called at construction with the live objects loaded.
	onLoad func(objs []any)
}

// protoObject is an API object the local state stores in protobuf.
type protoObject interface {
	runtime.Object
	metav1.Object
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

// keptInformer implements cache.Controller over a listWatch and the local
// state.
type keptInformer struct {
	spec  keepSpec
	lw    *listWatch
	typ   reflect.Type
	h     cache.ResourceEventHandler
	store cache.Store
	log   *slog.Logger

	loaded, tombs []any // delivered to the handlers when it runs
	rv            atomic.Pointer[string]
	synced        atomic.Bool
	syncedCh      chan struct{}
	syncOnce      sync.Once
}

var _ cache.Controller = (*keptInformer)(nil)

func newKeptInformer(lw *listWatch, obj runtime.Object, h cache.ResourceEventHandler) (cache.Store, cache.Controller) {
	i := &keptInformer{
		spec: *lw.keep, lw: lw, typ: reflect.TypeOf(obj).Elem(), h: h,
		store:    cache.NewStore(cache.MetaNamespaceKeyFunc),
		log:      lw.keep.local.log.With("watch", lw.keep.watch),
		syncedCh: make(chan struct{}),
	}
	empty := ""
	i.rv.Store(&empty)
	i.load()
	return i.store, i
}

func (i *keptInformer) newObject() protoObject {
	return reflect.New(i.typ).Interface().(protoObject)
}

// load fills the store from the local state.
func (i *keptInformer) load() {
	db := i.spec.local.db
	rows, err := db.List(i.spec.kind, i.spec.namespace, i.spec.name)
	if err != nil {
		i.log.Warn("read local state", "err", err)
		return
	}
	rv, err := db.Watch(i.spec.watch)
	if err != nil {
		i.log.Warn("read local state", "err", err)
		return
	}
	for _, row := range rows {
		obj := i.newObject()
		if err := obj.Unmarshal(row.Value); err != nil {
			i.log.Warn("skip unreadable object in the local state", "object", row.Namespace+"/"+row.Name, "err", err)
			continue
		}
		if row.Gone {
			i.tombs = append(i.tombs, obj)
			continue
		}
		_ = i.store.Add(obj)
		i.loaded = append(i.loaded, obj)
	}
	if i.spec.onLoad != nil {
		i.spec.onLoad(i.loaded)
	}
	if rv != "" {
		// A list completed once and the store holds its result
		// with every event since: good enough until the hub
		// answers.
		i.rv.Store(&rv)
		i.markSynced()
	}
}

func (i *keptInformer) markSynced() {
	i.synced.Store(true)
	i.syncOnce.Do(func() { close(i.syncedCh) })
}

// HasSynced implements cache.Controller.
func (i *keptInformer) HasSynced() bool { return i.synced.Load() }

// HasSyncedChecker implements cache.Controller.
func (i *keptInformer) HasSyncedChecker() cache.DoneChecker { return syncedChecker{i} }

type syncedChecker struct{ i *keptInformer }

func (c syncedChecker) Name() string          { return c.i.spec.watch }
func (c syncedChecker) Done() <-chan struct{} { return c.i.syncedCh }

// LastSyncResourceVersion implements cache.Controller.
func (i *keptInformer) LastSyncResourceVersion() string { return *i.rv.Load() }

// Run implements cache.Controller.
func (i *keptInformer) Run(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	i.RunWithContext(ctx)
}

// Watch retry delays when the hub does not answer.
const (
	keptRetryBase = 500 * time.Millisecond
	keptRetryCap  = 15 * time.Second
)

// RunWithContext implements cache.Controller: it hands the loaded objects
// to the handlers, then keeps the store current until ctx ends.
func (i *keptInformer) RunWithContext(ctx context.Context) {
	for _, obj := range i.loaded {
		i.h.OnAdd(obj, true)
	}
	i.loaded = nil
	if i.spec.onTombstone != nil {
		for _, obj := range i.tombs {
			i.spec.onTombstone(obj)
		}
	}
	i.tombs = nil
	wait := time.Duration(0)
	for ctx.Err() == nil {
		var err error
		if i.LastSyncResourceVersion() == "" {
			err = i.relist(ctx)
		} else {
			err = i.watch(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			wait = 0
			continue
		case isGone(err):
			// The hub no longer has the window: list again.
			i.log.Info("watch expired: listing", "err", err)
			empty := ""
			i.rv.Store(&empty)
			wait = 0
			continue
		}
		wait = min(max(2*wait, keptRetryBase), keptRetryCap)
		d := wait/2 + rand.N(wait/2+1)
		i.log.Debug("watch failed", "err", err, "retry in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-i.spec.local.connectedCh():
			t.Stop()
			wait = 0
		}
	}
}

var (
	errWatchClosed = errors.New("watch closed without events")
	errWatchBroken = errors.New("watch stream broken")
)

// isGone reports the hub's answer to a resourceVersion it no longer has.
func isGone(err error) bool {
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return true
	}
	var st apierrors.APIStatus
	return errors.As(err, &st) && st.Status().Code == http.StatusGone
}

// relist lists the objects and makes the local state, the store and the
// handlers match the list.
func (i *keptInformer) relist(ctx context.Context) error {
	list, err := i.lw.list(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	type change struct {
		old, cur protoObject // old nil: added; cur nil: deleted
	}
	var ops []state.Op
	var changes []change
	listed := make(map[string]bool, len(items))
	for _, it := range items {
		obj, ok := it.(protoObject)
		if !ok {
			return fmt.Errorf("list: unexpected %T", it)
		}
		trimForCache(obj)
		key, _ := cache.MetaNamespaceKeyFunc(obj)
		listed[key] = true
		var old protoObject
		if o, ok, _ := i.store.GetByKey(key); ok {
			old = o.(protoObject)
		}
		if old != nil && old.GetUID() == obj.GetUID() && old.GetResourceVersion() == obj.GetResourceVersion() {
			continue
		}
		if old != nil && old.GetUID() != obj.GetUID() {
			op, err := i.removeOp(old)
			if err != nil {
				return err
			}
			ops = append(ops, op)
			changes = append(changes, change{old: old})
			old = nil
		}
		op, err := i.putOp(obj)
		if err != nil {
			return err
		}
		ops = append(ops, op)
		changes = append(changes, change{old: old, cur: obj})
	}
	for _, o := range i.store.List() {
		old := o.(protoObject)
		key, _ := cache.MetaNamespaceKeyFunc(old)
		if listed[key] {
			continue
		}
		op, err := i.removeOp(old)
		if err != nil {
			return err
		}
		ops = append(ops, op)
		changes = append(changes, change{old: old})
	}
	rv := lm.GetResourceVersion()
	if err := i.spec.local.db.Commit(ops, map[string]string{i.spec.watch: rv}); err != nil {
		return err
	}
	for _, c := range changes {
		switch {
		case c.cur == nil:
			i.spec.local.persisted(i.spec.kind, watch.Deleted, c.old)
			_ = i.store.Delete(c.old)
			i.h.OnDelete(c.old)
		case c.old == nil:
			i.spec.local.persisted(i.spec.kind, watch.Added, c.cur)
			_ = i.store.Add(c.cur)
			i.h.OnAdd(c.cur, false)
		default:
			i.spec.local.persisted(i.spec.kind, watch.Modified, c.cur)
			_ = i.store.Update(c.cur)
			i.h.OnUpdate(c.old, c.cur)
		}
	}
	i.rv.Store(&rv)
	i.markSynced()
	i.log.Debug("listed", "objects", len(items), "changes", len(changes), "resourceVersion", rv)
	return nil
}

func (i *keptInformer) key(obj protoObject) state.Key {
	return state.Key{Kind: i.spec.kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: string(obj.GetUID())}
}

func (i *keptInformer) putOp(obj protoObject) (state.Op, error) {
	b, err := obj.Marshal()
	if err != nil {
		return state.Op{}, fmt.Errorf("encode %s %s/%s: %w", i.spec.kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return state.Op{Key: i.key(obj), Value: b}, nil
}

// removeOp deletes obj, or marks it gone where tombstones are kept.
func (i *keptInformer) removeOp(obj protoObject) (state.Op, error) {
	if !i.spec.tombstones {
		return state.Op{Key: i.key(obj), Delete: true}, nil
	}
	op, err := i.putOp(obj)
	op.Gone = true
	return op, err
}

// watch resumes the watch from the last resourceVersion and applies its
// events until it ends. It returns nil when the watch ended normally.
func (i *keptInformer) watch(ctx context.Context) error {
	timeout := int64((minWatchTimeout + rand.N(minWatchTimeout)).Seconds())
	w, err := i.lw.watch(ctx, metav1.ListOptions{
		ResourceVersion:     i.LastSyncResourceVersion(),
		AllowWatchBookmarks: true,
		TimeoutSeconds:      &timeout,
	})
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer w.Stop()
	start := time.Now()
	events := 0
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				if events == 0 && time.Since(start) < time.Second {
					return errWatchClosed
				}
				return nil
			}
			events++
			if err := i.apply(ev); err != nil {
				return err
			}
		}
	}
}

// apply writes one event to the local state, then to the store and the
// handlers.
func (i *keptInformer) apply(ev watch.Event) error {
	if ev.Type == watch.Error {
		if brokenStream(ev) {
			return errWatchBroken
		}
		return fmt.Errorf("watch: %w", apierrors.FromObject(ev.Object))
	}
	obj, ok := ev.Object.(protoObject)
	if !ok {
		return fmt.Errorf("watch: unexpected %T", ev.Object)
	}
	rv := obj.GetResourceVersion()
	if ev.Type == watch.Bookmark {
		i.spec.local.db.SetLazy(i.spec.watch, rv)
		i.rv.Store(&rv)
		return nil
	}
	trimForCache(obj)
	key, _ := cache.MetaNamespaceKeyFunc(obj)
	var old protoObject
	if o, ok, _ := i.store.GetByKey(key); ok {
		old = o.(protoObject)
	}
	var ops []state.Op
	switch ev.Type {
	case watch.Added, watch.Modified:
		if old != nil && old.GetUID() != obj.GetUID() {
			op, err := i.removeOp(old)
			if err != nil {
				return err
			}
			ops = append(ops, op)
		}
		op, err := i.putOp(obj)
		if err != nil {
			return err
		}
		ops = append(ops, op)
	case watch.Deleted:
		if old == nil || old.GetUID() != obj.GetUID() {
			// Not an object the agent has: only the version moves.
			i.spec.local.db.SetLazy(i.spec.watch, rv)
			i.rv.Store(&rv)
			return nil
		}
		op, err := i.removeOp(obj)
		if err != nil {
			return err
		}
		ops = append(ops, op)
	default:
		return fmt.Errorf("watch: unexpected event %q", ev.Type)
	}
	if err := i.spec.local.db.Commit(ops, map[string]string{i.spec.watch: rv}); err != nil {
		// Not acted on: the watch resumes from the last version
		// written, and the event comes again.
		return err
	}
	i.spec.local.persisted(i.spec.kind, ev.Type, obj)
	i.rv.Store(&rv)
	switch {
	case ev.Type == watch.Deleted:
		_ = i.store.Delete(obj)
		i.h.OnDelete(obj)
	case old == nil:
		_ = i.store.Add(obj)
		i.h.OnAdd(obj, false)
	case old.GetUID() != obj.GetUID():
		_ = i.store.Delete(old)
		i.h.OnDelete(old)
		_ = i.store.Add(obj)
		i.h.OnAdd(obj, false)
	default:
		_ = i.store.Update(obj)
		i.h.OnUpdate(old, obj)
	}
	return nil
}

// forget removes a watch of one object and its object from the local
// state, once nothing needs them.
func (l *localState) forget(kind, watchName, namespace, name string) {
	rows, err := l.db.List(kind, namespace, name)
	if err != nil {
		l.log.Warn("forget watch", "watch", watchName, "err", err)
		return
	}
	var ops []state.Op
	for _, r := range rows {
		ops = append(ops, state.Op{Key: r.Key, Delete: true})
	}
	if err := l.db.Commit(ops, map[string]string{watchName: ""}); err != nil {
		l.log.Warn("forget watch", "watch", watchName, "err", err)
	}
}
