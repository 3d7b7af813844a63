package staticpods

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

const webManifest = `apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: app
    image: registry.example/web:1
  - name: side
    image: registry.example/side
`

func TestDecode(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p, err := Decode([]byte(webManifest), "/etc/tether/pods/web.yaml", "Edge-1", now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "web-edge-1" || p.Namespace != "default" || p.Spec.NodeName != "Edge-1" || p.Status.Phase != corev1.PodPending {
		t.Errorf("static pod %s/%s on %q, phase %s", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase)
	}
	if p.Annotations[AnnConfigHash] != string(p.UID) || p.Annotations[AnnConfigSource] != "file" ||
		p.Annotations[AnnConfigSeen] != "2026-01-02T03:04:05Z" || IsMirror(p) {
		t.Errorf("annotations %v", p.Annotations)
	}
	if got := []corev1.PullPolicy{p.Spec.Containers[0].ImagePullPolicy, p.Spec.Containers[1].ImagePullPolicy}; got[0] != corev1.PullIfNotPresent || got[1] != corev1.PullAlways {
		t.Errorf("pull policies %v, want IfNotPresent for a tag and Always for none", got)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyAlways || len(p.Spec.Tolerations) != 1 || p.Spec.Tolerations[0].Effect != corev1.TaintEffectNoExecute {
		t.Errorf("defaults: restart policy %q, tolerations %v", p.Spec.RestartPolicy, p.Spec.Tolerations)
	}

	// The UID follows the manifest, the node and the file.
	same, _ := Decode([]byte(webManifest), "/etc/tether/pods/web.yaml", "Edge-1", now.Add(time.Hour), nil)
	moved, _ := Decode([]byte(webManifest), "/etc/tether/pods/web2.yaml", "Edge-1", now, nil)
	changed, _ := Decode([]byte(strings.Replace(webManifest, "web:1", "web:2", 1)), "/etc/tether/pods/web.yaml", "Edge-1", now, nil)
	if same.UID != p.UID || moved.UID == p.UID || changed.UID == p.UID {
		t.Errorf("UIDs: %s, same %s, other file %s, changed %s", p.UID, same.UID, moved.UID, changed.UID)
	}

	refs := func(*corev1.Pod) []string { return []string{"secret db"} }
	for manifest, want := range map[string]string{
		strings.Replace(webManifest, "kind: Pod", "kind: Deployment", 1):               "want apiVersion v1 and kind Pod",
		strings.Replace(webManifest, "name: web\n", "labels2: {}\n", 1):                "no metadata.name",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n":     "no containers",
		strings.Replace(webManifest, "name: side", "name: app", 1):                     `container name "app" used twice`,
		strings.Replace(webManifest, "    image: registry.example/side\n", "", 1):      "container side has no image",
		strings.Replace(webManifest, "spec:\n", "spec:\n  serviceAccountName: x\n", 1): "cannot refer to other API objects: service account, secret db",
	} {
		if _, err := Decode([]byte(manifest), "f", "n", now, refs); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("manifest\n%s\ngave %v, want %q", manifest, err, want)
		}
	}
}

func TestReader(t *testing.T) {
	dir := t.TempDir()
	var logged bytes.Buffer
	r := NewReader(dir, "edge-1", nil, slog.New(slog.NewTextHandler(&logged, nil)))
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("web.yaml", webManifest)
	write(".web.yaml.swp", "not a manifest")
	write("bad.yaml", "kind: Pod\n")
	write("again.yaml", webManifest) // the same pod name as web.yaml
	got := r.Read(nil)
	if len(got) != 1 {
		t.Fatalf("read %d pods, want 1: %v", len(got), got)
	}
	var web *corev1.Pod
	for _, p := range got {
		web = p
	}
	if web.Name != "web-edge-1" {
		t.Errorf("pod %s", web.Name)
	}
	again := r.Read(map[types.UID]*corev1.Pod{web.UID: web})
	if again[web.UID] != web {
		t.Error("an unchanged manifest gave a new pod value")
	}
	if n := strings.Count(logged.String(), "static pod manifest ignored"); n != 2 {
		t.Errorf("logged %d ignored manifests over two reads, want 2 (bad.yaml and the duplicate, once each):\n%s", n, logged.String())
	}
	if !strings.Contains(logged.String(), "already defined in") {
		t.Errorf("the duplicate pod was not named:\n%s", logged.String())
	}
}

func TestWatch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "manifests")
	scans := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, dir, time.Hour, slog.New(slog.DiscardHandler), func() { scans <- struct{}{} })
	}()
	defer func() { cancel(); <-done }()
	wait := func(what string) {
		t.Helper()
		select {
		case <-scans:
		case <-time.After(5 * time.Second):
			t.Fatalf("no scan %s", what)
		}
	}
	wait("at start")
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the directory was not created: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	wait("after a file was written")
}
