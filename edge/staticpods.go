package edge

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge/state"
	"github.com/tether-edge/tether/edge/staticpods"
)

// Static pods: edge/staticpods reads the manifest directory
// (Config.PodManifestPath) and makes its pods; the agent watches the
// directory (inotify, and a full read every staticpods.Rescan): a new file
// starts its pod, a changed one replaces it, a removed one stops it.
//
// Static pods are kept in the local state before they run, so that the
// pod of a file removed while the agent was down is stopped when it
// starts again. They may not refer to other API objects (service
// accounts, secrets, config maps, claims): the node could not read them.
//
// The hub learns of a static pod through its mirror pod (mirror.go).

// keptStatic is the local state's kind of static pods.
const keptStatic = "staticpods"

// staticSource hands the static pods of the manifest directory to the pod
// manager.
type staticSource struct {
	a      *Agent
	path   string
	reader *staticpods.Reader

	pods map[types.UID]*corev1.Pod // the pods handed over, by UID
}

func newStaticSource(a *Agent, path string) *staticSource {
	return &staticSource{a: a, path: path, reader: staticpods.NewReader(path, a.name, staticRefs, a.log)}
}

// run reads the directory until ctx ends.
func (s *staticSource) run(ctx context.Context) {
	staticpods.Watch(ctx, s.path, staticpods.Rescan, s.a.log, s.scan)
}

// scan reads the manifests and hands the changes to the pod manager: new
// pods are kept in the local state first, then started; pods whose file
// went (or changed: another UID) are stopped.
func (s *staticSource) scan() {
	first := s.pods == nil
	if first {
		// The static pods of the previous run: those whose file is gone
		// are stopped, the others go on as they were.
		s.pods = map[types.UID]*corev1.Pod{}
		for _, p := range s.a.local.staticPods() {
			s.pods[p.UID] = p
		}
	}
	found := s.reader.Read(s.pods)
	var ops []state.Op
	var added []*corev1.Pod
	for uid, p := range found {
		if _, ok := s.pods[uid]; ok {
			if first {
				added = append(added, p)
			}
			continue
		}
		b, err := p.Marshal()
		if err != nil {
			continue
		}
		ops = append(ops, state.Op{Key: state.Key{Kind: keptStatic, Namespace: p.Namespace, Name: p.Name, UID: string(uid)}, Value: b})
		added = append(added, p)
		s.a.log.Info("static pod", "pod", p.Namespace+"/"+p.Name, "uid", uid)
	}
	if len(ops) > 0 && s.a.local != nil {
		if err := s.a.local.DB().Commit(ops, nil); err != nil {
			s.a.log.Warn("keep static pods", "err", err)
			return // not acted on: the next read tries again
		}
	}
	for uid, p := range s.pods {
		if _, ok := found[uid]; !ok {
			s.a.log.Info("static pod removed", "pod", p.Namespace+"/"+p.Name, "uid", uid)
			delete(s.pods, uid)
			s.a.pods.staticGone(p)
		}
	}
	for _, p := range added {
		s.pods[p.UID] = p
		s.a.pods.updateStatic(p)
	}
	if first {
		s.a.pods.staticSynced()
	}
}

// staticRefs names the API objects pod refers to, which a static pod may
// not (staticpods.Decode).
func staticRefs(pod *corev1.Pod) []string {
	var out []string
	for _, r := range podRefs(pod) {
		out = append(out, strings.TrimSuffix(string(r.kind), "s")+" "+r.name)
	}
	return out
}

// staticPods returns the static pods the local state keeps.
func (l *localState) staticPods() []*corev1.Pod {
	if l == nil {
		return nil
	}
	rows, err := l.DB().List(keptStatic, "", "")
	if err != nil {
		l.log.Warn("read local state", "err", err)
		return nil
	}
	var out []*corev1.Pod
	for _, r := range rows {
		p := &corev1.Pod{}
		if err := p.Unmarshal(r.Value); err != nil {
			l.log.Warn("skip unreadable static pod in the local state", "pod", r.Namespace+"/"+r.Name, "err", err)
			continue
		}
		out = append(out, p)
	}
	return out
}

// staticRemoved forgets a static pod the runtime no longer has.
func (l *localState) staticRemoved(pod *corev1.Pod) {
	if l == nil || pod == nil {
		return
	}
	k := state.Key{Kind: keptStatic, Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}
	if err := l.DB().Commit([]state.Op{{Key: k, Delete: true}}, nil); err != nil {
		l.log.Warn("forget removed static pod", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
}
