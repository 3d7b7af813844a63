package hub_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// header returns the first line of kubectl's table output, its fields
// joined by single spaces.
func header(out string) string {
	return strings.Join(strings.Fields(strings.SplitN(out, "\n", 2)[0]), " ")
}

// fieldCauses returns the field paths of an invalid-object error's causes.
func fieldCauses(err error) []string {
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.ErrStatus.Details == nil {
		return nil
	}
	var out []string
	for _, c := range se.ErrStatus.Details.Causes {
		out = append(out, c.Field)
	}
	return out
}

// TestReplicationControllerAPI serves core/v1 ReplicationController as
// kube-apiserver does, without a controller running: upstream defaults,
// validation with field causes, kubectl's columns, discovery and OpenAPI
// (api-resources, get all, explain), the status.replicas field selector,
// the scale and status subresources, and orphaning when a delete names no
// propagation policy.
func TestReplicationControllerAPI(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	createDefaultAccounts(t, h, "default")
	kube := kubeClient(t, h)
	ctx := context.Background()
	rcAPI := kube.CoreV1().ReplicationControllers("default")

	// Selector, labels and replicas default from the template.
	web := `apiVersion: v1
kind: ReplicationController
metadata: {name: web}
spec:
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: nginx, image: "nginx:1.27"}]
`
	if _, err := h.RunInput(ctx, web, nil, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if out, err := h.RunInput(ctx, web, nil, "apply", "-f", "-"); err != nil || strings.TrimSpace(out) != "replicationcontroller/web unchanged" {
		t.Errorf("second apply: %q, %v", out, err)
	}
	rc, err := rcAPI.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Spec.Selector["app"] != "web" || rc.Labels["app"] != "web" || rc.Spec.Replicas == nil || *rc.Spec.Replicas != 1 ||
		rc.Generation != 1 || rc.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways ||
		rc.Spec.Template.Spec.Containers[0].TerminationMessagePath == "" {
		t.Errorf("defaults not applied: labels %v, spec %+v", rc.Labels, rc.Spec)
	}

	t.Run("kubectl", func(t *testing.T) {
		if got := header(h.MustRun("get", "rc")); got != "NAME DESIRED CURRENT READY AGE" {
			t.Errorf("get rc header %q", got)
		}
		out := h.MustRun("get", "replicationcontrollers", "-o", "wide")
		if got := header(out); got != "NAME DESIRED CURRENT READY AGE CONTAINERS IMAGES SELECTOR" {
			t.Errorf("get rc -o wide header %q", got)
		}
		if row := strings.Fields(strings.Split(out, "\n")[1]); len(row) != 8 || row[0] != "web" || row[1] != "1" || row[2] != "0" ||
			row[5] != "nginx" || row[6] != "nginx:1.27" || row[7] != "app=web" {
			t.Errorf("get rc -o wide row %q", row)
		}
		if out := h.MustRun("get", "all"); !strings.Contains(out, "replicationcontroller/web") {
			t.Errorf("get all lacks the replicationcontroller:\n%s", out)
		}
		out = h.MustRun("api-resources", "--api-group=")
		for _, want := range [][]string{{"podtemplates", "v1", "true", "PodTemplate"}, {"replicationcontrollers", "rc", "v1", "true", "ReplicationController"}} {
			found := false
			for _, line := range strings.Split(out, "\n") {
				if strings.Join(strings.Fields(line), " ") == strings.Join(want, " ") {
					found = true
				}
			}
			if !found {
				t.Errorf("api-resources lacks %v:\n%s", want, out)
			}
		}
		if out := h.MustRun("explain", "rc.spec.selector"); !strings.Contains(out, "FIELD: selector <map[string]string>") {
			t.Errorf("explain rc.spec.selector:\n%s", out)
		}
		if out := h.MustRun("get", "rc", "--field-selector=status.replicas=0", "-o", "name"); strings.TrimSpace(out) != "replicationcontroller/web" {
			t.Errorf("field selector status.replicas=0: %q", out)
		}
		if _, err := h.Run("get", "rc", "--field-selector=spec.replicas=1"); err == nil || !strings.Contains(err.Error(), "field label not supported: spec.replicas") {
			t.Errorf("field selector spec.replicas: %v", err)
		}
		// kubectl apply validates against the served OpenAPI.
		_, err := h.RunInput(ctx, `apiVersion: v1
kind: ReplicationController
metadata: {name: typo}
spec:
  replicaz: 2
  template:
    metadata: {labels: {app: typo}}
    spec: {containers: [{name: c, image: busybox}]}
`, nil, "apply", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), `unknown field "spec.replicaz"`) {
			t.Errorf("apply with an unknown field: %v", err)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		bad := &corev1.ReplicationController{
			ObjectMeta: metav1.ObjectMeta{Name: "bad"},
			Spec: corev1.ReplicationControllerSpec{
				Selector: map[string]string{"app": "other"},
				Template: &corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "bad"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
				},
			},
		}
		_, err := rcAPI.Create(ctx, bad, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "`selector` does not match template `labels`") ||
			strings.Join(fieldCauses(err), ",") != "spec.template.metadata.labels" {
			t.Errorf("selector not matching the template: %v (causes %v)", err, fieldCauses(err))
		}
		bad.Spec.Template = nil
		_, err = rcAPI.Create(ctx, bad, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || strings.Join(fieldCauses(err), ",") != "spec.template" {
			t.Errorf("no template: %v (causes %v)", err, fieldCauses(err))
		}
		if _, err := rcAPI.Get(ctx, "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("invalid replicationcontroller stored: %v", err)
		}
		cur, err := rcAPI.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Replicas, cur.Status.ReadyReplicas = 1, 2
		_, err = rcAPI.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.readyReplicas: Invalid value: 2: cannot be greater than status.replicas") {
			t.Errorf("status with more ready than replicas: %v", err)
		}
	})

	t.Run("scale and status", func(t *testing.T) {
		h.MustRun("scale", "rc", "web", "--replicas=3")
		sc, err := rcAPI.GetScale(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sc.Spec.Replicas != 3 || sc.Status.Selector != "app=web" {
			t.Errorf("scale: spec %+v, status %+v", sc.Spec, sc.Status)
		}
		cur, err := rcAPI.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cur.Generation != 2 {
			t.Errorf("generation %d after scaling, want 2", cur.Generation)
		}
		cur.Status = corev1.ReplicationControllerStatus{Replicas: 3, FullyLabeledReplicas: 3, ReadyReplicas: 2, ObservedGeneration: 2}
		cur.Spec.Replicas = ptrTo[int32](9) // ignored by /status
		if _, err := rcAPI.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		out := h.MustRun("get", "rc", "web", "--no-headers")
		if f := strings.Fields(out); len(f) != 5 || f[1] != "3" || f[2] != "3" || f[3] != "2" {
			t.Errorf("get rc after a status write: %q", out)
		}
	})

	t.Run("quota", func(t *testing.T) {
		h.MustRun("create", "namespace", "q")
		h.MustRun("create", "quota", "rcs", "-n", "q", "--hard=replicationcontrollers=1")
		rc := func(name string) string {
			return "apiVersion: v1\nkind: ReplicationController\nmetadata: {name: " + name + ", namespace: q}\n" +
				"spec:\n  template:\n    metadata: {labels: {app: " + name + "}}\n    spec: {containers: [{name: c, image: busybox}]}\n"
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			// The quota counts only once its status is written.
			q, err := kube.CoreV1().ResourceQuotas("q").Get(ctx, "rcs", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := q.Status.Hard[corev1.ResourceReplicationControllers]; ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("quota status never written: %+v", q.Status)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := h.RunInput(ctx, rc("one"), nil, "create", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		_, err := h.RunInput(ctx, rc("two"), nil, "create", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), "exceeded quota: rcs, requested: replicationcontrollers=1, used: replicationcontrollers=1, limited: replicationcontrollers=1") {
			t.Errorf("second replicationcontroller under a quota of one: %v", err)
		}
	})

	t.Run("orphan by default", func(t *testing.T) {
		cur, err := rcAPI.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ref := metav1.NewControllerRef(cur, corev1.SchemeGroupVersion.WithKind("ReplicationController"))
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{"app": "web"}, OwnerReferences: []metav1.OwnerReference{*ref}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx:1.27"}}},
		}
		if _, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// No propagation policy: the v1 API orphans, as upstream.
		if err := rcAPI.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, rcErr := rcAPI.Get(ctx, "web", metav1.GetOptions{})
			p, err := kube.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
			if err != nil {
				t.Fatalf("pod of a replicationcontroller deleted without a policy: %v", err)
			}
			if apierrors.IsNotFound(rcErr) && len(p.OwnerReferences) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not orphaned: rc %v, pod owners %v", rcErr, p.OwnerReferences)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// TestPodTemplate runs core/v1 PodTemplate through kubectl: create, get
// with upstream's columns, replace (bumping generation), delete, and an
// invalid template refused with its field.
func TestPodTemplate(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	kube := kubeClient(t, h)
	ctx := context.Background()
	manifest := `apiVersion: v1
kind: PodTemplate
metadata: {name: tmpl}
template:
  metadata: {labels: {app: web, tier: fe}}
  spec:
    containers: [{name: nginx, image: "IMAGE"}]
`
	if out, err := h.RunInput(ctx, strings.Replace(manifest, "IMAGE", "nginx:1.27", 1), nil, "create", "-f", "-"); err != nil ||
		strings.TrimSpace(out) != "podtemplate/tmpl created" {
		t.Fatalf("create: %q, %v", out, err)
	}
	out := h.MustRun("get", "podtemplates")
	if got := header(out); got != "NAME CONTAINERS IMAGES POD LABELS" {
		t.Errorf("get podtemplates header %q", got)
	}
	if row := strings.Join(strings.Fields(strings.Split(out, "\n")[1]), " "); row != "tmpl nginx nginx:1.27 app=web,tier=fe" {
		t.Errorf("get podtemplates row %q", row)
	}
	pt, err := kube.CoreV1().PodTemplates("default").Get(ctx, "tmpl", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pt.Generation != 1 || pt.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways || pt.Template.Spec.DNSPolicy != corev1.DNSClusterFirst {
		t.Errorf("created podtemplate: generation %d, spec %+v", pt.Generation, pt.Template.Spec)
	}

	if _, err := h.RunInput(ctx, strings.Replace(manifest, "IMAGE", "nginx:1.28", 1), nil, "replace", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if out := h.MustRun("get", "podtemplate", "tmpl", "-o", "jsonpath={.metadata.generation} {.template.spec.containers[0].image}"); out != "2 nginx:1.28" {
		t.Errorf("after replace: %q", out)
	}

	_, err = h.RunInput(ctx, `apiVersion: v1
kind: PodTemplate
metadata: {name: empty}
template:
  spec: {containers: []}
`, nil, "create", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), `The PodTemplate "empty" is invalid: template.spec.containers: Required value`) {
		t.Errorf("create without containers: %v", err)
	}
	_, err = kube.CoreV1().PodTemplates("default").Create(ctx, &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: "empty"}}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(strings.Join(fieldCauses(err), ","), "template.spec.containers") {
		t.Errorf("create without containers: %v (causes %v)", err, fieldCauses(err))
	}

	if out := h.MustRun("delete", "podtemplate", "tmpl"); !strings.HasPrefix(out, `podtemplate "tmpl" deleted`) {
		t.Errorf("delete: %q", out)
	}
	if out := h.MustRun("get", "podtemplates", "-o", "name"); out != "" {
		t.Errorf("podtemplates left: %q", out)
	}
}

func kubeClient(t *testing.T, h *hubtest.Hub) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(rc)
}

func ptrTo[T any](v T) *T { return &v }
