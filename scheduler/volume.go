package scheduler

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Names of the storage annotations the volume filter reads and the loop
// writes.
const (
	annSelectedNode     = "volume.kubernetes.io/selected-node"
	annBetaStorageClass = "volume.beta.kubernetes.io/storage-class"
	noProvisioner       = "kubernetes.io/no-provisioner"
)

// volumeState is VolumeBinding's precomputation for one pod: the volumes
// its bound claims use, and its unbound claims that wait for a node.
type volumeState struct {
	s       *Snapshot
	bound   []*corev1.PersistentVolume
	missing bool // a bound claim's volume does not exist
	unbound []unboundClaim
}

type unboundClaim struct {
	pvc   *corev1.PersistentVolumeClaim
	class *storagev1.StorageClass
}

// VolumeChoice is what the loop must write for an unbound claim once its
// pod has a node: PV names a static volume to pre-bind, otherwise the
// claim gets the selected-node annotation for its provisioner.
type VolumeChoice struct {
	PVC *corev1.PersistentVolumeClaim
	PV  string
}

func claimClass(c *corev1.PersistentVolumeClaim) string {
	if v, ok := c.Annotations[annBetaStorageClass]; ok {
		return v
	}
	if c.Spec.StorageClassName != nil {
		return *c.Spec.StorageClassName
	}
	return ""
}

func volumeClass(v *corev1.PersistentVolume) string {
	if c, ok := v.Annotations[annBetaStorageClass]; ok {
		return c
	}
	return v.Spec.StorageClassName
}

// newVolumeState resolves p's claims. A claim that is missing, being
// deleted, not created for the pod (ephemeral) or unbound with an
// Immediate class rejects the pod everywhere; the message is upstream's.
func newVolumeState(s *Snapshot, p *PodInfo) (*volumeState, string) {
	if len(p.pvcs) == 0 {
		return nil, ""
	}
	st := &volumeState{s: s}
	for _, ref := range p.pvcs {
		c := s.pvcs[p.Namespace+"/"+ref.name]
		if c == nil {
			if ref.ephemeral {
				return nil, fmt.Sprintf("waiting for ephemeral volume controller to create the persistentvolumeclaim %q", ref.name)
			}
			return nil, fmt.Sprintf("persistentvolumeclaim %q not found", ref.name)
		}
		if c.DeletionTimestamp != nil {
			return nil, fmt.Sprintf("persistentvolumeclaim %q is being deleted", ref.name)
		}
		if ref.ephemeral && !metav1.IsControlledBy(c, p.Pod) {
			return nil, fmt.Sprintf("PVC %s/%s was not created for pod %s/%s (pod is not owner)", c.Namespace, c.Name, p.Namespace, p.Name)
		}
		if c.Spec.VolumeName != "" {
			if v := s.pvs[c.Spec.VolumeName]; v != nil {
				st.bound = append(st.bound, v)
			} else {
				st.missing = true
			}
			continue
		}
		className := claimClass(c)
		class := s.classes[className]
		if class == nil {
			if className == "" {
				return nil, "pod has unbound immediate PersistentVolumeClaims"
			}
			return nil, fmt.Sprintf("storageclass.storage.k8s.io %q not found", className)
		}
		if class.VolumeBindingMode == nil || *class.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
			return nil, "pod has unbound immediate PersistentVolumeClaims"
		}
		st.unbound = append(st.unbound, unboundClaim{pvc: c, class: class})
	}
	return st, ""
}

func (st *volumeState) filter(n *NodeInfo) (uint8, string) {
	if st.missing {
		return codeUnresolvable, reasonPVMissing
	}
	for _, v := range st.bound {
		if !pvFitsNode(v, n) {
			return codeUnresolvable, reasonVolumeAffinity
		}
	}
	for _, u := range st.unbound {
		if st.findPV(u, n) == nil && !canProvision(u.class, n) {
			return codeUnresolvable, reasonVolumeBind
		}
	}
	return codeFeasible, ""
}

// choices tells the loop what to write for the unbound claims once the
// pod is placed on n.
func (st *volumeState) choices(n *NodeInfo) []VolumeChoice {
	var out []VolumeChoice
	for _, u := range st.unbound {
		vc := VolumeChoice{PVC: u.pvc}
		if v := st.findPV(u, n); v != nil {
			vc.PV = v.Name
		}
		out = append(out, vc)
	}
	return out
}

func pvFitsNode(v *corev1.PersistentVolume, n *NodeInfo) bool {
	if v.Spec.NodeAffinity == nil || v.Spec.NodeAffinity.Required == nil {
		return true
	}
	ns, err := compileNodeSelector(v.Spec.NodeAffinity.Required.NodeSelectorTerms)
	if err != nil {
		return false
	}
	return ns.matches(n.Name, n.Labels)
}

// findPV looks for a static volume the claim could bind on n: already
// reserved for the claim, or available, of the claim's class, big enough,
// with the access modes and volume mode asked for, reachable from n. The
// smallest fitting volume wins, as upstream.
func (st *volumeState) findPV(u unboundClaim, n *NodeInfo) *corev1.PersistentVolume {
	c := u.pvc
	want := c.Spec.Resources.Requests[corev1.ResourceStorage]
	var best *corev1.PersistentVolume
	for _, v := range st.s.pvs {
		if ref := v.Spec.ClaimRef; ref != nil {
			if ref.Namespace != c.Namespace || ref.Name != c.Name || (ref.UID != "" && ref.UID != c.UID) {
				continue
			}
			if pvFitsNode(v, n) {
				return v
			}
			continue
		}
		if v.DeletionTimestamp != nil || volumeClass(v) != claimClass(c) {
			continue
		}
		if v.Status.Phase != "" && v.Status.Phase != corev1.VolumeAvailable && v.Status.Phase != corev1.VolumePending {
			continue
		}
		if !modesCover(v.Spec.AccessModes, c.Spec.AccessModes) {
			continue
		}
		vm, cm := corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeFilesystem
		if v.Spec.VolumeMode != nil {
			vm = *v.Spec.VolumeMode
		}
		if c.Spec.VolumeMode != nil {
			cm = *c.Spec.VolumeMode
		}
		if vm != cm {
			continue
		}
		size := v.Spec.Capacity[corev1.ResourceStorage]
		if size.Cmp(want) < 0 || !pvFitsNode(v, n) {
			continue
		}
		if best == nil {
			best = v
			continue
		}
		bs := best.Spec.Capacity[corev1.ResourceStorage]
		if size.Cmp(bs) < 0 || (size.Cmp(bs) == 0 && v.Name < best.Name) {
			best = v
		}
	}
	return best
}

func modesCover(have, want []corev1.PersistentVolumeAccessMode) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// canProvision: a class with a real provisioner can make a volume on n
// when its allowedTopologies (empty: anywhere) include n.
func canProvision(class *storagev1.StorageClass, n *NodeInfo) bool {
	if class.Provisioner == noProvisioner {
		return false
	}
	if len(class.AllowedTopologies) == 0 {
		return true
	}
	for _, term := range class.AllowedTopologies {
		ok := true
		for _, e := range term.MatchLabelExpressions {
			if v, has := n.Labels[e.Key]; !has || !contains(e.Values, v) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}
