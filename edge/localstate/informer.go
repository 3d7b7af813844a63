package localstate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
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

// Spec is a keep spec: what a kept informer stores and where.
type Spec struct {
	// State is the local state the informer loads from and writes to.
	State *State
	// Kind is the objects' kind in the local state.
	Kind string
	// Watch is the watch's name in the local state.
	Watch string
	// Namespace and Name restrict a watch of one object.
	Namespace, Name string
	// Tombstones keeps deleted objects, marked gone, until forgotten.
	Tombstones bool
	// OnTombstone is called at run for each tombstone found at load.
	OnTombstone func(obj any)
	// OnLoad is called at construction with the live objects loaded.
	OnLoad func(objs []any)
	// Changed, when set, says whether an update of an object changed what
	// must outlive a restart. An update it says no to reaches the store
	// and the handlers at once but is not written: the watch's new
	// resourceVersion goes with the next write (lazily), so the local
	// state keeps the older copy until an update that counts, and a
	// restart resumes the watch past the updates in between. Nil means
	// every update is written.
	Changed func(old, cur runtime.Object) bool
}

// ListFunc lists the watched objects on the hub.
type ListFunc func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)

// WatchFunc watches the watched objects on the hub.
type WatchFunc func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)

// protoObject is an API object the local state stores in protobuf.
type protoObject interface {
	runtime.Object
	metav1.Object
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

// informer implements cache.Controller over list, watch and the local
// state.
type informer struct {
	spec  Spec
	list  ListFunc
	watch WatchFunc
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

var _ cache.Controller = (*informer)(nil)

// NewInformer returns a kept informer of the objects of obj's type that
// list and watch reach on the hub, and its store, already filled from the
// local state. obj's type must be stored in protobuf (a *corev1.Pod, for
// example). h hears of the loaded objects when the informer runs.
func NewInformer(spec Spec, list ListFunc, watch WatchFunc, obj runtime.Object, h cache.ResourceEventHandler) (cache.Store, cache.Controller) {
	i := &informer{
		spec: spec, list: list, watch: watch, typ: reflect.TypeOf(obj).Elem(), h: h,
		store:    cache.NewStore(cache.MetaNamespaceKeyFunc),
		log:      spec.State.log.With("watch", spec.Watch),
		syncedCh: make(chan struct{}),
	}
	empty := ""
	i.rv.Store(&empty)
	i.load()
	return i.store, i
}

func (i *informer) newObject() protoObject {
	return reflect.New(i.typ).Interface().(protoObject)
}

// load fills the store from the local state.
func (i *informer) load() {
	db := i.spec.State.db
	rows, err := db.List(i.spec.Kind, i.spec.Namespace, i.spec.Name)
	if err != nil {
		i.log.Warn("read local state", "err", err)
		return
	}
	rv, err := db.Watch(i.spec.Watch)
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
	if i.spec.OnLoad != nil {
		i.spec.OnLoad(i.loaded)
	}
	if rv != "" {
		// A list completed once and the store holds its result
		// with every event since: good enough until the hub
		// answers.
		i.rv.Store(&rv)
		i.markSynced()
	}
}

func (i *informer) markSynced() {
	i.synced.Store(true)
	i.syncOnce.Do(func() { close(i.syncedCh) })
}

// HasSynced implements cache.Controller.
func (i *informer) HasSynced() bool { return i.synced.Load() }

// HasSyncedChecker implements cache.Controller.
func (i *informer) HasSyncedChecker() cache.DoneChecker { return syncedChecker{i} }

type syncedChecker struct{ i *informer }

func (c syncedChecker) Name() string          { return c.i.spec.Watch }
func (c syncedChecker) Done() <-chan struct{} { return c.i.syncedCh }

// LastSyncResourceVersion implements cache.Controller.
func (i *informer) LastSyncResourceVersion() string { return *i.rv.Load() }

// Run implements cache.Controller.
func (i *informer) Run(stop <-chan struct{}) {
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
	retryBase = 500 * time.Millisecond
	retryCap  = 15 * time.Second
)

// RunWithContext implements cache.Controller: it hands the loaded objects
// to the handlers, then keeps the store current until ctx ends.
func (i *informer) RunWithContext(ctx context.Context) {
	for _, obj := range i.loaded {
		i.h.OnAdd(obj, true)
	}
	i.loaded = nil
	if i.spec.OnTombstone != nil {
		for _, obj := range i.tombs {
			i.spec.OnTombstone(obj)
		}
	}
	i.tombs = nil
	wait := time.Duration(0)
	for ctx.Err() == nil {
		var err error
		if i.LastSyncResourceVersion() == "" {
			err = i.relist(ctx)
		} else {
			err = i.resume(ctx)
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
		wait = min(max(2*wait, retryBase), retryCap)
		d := wait/2 + rand.N(wait/2+1)
		i.log.Debug("watch failed", "err", err, "retry in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-i.spec.State.Connected():
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
func (i *informer) relist(ctx context.Context) error {
	list, err := i.list(ctx, metav1.ListOptions{})
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
		old, cur  protoObject // old nil: added; cur nil: deleted
		unwritten bool        // an update Spec.Changed let pass unwritten
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
		if old != nil && old.GetUID() == obj.GetUID() && i.spec.Changed != nil && !i.spec.Changed(old, obj) {
			changes = append(changes, change{old: old, cur: obj, unwritten: true})
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
	if err := i.spec.State.db.Commit(ops, map[string]string{i.spec.Watch: rv}); err != nil {
		return err
	}
	for _, c := range changes {
		switch {
		case c.cur == nil:
			i.spec.State.persisted(i.spec.Kind, watch.Deleted, c.old)
			_ = i.store.Delete(c.old)
			i.h.OnDelete(c.old)
		case c.old == nil:
			i.spec.State.persisted(i.spec.Kind, watch.Added, c.cur)
			_ = i.store.Add(c.cur)
			i.h.OnAdd(c.cur, false)
		default:
			if !c.unwritten {
				i.spec.State.persisted(i.spec.Kind, watch.Modified, c.cur)
			}
			_ = i.store.Update(c.cur)
			i.h.OnUpdate(c.old, c.cur)
		}
	}
	i.rv.Store(&rv)
	i.markSynced()
	i.log.Debug("listed", "objects", len(items), "changes", len(changes), "resourceVersion", rv)
	return nil
}

func (i *informer) key(obj protoObject) state.Key {
	return state.Key{Kind: i.spec.Kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: string(obj.GetUID())}
}

func (i *informer) putOp(obj protoObject) (state.Op, error) {
	b, err := obj.Marshal()
	if err != nil {
		return state.Op{}, fmt.Errorf("encode %s %s/%s: %w", i.spec.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return state.Op{Key: i.key(obj), Value: b}, nil
}

// removeOp deletes obj, or marks it gone where tombstones are kept.
func (i *informer) removeOp(obj protoObject) (state.Op, error) {
	if !i.spec.Tombstones {
		return state.Op{Key: i.key(obj), Delete: true}, nil
	}
	op, err := i.putOp(obj)
	op.Gone = true
	return op, err
}

// resume resumes the watch from the last resourceVersion and applies its
// events until it ends. It returns nil when the watch ended normally.
func (i *informer) resume(ctx context.Context) error {
	timeout := int64((MinWatchTimeout + rand.N(MinWatchTimeout)).Seconds())
	w, err := i.watch(ctx, metav1.ListOptions{
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
func (i *informer) apply(ev watch.Event) error {
	if ev.Type == watch.Error {
		if BrokenStream(ev) {
			return errWatchBroken
		}
		return fmt.Errorf("watch: %w", apierrors.FromObject(ev.Object))
	}
	obj, ok := ev.Object.(protoObject)
	if !ok {
		return fmt.Errorf("watch: unexpected %T", ev.Object)
	}
	db := i.spec.State.db
	rv := obj.GetResourceVersion()
	if ev.Type == watch.Bookmark {
		db.SetLazy(i.spec.Watch, rv)
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
	// unwritten: an update that changed nothing that must outlive a
	// restart; the local state keeps the older copy.
	unwritten := false
	switch ev.Type {
	case watch.Added, watch.Modified:
		if old != nil && old.GetUID() == obj.GetUID() && i.spec.Changed != nil && !i.spec.Changed(old, obj) {
			unwritten = true
			break
		}
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
			db.SetLazy(i.spec.Watch, rv)
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
	if unwritten {
		// Only the version moves.
		db.SetLazy(i.spec.Watch, rv)
	} else {
		if err := db.Commit(ops, map[string]string{i.spec.Watch: rv}); err != nil {
			// Not acted on: the watch resumes from the last version
			// written, and the event comes again.
			return err
		}
		i.spec.State.persisted(i.spec.Kind, ev.Type, obj)
	}
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
