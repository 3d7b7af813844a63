package containerd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestTearDownRemovesNetnsWhenDELFails: a CNI plugin whose DEL fails every
// time must not keep the pod's network namespace alive. The failure is
// reported, the namespace is gone, and the retry (DEL without a
// namespace, which the plugin here accepts) succeeds.
func TestTearDownRemovesNetnsWhenDELFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	dir := t.TempDir()
	bin, conf := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	for _, d := range []string{bin, conf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// DEL fails while a namespace is given, as the bridge plugin does when
	// it cannot delete a NAT chain; without one it succeeds.
	plugin := `#!/bin/sh
cat >/dev/null
if [ "$CNI_COMMAND" = DEL ] && [ -n "$CNI_NETNS" ]; then
  echo '{"cniVersion":"1.0.0","code":999,"msg":"chain busy"}'
  exit 1
fi
if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}'
fi
exit 0
`
	if err := os.WriteFile(filepath.Join(bin, "faildel"), []byte(plugin), 0o755); err != nil {
		t.Fatal(err)
	}
	list := `{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"faildel"}]}`
	if err := os.WriteFile(filepath.Join(conf, "10-test.conflist"), []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &network{cni: libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cache"), nil), confDir: conf}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: types.UID("teardown-" + filepath.Base(dir))}}
	name := netnsName(pod.UID)
	if _, err := newNetns(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNetns(name) })

	err := n.tearDown(context.Background(), pod)
	if err == nil || !strings.Contains(err.Error(), "chain busy") {
		t.Fatalf("tearDown: %v, want the plugin's failure", err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, name)); !os.IsNotExist(err) {
		t.Fatalf("the namespace outlived a failed DEL: %v", err)
	}
	if err := n.tearDown(context.Background(), pod); err != nil {
		t.Fatalf("retry: %v", err)
	}
}
