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

// ref names an object a pod needs: a secret, config map, claim or its
// service account.
type ref struct {
	resource, namespace, name string
}

type podEntry struct {
	node string
	refs []ref
}

// graph knows which node every pod is bound to and which secrets, config
// maps, claims and service accounts those pods reference, fed by a watch on pods. It answers
// the node authorizer's "does node N need object O" in constant time.
type graph struct {
	mu     sync.RWMutex
	synced chan struct{}
	once   sync.Once
	pods   map[string]podEntry // "ns/name" -> entry
	needs  map[string]int      // node + "\x00" + ref -> pods referencing it
}

func newGraph() *graph {
	return &graph{synced: make(chan struct{}), pods: map[string]podEntry{}, needs: map[string]int{}}
}

func needKey(node string, r ref) string {
	return node + "\x00" + r.resource + "\x00" + r.namespace + "\x00" + r.name
}

func podKey(ns, name string) string { return ns + "/" + name }

// podNode returns the node a pod is bound to ("" when unbound or unknown).
func (g *graph) podNode(ns, name string) string {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.pods[podKey(ns, name)].node
}

// nodeNeeds reports whether a pod bound to node references the object.
func (g *graph) nodeNeeds(node string, r ref) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.needs[needKey(node, r)] > 0
}

func (g *graph) waitSynced(ctx context.Context) bool {
	select {
	case <-g.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

func (g *graph) set(pod *corev1.Pod) {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := podKey(pod.Namespace, pod.Name)
	g.dropLocked(key)
	if pod.Spec.NodeName == "" {
		return
	}
	e := podEntry{node: pod.Spec.NodeName, refs: podRefs(pod)}
	g.pods[key] = e
	for _, r := range e.refs {
		g.needs[needKey(e.node, r)]++
	}
}

func (g *graph) remove(ns, name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropLocked(podKey(ns, name))
}

func (g *graph) dropLocked(key string) {
	old, ok := g.pods[key]
	if !ok {
		return
	}
	delete(g.pods, key)
	for _, r := range old.refs {
		k := needKey(old.node, r)
		if g.needs[k]--; g.needs[k] <= 0 {
			delete(g.needs, k)
		}
	}
}

func (g *graph) reset(pods []corev1.Pod) {
	g.mu.Lock()
	g.pods = map[string]podEntry{}
	g.needs = map[string]int{}
	g.mu.Unlock()
	for i := range pods {
		g.set(&pods[i])
	}
	g.once.Do(func() { close(g.synced) })
}

// run keeps the graph current until ctx ends (see storage.Follow). The
// graph reads a pod's node and references and keeps neither the pod nor
// anything of it: it shares the watch's objects.
func (g *graph) run(ctx context.Context, st storage.API, log *slog.Logger) {
	storage.Follow(ctx, st, podsKind, "", storage.FollowOptions{Shared: true, Logger: log}, storage.FollowFuncs{
		ReplaceFunc: func(list runtime.Object) error {
			g.reset(list.(*corev1.PodList).Items)
			return nil
		},
		ApplyFunc: func(ev watch.EventType, obj runtime.Object) {
			p, ok := obj.(*corev1.Pod)
			switch {
			case !ok:
			case ev == watch.Deleted:
				g.remove(p.Namespace, p.Name)
			default:
				g.set(p)
			}
		},
	})
}

// podRefs lists the secrets, config maps, claims and the service account a
// pod's node needs to run it: volumes, projected sources, environment,
// image pull secrets, and the account whose tokens it mounts.
func podRefs(pod *corev1.Pod) []ref {
	ns := pod.Namespace
	seen := map[ref]bool{}
	var out []ref
	add := func(resource, name string) {
		if name == "" {
			return
		}
		r := ref{resource, ns, name}
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	add("serviceaccounts", pod.Spec.ServiceAccountName)
	for _, s := range pod.Spec.ImagePullSecrets {
		add("secrets", s.Name)
	}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.Secret != nil:
			add("secrets", v.Secret.SecretName)
		case v.ConfigMap != nil:
			add("configmaps", v.ConfigMap.Name)
		case v.PersistentVolumeClaim != nil:
			add("persistentvolumeclaims", v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			// The ephemeral volume controller names the claim
			// <pod>-<volume>.
			add("persistentvolumeclaims", pod.Name+"-"+v.Name)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					add("secrets", src.Secret.Name)
				}
				if src.ConfigMap != nil {
					add("configmaps", src.ConfigMap.Name)
				}
			}
		case v.CSI != nil && v.CSI.NodePublishSecretRef != nil:
			add("secrets", v.CSI.NodePublishSecretRef.Name)
		case v.ISCSI != nil && v.ISCSI.SecretRef != nil:
			add("secrets", v.ISCSI.SecretRef.Name)
		case v.RBD != nil && v.RBD.SecretRef != nil:
			add("secrets", v.RBD.SecretRef.Name)
		case v.CephFS != nil && v.CephFS.SecretRef != nil:
			add("secrets", v.CephFS.SecretRef.Name)
		case v.FlexVolume != nil && v.FlexVolume.SecretRef != nil:
			add("secrets", v.FlexVolume.SecretRef.Name)
		case v.AzureFile != nil:
			add("secrets", v.AzureFile.SecretName)
		}
	}
	visit := func(cs []corev1.Container) {
		for _, c := range cs {
			for _, e := range c.EnvFrom {
				if e.SecretRef != nil {
					add("secrets", e.SecretRef.Name)
				}
				if e.ConfigMapRef != nil {
					add("configmaps", e.ConfigMapRef.Name)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				if e.ValueFrom.SecretKeyRef != nil {
					add("secrets", e.ValueFrom.SecretKeyRef.Name)
				}
				if e.ValueFrom.ConfigMapKeyRef != nil {
					add("configmaps", e.ValueFrom.ConfigMapKeyRef.Name)
				}
			}
		}
	}
	visit(pod.Spec.InitContainers)
	visit(pod.Spec.Containers)
	for _, ec := range pod.Spec.EphemeralContainers {
		visit([]corev1.Container{corev1.Container(ec.EphemeralContainerCommon)})
	}
	return out
}
