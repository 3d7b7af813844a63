package edge

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Names shared with the hub's volume controller (controllers/volume), which
// the agent may not import.
const (
	// LocalPathProvisioner provisions tether's local-path volumes:
	// hostPath volumes (type DirectoryOrCreate) in a directory of their
	// node's local-path root, named <volume>_<namespace>_<claim>, with a
	// node affinity that keeps their pods on that node.
	LocalPathProvisioner = "tether.io/local-path"
	// AnnProvisionedBy names the provisioner of a PersistentVolume.
	AnnProvisionedBy = "pv.kubernetes.io/provisioned-by"
	// DefaultLocalPathRoot is the local-path root of nodes.
	DefaultLocalPathRoot = "/var/lib/tether/storage"
)

// ErrVolumeNotReady is wrapped by the errors of volumes a pod must wait
// for: a claim that is not bound yet, or a claim or volume the agent does
// not know yet. The agent keeps such a pod in ContainerCreating and tries
// again when the claim or the volume changes.
var ErrVolumeNotReady = errors.New("volume not ready")

// ClaimName returns the PersistentVolumeClaim a pod's volume uses: the
// claim of a persistentVolumeClaim volume, or the one the ephemeral volume
// controller makes for a generic ephemeral volume (<pod>-<volume>). It
// returns "" for other volumes.
func ClaimName(pod *corev1.Pod, v *corev1.Volume) string {
	switch {
	case v.PersistentVolumeClaim != nil:
		return v.PersistentVolumeClaim.ClaimName
	case v.Ephemeral != nil:
		return pod.Name + "-" + v.Name
	}
	return ""
}

// ClaimReadOnly tells whether the pod asks for its claim's volume
// read-only (persistentVolumeClaim.readOnly): every mount of it is then
// read-only.
func ClaimReadOnly(v *corev1.Volume) bool {
	return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly
}

// IsLocalPath tells whether pv is one of tether's local-path volumes.
func IsLocalPath(pv *corev1.PersistentVolume) bool {
	return pv.Annotations[AnnProvisionedBy] == LocalPathProvisioner && pv.Spec.HostPath != nil
}

// LocalPathDir checks that pv is a local-path volume whose directory is
// directly under root, and returns that directory. Only such directories
// are ever created with the local-path permissions or removed.
func LocalPathDir(root string, pv *corev1.PersistentVolume) (string, error) {
	if !IsLocalPath(pv) {
		return "", fmt.Errorf("persistent volume %s is not a local-path volume", pv.Name)
	}
	root = filepath.Clean(root)
	if !filepath.IsAbs(root) || root == "/" {
		return "", fmt.Errorf("local-path root %q must be an absolute directory other than /", root)
	}
	dir := pv.Spec.HostPath.Path
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || filepath.Dir(dir) != root {
		return "", fmt.Errorf("persistent volume %s: path %q is not a directory of the local-path root %s", pv.Name, dir, root)
	}
	base := filepath.Base(dir)
	if base != pv.Name && !strings.HasPrefix(base, pv.Name+"_") {
		return "", fmt.Errorf("persistent volume %s: directory %q is not named after the volume", pv.Name, base)
	}
	return dir, nil
}

// volumeWait is an error a pod waits out; it is ErrVolumeNotReady without
// saying so in its message.
type volumeWait struct{ err error }

func (e volumeWait) Error() string        { return e.err.Error() }
func (e volumeWait) Unwrap() error        { return e.err }
func (e volumeWait) Is(target error) bool { return target == ErrVolumeNotReady }

func waitf(format string, args ...any) error {
	return volumeWait{fmt.Errorf(format, args...)}
}

// ClaimedVolume returns the claim of a pod's persistentVolumeClaim or
// ephemeral volume and the PersistentVolume bound to it, with the checks
// the kubelet makes before it mounts one: the claim is Bound, the volume
// names the claim (its UID) in its claimRef, and an ephemeral volume's
// claim belongs to the pod. Errors a pod must wait out wrap
// ErrVolumeNotReady; the others are final for this volume and claim.
func ClaimedVolume(src Sources, pod *corev1.Pod, v *corev1.Volume) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume, error) {
	name := ClaimName(pod, v)
	if name == "" {
		return nil, nil, fmt.Errorf("volume %s has no claim", v.Name)
	}
	if src == nil {
		return nil, nil, waitf("error processing PVC %s/%s: no source of claims", pod.Namespace, name)
	}
	pvc, err := src.PersistentVolumeClaim(pod.Namespace, name)
	if err != nil {
		return nil, nil, waitf("error processing PVC %s/%s: %w", pod.Namespace, name, err)
	}
	if v.Ephemeral != nil && !metav1.IsControlledBy(pvc, pod) {
		return nil, nil, waitf("error processing PVC %s/%s: PVC was not created for pod %s/%s (pod is not owner)",
			pod.Namespace, name, pod.Namespace, pod.Name)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return nil, nil, waitf("error processing PVC %s/%s: PVC is not bound", pod.Namespace, name)
	}
	pv, err := src.PersistentVolume(pvc.Spec.VolumeName)
	if err != nil {
		return nil, nil, waitf("error processing PVC %s/%s: volume %s: %w", pod.Namespace, name, pvc.Spec.VolumeName, err)
	}
	if r := pv.Spec.ClaimRef; r == nil || r.Namespace != pvc.Namespace || r.Name != pvc.Name || r.UID != pvc.UID {
		return nil, nil, waitf("error processing PVC %s/%s: found PV object %s but its claimRef points to a different PVC",
			pod.Namespace, name, pv.Name)
	}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return nil, nil, fmt.Errorf("error processing PVC %s/%s: volume %s has volumeMode Block, which is not supported", pod.Namespace, name, pv.Name)
	}
	return pvc, pv, nil
}
