package edge

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge/localstate"
	"github.com/tether-edge/tether/edge/state"
	"github.com/tether-edge/tether/edge/staticpods"
)

// This file connects the agent's parts to the local state: which informers
// are kept informers (edge/localstate) and under which names, how the pod
// manager starts pods from the local state and forgets their tombstones,
// and how the node's pod ranges are kept so that pods get addresses before
// the hub answers.

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

// localState is an agent's local state: the file its kept informers
// write to, and the agent's own records there (the node's pod ranges,
// static pods, local-path volumes, tombstones to forget).
type localState struct {
	*localstate.State
	log *slog.Logger

	hasNode atomic.Bool // the node's pod ranges were stored by an earlier run

	volumes localVolumes // local-path volume records (claims.go)
}

func openLocalState(dir string, opts localstate.Options) (*localState, error) {
	s, err := localstate.Open(filepath.Join(dir, stateFile), opts)
	if err != nil {
		return nil, err
	}
	return &localState{State: s, log: opts.Log}, nil
}

func (l *localState) close() {
	if err := l.Close(); err != nil {
		l.log.Warn("close local state", "err", err)
	}
}

// openLocal opens the local state in the data directory. A file SQLite
// cannot open is set aside (the hub has everything it held) rather than
// keeping the node from running.
func (a *Agent) openLocal() error {
	opts := localstate.Options{Log: a.log, AfterPersist: a.cfg.afterPersist}
	l, err := openLocalState(a.cfg.DataDir, opts)
	if err == nil {
		a.local = l
		return nil
	}
	path := filepath.Join(a.cfg.DataDir, stateFile)
	aside := fmt.Sprintf("%s.broken-%d", path, time.Now().Unix())
	a.log.Error("local state unreadable: setting it aside and starting from the hub", "err", err, "moved to", aside)
	if rerr := os.Rename(path, aside); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		return fmt.Errorf("open local state: %w", err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		_ = os.Rename(path+suffix, aside+suffix)
	}
	if a.local, err = openLocalState(a.cfg.DataDir, opts); err != nil {
		return fmt.Errorf("open local state: %w", err)
	}
	return nil
}

// keep returns the keep spec of a cluster-wide watch of kind (services,
// endpointslices), or nil when the agent has no local state.
func (a *Agent) keep(kind string) *localstate.Spec {
	if a.local == nil {
		return nil
	}
	return &localstate.Spec{State: a.local.State, Kind: kind, Watch: kind}
}

// keep returns the keep spec of the pod watch: deleted pods leave
// tombstones, and tombstones found at start-up are stopped.
func (m *podManager) keep() *localstate.Spec {
	if m.a.local == nil {
		return nil
	}
	return &localstate.Spec{
		State: m.a.local.State, Kind: keptPods, Watch: keptPods, Tombstones: true,
		OnTombstone: func(obj any) { m.goneFromState(obj.(*corev1.Pod)) },
		OnLoad:      m.a.local.collectRefs,
	}
}

// goneFromState makes sure a pod deleted from the hub is stopped, even
// when the agent has no worker for it (it was deleted before a restart).
func (m *podManager) goneFromState(p *corev1.Pod) {
	if staticpods.IsMirror(p) {
		m.a.local.podRemoved(p) // never ran
		return
	}
	w := m.worker(p.UID, true)
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.pod == nil {
		w.pod = p
	}
	w.gone = true
	w.mu.Unlock()
	w.poke()
}

// podRemoved forgets the tombstone of a pod the runtime no longer has.
func (l *localState) podRemoved(pod *corev1.Pod) {
	if l == nil || pod == nil {
		return
	}
	k := state.Key{Kind: keptPods, Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}
	if err := l.DB().Commit([]state.Op{{Key: k, Delete: true}}, nil); err != nil {
		l.log.Warn("forget removed pod", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
}

// refWatch is the local state's name of the watch of one referenced
// object.
func refWatch(r objectRef) string {
	return string(r.kind) + "/" + r.storeKey()
}

// keep returns the keep spec of the watch of one referenced object.
func (m *refManager) keep(r objectRef) *localstate.Spec {
	if m.a.local == nil {
		return nil
	}
	return &localstate.Spec{State: m.a.local.State, Kind: string(r.kind), Watch: refWatch(r), Namespace: r.namespace, Name: r.name}
}

// forget drops a referenced object nothing needs any more from the local
// state.
func (m *refManager) forget(r objectRef) {
	if m.a.local != nil {
		m.a.local.Forget(string(r.kind), refWatch(r), r.namespace, r.name)
	}
}

// collectRefs removes the ConfigMaps, Secrets, claims and volumes that
// none of pods references from the local state: a crash may have left
// them.
func (l *localState) collectRefs(objs []any) {
	claims := map[string]*corev1.PersistentVolumeClaim{}
	if rows, err := l.DB().List(keptPVC, "", ""); err == nil {
		for _, r := range rows {
			c := &corev1.PersistentVolumeClaim{}
			if !r.Gone && c.Unmarshal(r.Value) == nil {
				claims[r.Namespace+"/"+r.Name] = c
			}
		}
	}
	used := map[string]bool{}
	for _, o := range objs {
		refs := volumeRefs(podRefs(o.(*corev1.Pod)), func(ns, name string) *corev1.PersistentVolumeClaim {
			return claims[ns+"/"+name]
		})
		for _, r := range refs {
			used[refWatch(r)] = true
		}
	}
	watches, err := l.DB().Watches()
	if err != nil {
		l.log.Warn("collect unused objects", "err", err)
		return
	}
	var ops []state.Op
	drop := map[string]string{}
	for _, kind := range []string{keptConfigMap, keptSecret, keptPVC, keptPV} {
		keys, err := l.DB().Keys(kind)
		if err != nil {
			l.log.Warn("collect unused objects", "err", err)
			return
		}
		for _, k := range keys {
			if !used[refWatch(objectRef{kind: refKind(kind), namespace: k.Namespace, name: k.Name})] {
				ops = append(ops, state.Op{Key: k, Delete: true})
			}
		}
	}
	for w := range watches {
		if w == keptPods || w == keptServices || w == keptSlices || w == keptClasses || used[w] || siteWatch(w) ||
			w == keptIngresses || w == keptIngressClasses || isIngressSecretWatch(w) || netpolWatch(w) || w == keptImageStagings {
			continue
		}
		drop[w] = ""
	}
	if len(ops) == 0 && len(drop) == 0 {
		return
	}
	if err := l.DB().Commit(ops, drop); err != nil {
		l.log.Warn("collect unused objects", "err", err)
	}
}

// loadNode returns the node's pod ranges stored by an earlier run, as a
// Node with only its name and spec, or nil.
func (l *localState) loadNode(name string) *corev1.Node {
	rows, err := l.DB().List(keptNodes, "", "")
	if err != nil {
		l.log.Warn("read local state", "err", err)
		return nil
	}
	for _, r := range rows {
		n := &corev1.Node{}
		if r.Name == name && n.Unmarshal(r.Value) == nil {
			l.hasNode.Store(true)
			return n
		}
	}
	return nil
}

// saveNode stores the node's pod ranges when they changed.
func (l *localState) saveNode(node *corev1.Node) {
	if l == nil || node == nil {
		return
	}
	keep := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID},
		Spec:       corev1.NodeSpec{PodCIDR: node.Spec.PodCIDR, PodCIDRs: slices.Clone(node.Spec.PodCIDRs)},
	}
	b, err := keep.Marshal()
	if err != nil {
		return
	}
	rows, err := l.DB().List(keptNodes, "", "")
	if err != nil {
		l.log.Warn("read local state", "err", err)
		return
	}
	k := state.Key{Kind: keptNodes, Name: node.Name, UID: string(node.UID)}
	var ops []state.Op
	same := false
	for _, r := range rows {
		if r.Key == k && string(r.Value) == string(b) {
			same = true
			continue
		}
		ops = append(ops, state.Op{Key: r.Key, Delete: true})
	}
	if !same {
		ops = append(ops, state.Op{Key: k, Value: b})
	}
	if len(ops) == 0 {
		return
	}
	if err := l.DB().Commit(ops, nil); err != nil {
		l.log.Warn("store node pod ranges", "err", err)
		return
	}
	l.hasNode.Store(true)
}
