package hub_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tether-edge/tether/hub/hubtest"
)

// podYAML returns a pod as kubectl get -o yaml shows it.
func podYAML(t *testing.T, h *hubtest.Hub, ns, name string) *corev1.Pod {
	t.Helper()
	out := mustKubectl(t, h, "get", "pod", name, "-n", ns, "-o", "yaml")
	var p corev1.Pod
	if err := yaml.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("parse kubectl get pod -o yaml: %v\n%s", err, out)
	}
	return &p
}

// tokenVolume returns the pod's kube-api-access volume and whether every
// container mounts it read-only at the service account path.
func tokenVolume(p *corev1.Pod) (*corev1.Volume, bool) {
	var vol *corev1.Volume
	for i, v := range p.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") {
			vol = &p.Spec.Volumes[i]
		}
	}
	if vol == nil {
		return nil, false
	}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		mounted := false
		for _, m := range c.VolumeMounts {
			mounted = mounted || m.Name == vol.Name && m.ReadOnly && m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount"
		}
		if !mounted {
			return vol, false
		}
	}
	return vol, true
}

// TestServiceAccountAdmission: pods created with kubectl get their
// account's API token mounted as upstream's ServiceAccount admission
// mounts it, unless the pod or the account opts out; a pod naming a
// missing account is refused; kubectl run and a Deployment work in a
// namespace created a moment before, whose default account the
// serviceaccount controller creates.
func TestServiceAccountAdmission(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	mustKubectl(t, h, "run", "web", "--image=nginx", "--restart=Never")
	p := podYAML(t, h, "default", "web")
	vol, mounted := tokenVolume(p)
	if vol == nil || !mounted || len(vol.Name) != len("kube-api-access-")+5 {
		t.Fatalf("pod web: volume %+v, mounted %v; volumes %+v, containers %+v", vol, mounted, p.Spec.Volumes, p.Spec.Containers)
	}
	src := vol.Projected
	if src == nil || src.DefaultMode == nil || *src.DefaultMode != 420 || len(src.Sources) != 3 ||
		src.Sources[0].ServiceAccountToken == nil || src.Sources[0].ServiceAccountToken.Path != "token" ||
		*src.Sources[0].ServiceAccountToken.ExpirationSeconds != 3607 ||
		src.Sources[1].ConfigMap == nil || src.Sources[1].ConfigMap.Name != "kube-root-ca.crt" || src.Sources[1].ConfigMap.Items[0].Key != "ca.crt" ||
		src.Sources[2].DownwardAPI == nil || src.Sources[2].DownwardAPI.Items[0].FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("projected volume %+v", src)
	}
	if p.Spec.ServiceAccountName != "default" {
		t.Errorf("service account %q", p.Spec.ServiceAccountName)
	}

	// What kubectl shows, kubectl can put back; apply keeps the volume.
	out := mustKubectl(t, h, "get", "pod", "web", "-o", "yaml")
	if _, err := h.RunInput(t.Context(), out, nil, "replace", "-f", "-"); err != nil {
		t.Errorf("kubectl replace of the admitted pod: %v", err)
	}
	manifest := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: applied\nspec:\n  containers:\n  - name: c\n    image: busybox\n"
	for range 2 {
		if _, err := h.RunInput(t.Context(), manifest, nil, "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply: %v", err)
		}
	}
	if v, ok := tokenVolume(podYAML(t, h, "default", "applied")); v == nil || !ok {
		t.Errorf("applied pod lost its token volume: %+v", v)
	}

	// Opting out: the pod, or its account.
	optOut := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: quiet\nspec:\n  automountServiceAccountToken: false\n  containers:\n  - name: c\n    image: busybox\n"
	if _, err := h.RunInput(t.Context(), optOut, nil, "create", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	mustKubectl(t, h, "create", "serviceaccount", "mute")
	mustKubectl(t, h, "patch", "serviceaccount", "mute", "-p", `{"automountServiceAccountToken":false}`)
	mustKubectl(t, h, "run", "muted", "--image=busybox", "--restart=Never", "--overrides", `{"spec":{"serviceAccountName":"mute"}}`)
	for _, name := range []string{"quiet", "muted"} {
		if p := podYAML(t, h, "default", name); len(p.Spec.Volumes) != 0 || len(p.Spec.Containers[0].VolumeMounts) != 0 {
			t.Errorf("pod %s opted out but got volumes %+v mounts %+v", name, p.Spec.Volumes, p.Spec.Containers[0].VolumeMounts)
		}
	}

	// A missing account.
	_, err := h.Run("run", "lost", "--image=busybox", "--restart=Never", "--overrides", `{"spec":{"serviceAccountName":"nope"}}`)
	const want = `pods "lost" is forbidden: error looking up service account default/nope: serviceaccount "nope" not found`
	if err == nil || !strings.Contains(err.Error(), "(Forbidden)") || !strings.Contains(err.Error(), want) {
		t.Errorf("pod of a missing account: %v, want 403 %q", err, want)
	}

	// A new namespace: its default account comes a moment later.
	mustKubectl(t, h, "create", "namespace", "fresh")
	mustKubectl(t, h, "run", "first", "-n", "fresh", "--image=busybox", "--restart=Never")
	mustKubectl(t, h, "create", "namespace", "fresh2")
	mustKubectl(t, h, "create", "deployment", "app", "-n", "fresh2", "--image=busybox", "--replicas=2")
	cs := clientFor(t, h)
	waitFor(t, "the deployment's pods", func() bool {
		pods, err := cs.CoreV1().Pods("fresh2").List(context.Background(), metav1.ListOptions{})
		return err == nil && len(pods.Items) == 2
	})
}

// createDefaultAccounts creates the default service account of each
// namespace, which pods need: tests of the API itself run without the
// serviceaccount controller that would create it (see apiOnly).
func createDefaultAccounts(t *testing.T, h *hubtest.Hub, namespaces ...string) {
	t.Helper()
	for _, ns := range namespaces {
		mustKubectl(t, h, "create", "serviceaccount", "default", "-n", ns)
	}
}
