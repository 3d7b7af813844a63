package hub_test

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/disconnect"
)

// disconnectDeployment is a Deployment whose pod template carries the
// given disconnect policy annotations (YAML lines, indented for them).
func disconnectDeployment(name, annotations string) string {
	return `apiVersion: apps/v1
kind: Deployment
metadata:
  name: ` + name + `
spec:
  replicas: 1
  selector: {matchLabels: {app: ` + name + `}}
  template:
    metadata:
      labels: {app: ` + name + `}
      annotations:
` + annotations + `
    spec:
      containers: [{name: app, image: nginx:1.27}]
`
}

// TestDisconnectPolicy drives the disconnect policy through a real hub
// with real kubectl: bad annotations on a workload's pod template or a
// pod are refused with 422 and field causes and store nothing; the pods
// of a good Deployment carry the effective policy and its toleration of
// the unreachable taint, which kubectl describe shows.
func TestDisconnectPolicy(t *testing.T) {
	h := hubtest.Start(t, "--controllers=deployment,replicaset,serviceaccount,garbagecollector,namespace", "--disable-scheduler")
	apply := func(manifest string) (string, error) {
		return h.RunInput(context.Background(), manifest, nil, "apply", "-f", "-")
	}

	t.Run("refused", func(t *testing.T) {
		for _, c := range []struct {
			name, annotations, want string
		}{
			{"bad-reconcile", `        disconnect.tether.io/reconcile: keepBoth`,
				`The Deployment "bad-reconcile" is invalid: spec.template.metadata.annotations[disconnect.tether.io/reconcile]: Unsupported value: "keepBoth": supported values: "keepOriginal", "keepReplacement", "longestRunning"`},
			{"negative-lost-after", `        disconnect.tether.io/lost-after: -1m`,
				`The Deployment "negative-lost-after" is invalid: spec.template.metadata.annotations[disconnect.tether.io/lost-after]: Invalid value: "-1m": must be greater than or equal to 0`},
		} {
			// -v=6 logs each response's code.
			out, err := h.RunInput(context.Background(), disconnectDeployment(c.name, c.annotations), nil, "apply", "-v=6", "-f", "-")
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "422 Unprocessable Entity") {
				t.Errorf("apply %s: %q, %v; want exit error with 422 and %q", c.name, out, err, c.want)
			}
			if _, err := h.Run("get", "deployment", c.name); err == nil || !strings.Contains(err.Error(), "NotFound") {
				t.Errorf("refused deployment %s stored: %v", c.name, err)
			}
		}
		if _, err := h.Run("run", "bare", "--image=nginx:1.27", "--annotations=disconnect.tether.io/replace=yes"); err == nil ||
			!strings.Contains(err.Error(), `The Pod "bare" is invalid: metadata.annotations[disconnect.tether.io/replace]: Unsupported value: "yes": supported values: "true", "false"`) {
			t.Errorf("kubectl run with a bad policy: %v", err)
		}
		if _, err := h.Run("get", "pod", "bare"); err == nil {
			t.Error("refused pod stored")
		}
	})

	t.Run("status causes", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cs := kubernetes.NewForConfigOrDie(cfg)
		cj := &batchv1.CronJob{
			ObjectMeta: metav1.ObjectMeta{Name: "tick"},
			Spec: batchv1.CronJobSpec{Schedule: "*/5 * * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{disconnect.LostAfterAnnotation: "soon"}},
				Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			}}}},
		}
		_, err = cs.BatchV1().CronJobs("default").Create(t.Context(), cj, metav1.CreateOptions{})
		var st apierrors.APIStatus
		if !errors.As(err, &st) || st.Status().Code != 422 || st.Status().Reason != metav1.StatusReasonInvalid || st.Status().Details == nil {
			t.Fatalf("create cronjob: %v", err)
		}
		causes := st.Status().Details.Causes
		if len(causes) != 1 || causes[0].Field != "spec.jobTemplate.spec.template.metadata.annotations[disconnect.tether.io/lost-after]" ||
			causes[0].Type != metav1.CauseTypeFieldValueInvalid {
			t.Errorf("causes %+v", causes)
		}
	})

	t.Run("effective policy", func(t *testing.T) {
		replaced := disconnectDeployment("replaced", `        disconnect.tether.io/replace: "true"
        disconnect.tether.io/lost-after: 60s`)
		for _, m := range []string{replaced, disconnectDeployment("pinned", "")} {
			if _, err := apply(m); err != nil {
				t.Fatal(err)
			}
		}
		podOf := func(app string) string {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for {
				out := strings.TrimSpace(h.MustRun("get", "pods", "-l", "app="+app, "-o", "jsonpath={.items[0].metadata.name}"))
				if out != "" {
					return out
				}
				if time.Now().After(deadline) {
					t.Fatalf("no pod of deployment %s after 30s", app)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		for _, c := range []struct {
			app, effective, unreachable string
		}{
			{"replaced", "lostAfter=1m0s replace=true reconcile=keepReplacement", `node.kubernetes.io/unreachable:NoExecute op=Exists for 60s`},
			{"pinned", "replace=false (never replaced while its node is unreachable)", `node.kubernetes.io/unreachable:NoExecute op=Exists`},
		} {
			pod := podOf(c.app)
			got := h.MustRun("get", "pod", pod, "-o", `jsonpath={.metadata.annotations.disconnect\.tether\.io/effective}|{.spec.tolerations[?(@.key=="node.kubernetes.io/unreachable")].tolerationSeconds}`)
			want := c.effective + "|"
			if c.app == "replaced" {
				want += "60"
			}
			if got != want {
				t.Errorf("pod %s: effective annotation|unreachable tolerationSeconds = %q, want %q", pod, got, want)
			}
			out := h.MustRun("describe", "pod", pod)
			for _, re := range []string{
				`(?m)^Annotations:\s+disconnect\.tether\.io/effective: ` + regexp.QuoteMeta(c.effective) + `$`,
				`(?m)^Tolerations:\s+node\.kubernetes\.io/not-ready:NoExecute op=Exists for 300s$`,
				`(?m)^\s+` + regexp.QuoteMeta(c.unreachable) + `$`,
			} {
				if !regexp.MustCompile(re).MatchString(out) {
					t.Errorf("kubectl describe pod %s: no match for %s in\n%s", pod, re, out)
				}
			}
		}

		// An update to a bad policy is refused too and changes nothing.
		_, err := apply(strings.Replace(replaced, "lost-after: 60s", "lost-after: -60s", 1))
		if err == nil || !strings.Contains(err.Error(), `spec.template.metadata.annotations[disconnect.tether.io/lost-after]: Invalid value: "-60s": must be greater than or equal to 0`) {
			t.Errorf("apply of a negative lost-after over a good one: %v", err)
		}
		if got := h.MustRun("get", "deployment", "replaced", "-o", `jsonpath={.metadata.generation} {.spec.template.metadata.annotations.disconnect\.tether\.io/lost-after}`); got != "1 60s" {
			t.Errorf("refused update changed the deployment: %q", got)
		}
	})
}
