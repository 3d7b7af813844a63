package edge_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/staticpods"
)

func staticManifest(name, image string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  labels: {app: %s}
spec:
  containers:
  - name: app
    image: %s
`, name, name, image)
}

// writeManifest writes a manifest the way editors and config tools do: a
// hidden temporary file renamed into place.
func writeManifest(t *testing.T, dir, file, content string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+file+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
		t.Fatal(err)
	}
}

// staticUID is the UID the agent gives the static pod of a manifest file.
func staticUID(t *testing.T, dir, file, content, node string) types.UID {
	t.Helper()
	p, err := edge.StaticPod([]byte(content), filepath.Join(dir, file), node)
	if err != nil {
		t.Fatal(err)
	}
	return p.UID
}

// TestStaticPods runs pods from manifest files: each gets a mirror pod on
// the hub that shows its status; deleting the mirror does not touch the
// pod and the mirror comes back; a changed file replaces the pod, a removed
// one stops it. With the hub down, the restarted agent starts the static
// pods of new files and stops those of removed ones; their mirrors follow
// once the hub is back.
func TestStaticPods(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()
	pods := e.client.CoreV1().Pods("default")
	dir := filepath.Join(t.TempDir(), "manifests") // the agent creates it
	rt := newSourcedSim()
	cfg := edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-s", NodeIP: netip.MustParseAddr("192.0.2.50"),
		Runtime: rt, PodManifestPath: dir}
	a := startAgent(t, cfg)
	waitNodeReady(t, e, "edge-s")
	eventually(t, 10*time.Second, "manifest directory created", func() (bool, string) {
		_, err := os.Stat(dir)
		return err == nil, fmt.Sprint(err)
	})

	web1 := staticManifest("web", "registry.example/web:1")
	writeManifest(t, dir, "web.yaml", web1)
	uid1 := staticUID(t, dir, "web.yaml", web1, "edge-s")
	eventually(t, 10*time.Second, "static pod running", func() (bool, string) { return rt.running(uid1) })
	mirror := waitPod(t, e, "web-edge-s", "mirror pod Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && podReady(p)
	})
	ann := mirror.Annotations
	if ann[staticpods.AnnConfigMirror] != string(uid1) || ann[staticpods.AnnConfigHash] != string(uid1) || ann[staticpods.AnnConfigSource] != "file" || ann[staticpods.AnnConfigSeen] == "" {
		t.Errorf("mirror annotations %v; static pod %s", ann, uid1)
	}
	if o := mirror.OwnerReferences; len(o) != 1 || o[0].Kind != "Node" || o[0].Name != "edge-s" || o[0].Controller == nil || !*o[0].Controller {
		t.Errorf("mirror owner %+v", o)
	}
	if mirror.Spec.NodeName != "edge-s" || mirror.Labels["app"] != "web" || mirror.UID == uid1 {
		t.Errorf("mirror pod %s on %q labels %v", mirror.UID, mirror.Spec.NodeName, mirror.Labels)
	}
	ids := rt.containerIDs(uid1)

	// kubectl delete pod: the mirror comes back, the pod runs on.
	if err := pods.Delete(ctx, "web-edge-s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, e, "web-edge-s", "mirror pod recreated", func(p *corev1.Pod) bool {
		return p.UID != mirror.UID && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning
	})
	if got := rt.containerIDs(uid1); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Errorf("static pod restarted when its mirror was deleted: %v, before %v", got, ids)
	}

	// A changed manifest is another pod.
	web2 := staticManifest("web", "registry.example/web:2")
	writeManifest(t, dir, "web.yaml", web2)
	uid2 := staticUID(t, dir, "web.yaml", web2, "edge-s")
	eventually(t, 10*time.Second, "the old pod stopped, the new one running", func() (bool, string) {
		ok, why := rt.running(uid2)
		return ok && rt.gone(uid1), why
	})
	waitPod(t, e, "web-edge-s", "mirror of the new manifest", func(p *corev1.Pod) bool {
		return p.Annotations[staticpods.AnnConfigMirror] == string(uid2) && p.Spec.Containers[0].Image == "registry.example/web:2" &&
			p.Status.Phase == corev1.PodRunning
	})

	// Static pods may not refer to API objects; a manifest that is no pod
	// is ignored.
	writeManifest(t, dir, "secret.yaml", `apiVersion: v1
kind: Pod
metadata: {name: secret}
spec:
  containers: [{name: app, image: app}]
  volumes: [{name: s, secret: {secretName: token}}]
`)
	writeManifest(t, dir, "notes.txt", "not a pod")
	time.Sleep(time.Second)
	if s := a.Stats(); s.Pods != 1 {
		t.Errorf("%d pods, want the web pod only", s.Pods)
	}
	if _, err := pods.Get(ctx, "secret-edge-s", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("mirror of a refused manifest: %v", err)
	}

	// A removed manifest stops its pod and deletes its mirror.
	os.Remove(filepath.Join(dir, "web.yaml"))
	eventually(t, 10*time.Second, "static pod stopped", func() (bool, string) { return rt.gone(uid2), "running" })
	eventually(t, 10*time.Second, "mirror pod deleted", func() (bool, string) {
		_, err := pods.Get(ctx, "web-edge-s", metav1.GetOptions{})
		return apierrors.IsNotFound(err), errString(err)
	})

	// Offline: the hub is down while the agent restarts; one manifest
	// went, another came.
	keep := staticManifest("keep", "registry.example/keep:1")
	writeManifest(t, dir, "keep.yaml", keep)
	keepUID := staticUID(t, dir, "keep.yaml", keep, "edge-s")
	waitPod(t, e, "keep-edge-s", "mirror pod Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	a.stop(t)
	e.hub.Stop()
	os.Remove(filepath.Join(dir, "keep.yaml"))
	db := staticManifest("db", "registry.example/db:1")
	writeManifest(t, dir, "db.yaml", db)
	dbUID := staticUID(t, dir, "db.yaml", db, "edge-s")
	cfg.Token = ""
	a = startAgent(t, cfg)
	eventually(t, 10*time.Second, "new static pod running, removed one stopped, with the hub down", func() (bool, string) {
		ok, why := rt.running(dbUID)
		return ok && rt.gone(keepUID), why
	})
	if s := a.Stats(); s.Connected {
		t.Fatal("the hub answered")
	}
	e.hub.Restart()
	waitPod(t, e, "db-edge-s", "mirror pod once the hub is back", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.Annotations[staticpods.AnnConfigMirror] == string(dbUID)
	})
	eventually(t, 20*time.Second, "the mirror of the removed manifest deleted", func() (bool, string) {
		_, err := pods.Get(ctx, "keep-edge-s", metav1.GetOptions{})
		return apierrors.IsNotFound(err), errString(err)
	})
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "db-edge-s" {
		t.Errorf("pods on the hub: %v", names)
	}
}
