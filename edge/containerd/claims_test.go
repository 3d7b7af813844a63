package containerd

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
)

func localPathPV(name, path string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{edge.AnnProvisionedBy: edge.LocalPathProvisioner}},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}},
		},
	}
}

// TestRemoveLocalVolume: the runtime removes the directory of a deleted
// local-path volume, and nothing that is not a directory of its
// local-path root named after the volume.
func TestRemoveLocalVolume(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "storage")
	r := &Runtime{cfg: Config{LocalPathRoot: root}}
	dir := filepath.Join(root, "pvc-1_default_data")
	if err := makeLocalPathDir(root, dir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o777 {
		t.Fatalf("volume directory: %v %v, want mode 0777", st, err)
	}
	if st, _ := os.Stat(root); st.Mode().Perm() != 0o700 {
		t.Errorf("root mode %v, want 0700", st.Mode().Perm())
	}
	os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o600)
	outside := filepath.Join(base, "precious")
	os.MkdirAll(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o600)
	if err := os.Symlink(outside, filepath.Join(root, "pvc-2_default_link")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "pvc-3_default_other"), 0o755)

	for _, pv := range []*corev1.PersistentVolume{
		localPathPV("pvc-9", outside),                                        // outside the root
		localPathPV("pvc-9", filepath.Join(root, "..", "precious")),          // not clean
		localPathPV("pvc-9", root),                                           // the root itself
		localPathPV("pvc-9", filepath.Join(root, "pvc-3_default_other")),     // another volume's
		localPathPV("pvc-2", filepath.Join(root, "pvc-2_default_link")),      // a link
		localPathPV("pvc-1", filepath.Join(root, "pvc-1_default_data", "x")), // below a volume
		{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}, Spec: corev1.PersistentVolumeSpec{ // not local-path
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}}},
	} {
		if err := r.RemoveLocalVolume(pv); err == nil {
			t.Errorf("removed %s at %s", pv.Name, pv.Spec.HostPath.Path)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatalf("a file outside the root is gone: %v", err)
	}
	if err := r.RemoveLocalVolume(localPathPV("pvc-1", dir)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("volume directory still there: %v", err)
	}
	if err := r.RemoveLocalVolume(localPathPV("pvc-1", dir)); err != nil {
		t.Errorf("removing a removed volume: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "pvc-3_default_other")); err != nil {
		t.Errorf("another volume's directory is gone: %v", err)
	}
}

// TestVolumeOwnership: the pod's fsGroup gets the volume's files, group
// writable, directories set-group-ID; OnRootMismatch skips a volume whose
// top directory is right already.
func TestVolumeOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another group")
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub"), 0o700)
	os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("x"), 0o600)
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	if err := setVolumeOwnership(dir, 2345, corev1.FSGroupChangeAlways); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{
		dir:                            os.ModeSetgid | 0o770,
		filepath.Join(dir, "sub"):      os.ModeSetgid | 0o770,
		filepath.Join(dir, "sub", "f"): 0o660,
	} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if g := st.Sys().(*syscall.Stat_t).Gid; g != 2345 || st.Mode()&(os.ModePerm|os.ModeSetgid)&want != want {
			t.Errorf("%s: gid %d mode %v, want gid 2345 and %v", path, g, st.Mode(), want)
		}
	}
	if st, _ := os.Stat("/etc/passwd"); st.Sys().(*syscall.Stat_t).Gid == 2345 {
		t.Fatal("followed a symbolic link out of the volume")
	}
	// OnRootMismatch: the root is right, a file below is not touched.
	os.WriteFile(filepath.Join(dir, "new"), []byte("x"), 0o600)
	os.Chown(filepath.Join(dir, "new"), -1, 0) // not the group the directory gives
	if err := setVolumeOwnership(dir, 2345, corev1.FSGroupChangeOnRootMismatch); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "new")); st.Sys().(*syscall.Stat_t).Gid == 2345 {
		t.Error("OnRootMismatch changed a volume whose root matched")
	}
}
