package edge

import (
	"context"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// refKind is a kind of object pods reference.
type refKind string

const (
	refConfigMap refKind = "configmaps"
	refSecret    refKind = "secrets"
	refPVC       refKind = "persistentvolumeclaims"
	refPV        refKind = "persistentvolumes" // cluster-scoped: no namespace
)

// objectRef names an object a pod references.
type objectRef struct {
	kind            refKind
	namespace, name string
}

// storeKey is the object's key in its watch's store.
func (r objectRef) storeKey() string {
	if r.namespace == "" {
		return r.name
	}
	return r.namespace + "/" + r.name
}

// refManager watches exactly the ConfigMaps, Secrets and
// PersistentVolumeClaims the node's pods reference, and the
// PersistentVolumes bound to those claims, one watch per object (selected
// by metadata.name, which is all the hub lets a node read), started when
// the first pod references the object and stopped when the last one goes.
type refManager struct {
	a *Agent

	mu       sync.Mutex
	ctx      context.Context
	watchers map[objectRef]*objectWatcher
	byPod    map[types.UID][]objectRef
}

type objectWatcher struct {
	stop   context.CancelFunc
	store  cache.Store
	synced func() bool
	users  int
}

func newRefManager(a *Agent) *refManager {
	return &refManager{a: a, watchers: map[objectRef]*objectWatcher{}, byPod: map[types.UID][]objectRef{}}
}

func (m *refManager) start(ctx context.Context) {
	m.mu.Lock()
	m.ctx = ctx
	m.mu.Unlock()
}

// podRefs lists the ConfigMaps, Secrets and claims pod uses. The volumes
// bound to the claims depend on the claims: see volumeRefs.
func podRefs(pod *corev1.Pod) []objectRef {
	var refs []objectRef
	add := func(k refKind, name string) {
		if name == "" {
			return
		}
		r := objectRef{kind: k, namespace: pod.Namespace, name: name}
		if !slices.Contains(refs, r) {
			refs = append(refs, r)
		}
	}
	for _, s := range pod.Spec.ImagePullSecrets {
		add(refSecret, s.Name)
	}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if claim := ClaimName(pod, v); claim != "" {
			add(refPVC, claim)
			continue
		}
		switch {
		case v.ConfigMap != nil:
			add(refConfigMap, v.ConfigMap.Name)
		case v.Secret != nil:
			add(refSecret, v.Secret.SecretName)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.ConfigMap != nil {
					add(refConfigMap, src.ConfigMap.Name)
				}
				if src.Secret != nil {
					add(refSecret, src.Secret.Name)
				}
			}
		}
	}
	containers := append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
	for _, c := range containers {
		for _, e := range c.EnvFrom {
			if e.ConfigMapRef != nil {
				add(refConfigMap, e.ConfigMapRef.Name)
			}
			if e.SecretRef != nil {
				add(refSecret, e.SecretRef.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				add(refConfigMap, r.Name)
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				add(refSecret, r.Name)
			}
		}
	}
	return refs
}

// volumeRefs adds to refs the volumes bound to its claims, as far as
// claim(namespace, name) knows them.
func volumeRefs(refs []objectRef, claim func(namespace, name string) *corev1.PersistentVolumeClaim) []objectRef {
	for _, r := range refs {
		if r.kind != refPVC {
			continue
		}
		if pvc := claim(r.namespace, r.name); pvc != nil && pvc.Spec.VolumeName != "" {
			pv := objectRef{kind: refPV, name: pvc.Spec.VolumeName}
			if !slices.Contains(refs, pv) {
				refs = append(refs, pv)
			}
		}
	}
	return refs
}

// track makes sure the objects pod references are watched, and the
// volumes bound to its claims once the claims' watches know them (a
// claim's change wakes the pod, which tracks it again).
func (m *refManager) track(pod *corev1.Pod) {
	refs := podRefs(pod)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx == nil {
		return
	}
	for _, r := range refs {
		if m.watchers[r] == nil {
			m.watchers[r] = m.watch(r) // counted below
		}
	}
	refs = volumeRefs(refs, func(ns, name string) *corev1.PersistentVolumeClaim {
		w := m.watchers[objectRef{kind: refPVC, namespace: ns, name: name}]
		if obj, ok, _ := w.store.GetByKey(ns + "/" + name); ok {
			return obj.(*corev1.PersistentVolumeClaim)
		}
		return nil
	})
	old := m.byPod[pod.UID]
	for _, r := range refs {
		w := m.watchers[r]
		if w == nil {
			w = m.watch(r)
			m.watchers[r] = w
		}
		if !slices.Contains(old, r) {
			w.users++
		}
	}
	for _, r := range old {
		if !slices.Contains(refs, r) {
			m.drop(r)
		}
	}
	if len(refs) == 0 {
		delete(m.byPod, pod.UID)
	} else {
		m.byPod[pod.UID] = refs
	}
}

// release stops the watches only pod needed.
func (m *refManager) release(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.byPod[uid] {
		m.drop(r)
	}
	delete(m.byPod, uid)
}

func (m *refManager) drop(r objectRef) {
	w := m.watchers[r]
	if w == nil {
		return
	}
	if w.users--; w.users <= 0 {
		w.stop()
		delete(m.watchers, r)
		m.forget(r)
	}
}

// watch starts watching one object. m.mu is held.
func (m *refManager) watch(r objectRef) *objectWatcher {
	ctx, cancel := context.WithCancel(m.ctx)
	sel := fields.OneTermEqualSelector("metadata.name", r.name).String()
	var lw *listWatch
	var obj runtime.Object
	switch r.kind {
	case refPVC:
		c := m.a.client.PersistentVolumeClaims(r.namespace)
		obj = &corev1.PersistentVolumeClaim{}
		lw = namedListWatch(sel, c.List, c.Watch)
	case refPV:
		c := m.a.client.PersistentVolumes()
		obj = &corev1.PersistentVolume{}
		lw = namedListWatch(sel, c.List, c.Watch)
	case refConfigMap:
		c := m.a.client.ConfigMaps(r.namespace)
		obj = &corev1.ConfigMap{}
		lw = namedListWatch(sel, c.List, c.Watch)
	default:
		c := m.a.client.Secrets(r.namespace)
		obj = &corev1.Secret{}
		lw = namedListWatch(sel, c.List, c.Watch)
	}
	lw.keep = m.keep(r) // local state: offline.go
	// A change of the object concerns the pods that use it (their
	// volumes, a claim now bound); wake them.
	notify := func(any) { m.wakeUsers(r) }
	store, ctrl := newInformer(lw, obj, cache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, o any) { notify(o) }, DeleteFunc: notify,
	})
	go ctrl.RunWithContext(ctx)
	return &objectWatcher{stop: cancel, store: store, synced: ctrl.HasSynced}
}

// namedListWatch lists and watches through a typed client with the field
// selector sel.
func namedListWatch[L runtime.Object](sel string,
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *listWatch {
	return selectedListWatch(func(o *metav1.ListOptions) { o.FieldSelector = sel }, list, watchFn)
}

// selectedListWatch lists and watches through a typed client with the
// options sel sets (a field or label selector).
func selectedListWatch[L runtime.Object](sel func(*metav1.ListOptions),
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *listWatch {
	return &listWatch{
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			sel(&o)
			return list(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			sel(&o)
			return watchFn(ctx, o)
		},
	}
}

func (m *refManager) wakeUsers(r objectRef) {
	m.mu.Lock()
	var uids []types.UID
	for uid, refs := range m.byPod {
		if slices.Contains(refs, r) {
			uids = append(uids, uid)
		}
	}
	m.mu.Unlock()
	for _, uid := range uids {
		m.a.pods.runtimeChanged(uid)
	}
}

// watched returns how many objects are watched.
func (m *refManager) watched() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.watchers)
}
