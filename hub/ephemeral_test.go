package hub_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestEphemeralContainers drives pods/ephemeralcontainers of a real hub
// with kubectl and client-go: discovery lists it, `kubectl debug` adds a
// container through it, and every write upstream refuses is refused with
// upstream's Status and causes, storing nothing.
func TestEphemeralContainers(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	// The service account admission needs the account the controller,
	// not running here, would make.
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := cs.CoreV1().Pods("default")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "setup", Image: "busybox:1"}},
		Containers:     []corev1.Container{{Name: "c", Image: "busybox:1"}},
		Volumes:        []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
	}}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("discovery", func(t *testing.T) {
		out := h.MustRun("get", "--raw", "/api/v1")
		var list metav1.APIResourceList
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatal(err)
		}
		for _, r := range list.APIResources {
			if r.Name == "pods/ephemeralcontainers" {
				if r.Kind != "Pod" || strings.Join(r.Verbs, ",") != "get,patch,update" || !r.Namespaced {
					t.Errorf("pods/ephemeralcontainers in discovery: %+v", r)
				}
				return
			}
		}
		t.Error("discovery does not list pods/ephemeralcontainers")
	})

	t.Run("kubectl debug adds a container", func(t *testing.T) {
		out := h.MustRun("debug", "app", "--image=busybox:1", "--target=c", "--container=dbg", "--", "sleep", "1d")
		got, err := pods.Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Spec.EphemeralContainers) != 1 {
			t.Fatalf("after kubectl debug (%q) the pod has ephemeral containers %+v", out, got.Spec.EphemeralContainers)
		}
		ec := got.Spec.EphemeralContainers[0]
		if ec.Name != "dbg" || ec.TargetContainerName != "c" || strings.Join(ec.Command, " ") != "sleep 1d" ||
			ec.TerminationMessagePath != corev1.TerminationMessagePathDefault || ec.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("ephemeral container as stored: %+v", ec)
		}
		recorded := false
		for _, e := range got.ManagedFields {
			recorded = recorded || e.Subresource == "ephemeralcontainers" && e.Operation == metav1.ManagedFieldsOperationUpdate
		}
		if !recorded {
			t.Errorf("no managedFields entry of the subresource: %+v", got.ManagedFields)
		}
		raw := h.MustRun("get", "--raw", "/api/v1/namespaces/default/pods/app/ephemeralcontainers")
		var viaSub corev1.Pod
		if err := json.Unmarshal([]byte(raw), &viaSub); err != nil || len(viaSub.Spec.EphemeralContainers) != 1 {
			t.Errorf("GET of the subresource: %v %s", err, raw)
		}
	})

	t.Run("update adds and keeps the rest", func(t *testing.T) {
		cur, err := pods.Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Labels = map[string]string{"ignored": "yes"}
		cur.Spec.ActiveDeadlineSeconds = ptr.To(int64(60))
		cur.Spec.EphemeralContainers = append(cur.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "shell", Image: "busybox:1",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}})
		got, err := pods.UpdateEphemeralContainers(ctx, "app", cur, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Spec.EphemeralContainers) != 2 || got.Labels["ignored"] != "" || got.Spec.ActiveDeadlineSeconds != nil {
			t.Errorf("update through the subresource changed more than its ephemeral containers: labels %v, deadline %v, %d containers",
				got.Labels, got.Spec.ActiveDeadlineSeconds, len(got.Spec.EphemeralContainers))
		}
	})

	refused := []struct {
		name   string
		change func(p *corev1.Pod)
		causes []ephemeralCause
	}{
		{"change an existing one", func(p *corev1.Pod) { p.Spec.EphemeralContainers[0].Image = "busybox:2" },
			[]ephemeralCause{{"FieldValueForbidden", "spec.ephemeralContainers", `Forbidden: existing ephemeral containers "dbg" may not be changed`}}},
		{"remove an existing one", func(p *corev1.Pod) { p.Spec.EphemeralContainers = p.Spec.EphemeralContainers[1:] },
			[]ephemeralCause{{"FieldValueForbidden", "spec.ephemeralContainers", `Forbidden: existing ephemeral containers "dbg" may not be removed`}}},
		{"name taken by an app container", func(p *corev1.Pod) { addEphemeral(p, corev1.EphemeralContainerCommon{Name: "c"}, "") },
			[]ephemeralCause{{"FieldValueDuplicate", "spec.ephemeralContainers[2].name", `Duplicate value: "c"`}}},
		{"name taken by an init container", func(p *corev1.Pod) { addEphemeral(p, corev1.EphemeralContainerCommon{Name: "setup"}, "") },
			[]ephemeralCause{{"FieldValueDuplicate", "spec.ephemeralContainers[2].name", `Duplicate value: "setup"`}}},
		{"ports", func(p *corev1.Pod) {
			addEphemeral(p, corev1.EphemeralContainerCommon{Name: "x", Ports: []corev1.ContainerPort{{ContainerPort: 80}}}, "")
		}, []ephemeralCause{{"FieldValueForbidden", "spec.ephemeralContainers[2].ports", "Forbidden: cannot be set for an Ephemeral Container"}}},
		{"probes", func(p *corev1.Pod) {
			addEphemeral(p, corev1.EphemeralContainerCommon{Name: "x", ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
				Exec: &corev1.ExecAction{Command: []string{"true"}}}}}, "")
		}, []ephemeralCause{{"FieldValueForbidden", "spec.ephemeralContainers[2].readinessProbe", "Forbidden: cannot be set for an Ephemeral Container"}}},
		{"lifecycle", func(p *corev1.Pod) {
			addEphemeral(p, corev1.EphemeralContainerCommon{Name: "x", Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
				Exec: &corev1.ExecAction{Command: []string{"true"}}}}}, "")
		}, []ephemeralCause{{"FieldValueForbidden", "spec.ephemeralContainers[2].lifecycle", "Forbidden: cannot be set for an Ephemeral Container"}}},
		{"resources", func(p *corev1.Pod) {
			addEphemeral(p, corev1.EphemeralContainerCommon{Name: "x", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}, "")
		}, []ephemeralCause{{"FieldValueForbidden", "spec.ephemeralContainers[2].resources", "Forbidden: cannot be set for an Ephemeral Container"}}},
		{"unknown target", func(p *corev1.Pod) { addEphemeral(p, corev1.EphemeralContainerCommon{Name: "x"}, "nope") },
			[]ephemeralCause{{"FieldValueNotFound", "spec.ephemeralContainers[2].targetContainerName", `Not found: "nope"`}}},
		{"ephemeral target", func(p *corev1.Pod) { addEphemeral(p, corev1.EphemeralContainerCommon{Name: "x"}, "dbg") },
			[]ephemeralCause{{"FieldValueNotFound", "spec.ephemeralContainers[2].targetContainerName", `Not found: "dbg"`}}},
	}
	for _, c := range refused {
		t.Run("refuse "+c.name, func(t *testing.T) {
			cur, err := pods.Get(ctx, "app", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			before := cur.ResourceVersion
			c.change(cur)
			_, err = pods.UpdateEphemeralContainers(ctx, "app", cur, metav1.UpdateOptions{})
			checkEphemeralInvalid(t, err, c.causes)
			if now, _ := pods.Get(ctx, "app", metav1.GetOptions{}); now.ResourceVersion != before {
				t.Errorf("refused write stored the pod: resourceVersion %s, was %s", now.ResourceVersion, before)
			}
		})
	}

	t.Run("strategic merge patch of a changed container is refused", func(t *testing.T) {
		patch := `{"spec":{"ephemeralContainers":[{"name":"dbg","image":"busybox:3"}]}}`
		_, err := pods.Patch(ctx, "app", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "ephemeralcontainers")
		checkEphemeralInvalid(t, err, []ephemeralCause{{"FieldValueForbidden", "spec.ephemeralContainers", `Forbidden: existing ephemeral containers "dbg" may not be changed`}})
	})

	t.Run("the pod itself may not change them", func(t *testing.T) {
		cur, err := pods.Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		addEphemeral(cur, corev1.EphemeralContainerCommon{Name: "sneaky", Image: "busybox:1"}, "")
		_, err = pods.Update(ctx, cur, metav1.UpdateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec: Forbidden: pod updates may not change fields other than") {
			t.Fatalf("pod update adding an ephemeral container: %v", err)
		}
		bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "born-with-one"}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}
		addEphemeral(bad, corev1.EphemeralContainerCommon{Name: "dbg", Image: "busybox:1"}, "")
		_, err = pods.Create(ctx, bad, metav1.CreateOptions{})
		checkEphemeralInvalid(t, err, []ephemeralCause{{"FieldValueForbidden", "spec.ephemeralContainers", "Forbidden: cannot be set on create"}})
	})
}

// ephemeralCause is an expected StatusCause: its type, field and the start of its
// message.
type ephemeralCause struct{ typ, field, msg string }

func addEphemeral(p *corev1.Pod, c corev1.EphemeralContainerCommon, target string) {
	if c.Image == "" {
		c.Image = "busybox:1"
	}
	p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: c, TargetContainerName: target})
}

// checkEphemeralInvalid checks that err is a 422 Invalid Status whose causes start
// with want's type and field and whose messages start with want's message.
func checkEphemeralInvalid(t *testing.T, err error, want []ephemeralCause) {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("got %v, want 422 Invalid", err)
	}
	st := err.(apierrors.APIStatus).Status()
	if st.Details == nil || st.Details.Kind != "Pod" || len(st.Details.Causes) != len(want) {
		t.Fatalf("Status details %+v, want %d causes %+v", st.Details, len(want), want)
	}
	for i, w := range want {
		got := st.Details.Causes[i]
		if string(got.Type) != w.typ || got.Field != w.field || !strings.HasPrefix(got.Message, w.msg) {
			t.Errorf("ephemeralCause %d: %s %s %q, want %s %s %q", i, got.Type, got.Field, got.Message, w.typ, w.field, w.msg)
		}
	}
}
