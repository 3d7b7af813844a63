package containerd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
)

// Volumes of PersistentVolumeClaims are the host directories of the
// PersistentVolumes bound to the claims: hostPath and local volumes, and
// tether's local-path volumes, which are hostPath volumes in a directory of
// the local-path root that the runtime creates (mode 0777, so that any
// container user may write, as upstream's local-path provisioner does) and
// removes once the hub deleted the volume (RemoveLocalVolume). The pod's
// fsGroup owns local and local-path volumes, as the kubelet does for
// volumes that support ownership management; hostPath volumes are left as
// they are.

var _ edge.LocalVolumeRemover = (*Runtime)(nil)

// claimSource returns the host path of a claim volume: the one set up for
// the pod, or else the volume's, resolved now.
func (r *Runtime) claimSource(p *pod, pod *corev1.Pod, v *corev1.Volume) (string, error) {
	p.mu.Lock()
	path, ok := p.claims[v.Name]
	p.mu.Unlock()
	if ok {
		return path, nil
	}
	_, pv, err := edge.ClaimedVolume(r.sources(), pod, v)
	if err != nil {
		return "", err
	}
	return volumePath(pv)
}

// volumePath is the host path of a PersistentVolume tether can mount.
func volumePath(pv *corev1.PersistentVolume) (string, error) {
	switch {
	case pv.Spec.HostPath != nil:
		return pv.Spec.HostPath.Path, nil
	case pv.Spec.Local != nil:
		return pv.Spec.Local.Path, nil
	}
	return "", fmt.Errorf("persistent volume %s: unsupported volume type (tether mounts hostPath and local volumes)", pv.Name)
}

// syncClaim sets up a claim volume once per pod: the volume's directory,
// its ownership by the pod's fsGroup. A volume set up stays in use while
// the claim or the volume change or become unknown, as on a kubelet.
func (r *Runtime) syncClaim(p *pod, pod *corev1.Pod, v *corev1.Volume) error {
	p.mu.Lock()
	_, done := p.claims[v.Name]
	p.mu.Unlock()
	if done {
		return nil
	}
	_, pv, err := edge.ClaimedVolume(r.sources(), pod, v)
	if err != nil {
		return err
	}
	path, err := volumePath(pv)
	if err != nil {
		return err
	}
	group := fsGroup(pod)
	switch {
	case edge.IsLocalPath(pv):
		dir, err := edge.LocalPathDir(r.cfg.LocalPathRoot, pv)
		if err != nil {
			// The hub's local-path root is not this node's: an
			// ordinary hostPath volume, never removed by the node.
			r.log.Warn("local-path volume outside the node's local-path root", "volume", pv.Name, "err", err)
			if err := hostPath(pv.Spec.HostPath); err != nil {
				return err
			}
			break
		}
		if err := makeLocalPathDir(r.cfg.LocalPathRoot, dir); err != nil {
			return fmt.Errorf("persistent volume %s: %w", pv.Name, err)
		}
		if group != nil {
			if err := setVolumeOwnership(dir, *group, changePolicy(pod)); err != nil {
				return fmt.Errorf("persistent volume %s: set fsGroup: %w", pv.Name, err)
			}
		}
	case pv.Spec.HostPath != nil:
		if err := hostPath(pv.Spec.HostPath); err != nil {
			return err
		}
	default: // local
		st, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("persistent volume %s: %w", pv.Name, err)
		}
		if !st.IsDir() {
			return fmt.Errorf("persistent volume %s: %s is not a directory", pv.Name, path)
		}
		if group != nil {
			if err := setVolumeOwnership(path, *group, changePolicy(pod)); err != nil {
				return fmt.Errorf("persistent volume %s: set fsGroup: %w", pv.Name, err)
			}
		}
	}
	p.mu.Lock()
	if p.claims == nil {
		p.claims = map[string]string{}
	}
	p.claims[v.Name] = path
	p.mu.Unlock()
	return nil
}

// makeLocalPathDir creates a local-path volume's directory (and the root,
// readable by root only: pods see their own directory, nothing else).
func makeLocalPathDir(root, dir string) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	st, err := os.Lstat(dir)
	switch {
	case err == nil && st.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("%s exists and is not a directory", dir)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := os.Mkdir(dir, 0o777); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return os.Chmod(dir, 0o777) // whatever the umask
}

func changePolicy(pod *corev1.Pod) corev1.PodFSGroupChangePolicy {
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroupChangePolicy != nil {
		return *sc.FSGroupChangePolicy
	}
	return corev1.FSGroupChangeAlways
}

// setVolumeOwnership gives a volume's files to group gid, group-readable
// and writable, its directories set-group-ID so that new files join the
// group: what the kubelet does for the pod's fsGroup. With OnRootMismatch
// nothing is done when the top directory has this group and these bits
// already.
func setVolumeOwnership(dir string, gid int64, policy corev1.PodFSGroupChangePolicy) error {
	const rw, x = 0o660, 0o110
	if policy == corev1.FSGroupChangeOnRootMismatch {
		if st, err := os.Stat(dir); err == nil {
			if g, ok := fileGID(st); ok && g == gid && st.Mode()&os.ModeSetgid != 0 && st.Mode().Perm()&(rw|x) == rw|x {
				return nil
			}
		}
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(path, -1, int(gid)); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		st, err := os.Lstat(path)
		if err != nil {
			return err
		}
		mode := st.Mode() | rw
		if st.IsDir() {
			mode |= os.ModeSetgid | x
		}
		return os.Chmod(path, mode&(os.ModePerm|os.ModeSetgid|os.ModeSetuid|os.ModeSticky))
	})
}

// RemoveLocalVolume implements edge.LocalVolumeRemover.
func (r *Runtime) RemoveLocalVolume(pv *corev1.PersistentVolume) error {
	dir, err := edge.LocalPathDir(r.cfg.LocalPathRoot, pv)
	if err != nil {
		return err
	}
	st, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if m := mountsUnder(dir); len(m) > 0 {
		return fmt.Errorf("%s holds mounts (%s)", dir, strings.Join(m, ", "))
	}
	return os.RemoveAll(dir)
}

// mountsUnder lists the mount points at or under dir.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{"unreadable mount table"}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

func fileGID(st os.FileInfo) (int64, bool) {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int64(s.Gid), true
	}
	return 0, false
}
