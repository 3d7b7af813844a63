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
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestNamespaceLifecycle checks the namespace lifecycle as upstream's
// NamespaceLifecycle admission enforces it, through a real kubectl: the
// system namespaces cannot be deleted, a namespace being deleted takes no
// new content, and what the cluster starts with comes back at a restart.
func TestNamespaceLifecycle(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	cs := clientFor(t, h)
	ctx := t.Context()
	protected := []string{"default", "kube-system", "kube-public", "kube-node-lease"}

	untouched := func(t *testing.T) {
		t.Helper()
		for _, name := range protected {
			ns, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("namespace %s: %v", name, err)
			}
			if ns.DeletionTimestamp != nil || ns.Status.Phase != corev1.NamespaceActive {
				t.Errorf("namespace %s changed: deletionTimestamp %v, phase %s", name, ns.DeletionTimestamp, ns.Status.Phase)
			}
		}
	}

	t.Run("delete a system namespace", func(t *testing.T) {
		for _, name := range protected {
			_, err := h.Run("delete", "namespace", name)
			want := `Error from server (Forbidden): namespaces "` + name + `" is forbidden: this namespace may not be deleted`
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("kubectl delete namespace %s: %v, want %q", name, err, want)
			}
		}
		err := cs.CoreV1().Namespaces().Delete(ctx, "kube-system", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsForbidden(err) {
			t.Errorf("dry-run delete of kube-system: %v, want Forbidden", err)
		}
		untouched(t)
	})

	t.Run("delete all namespaces", func(t *testing.T) {
		mustKubectl(t, h, "create", "namespace", "team-a")
		mustKubectl(t, h, "create", "namespace", "team-b")
		mustKubectl(t, h, "create", "configmap", "c", "-n", "team-a")
		out, err := h.Run("delete", "namespace", "--all", "--timeout=60s")
		var exit interface{ ExitCode() int }
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("kubectl delete namespace --all succeeded, want a non-zero exit: %v\n%s", err, out)
		}
		for _, name := range protected {
			if want := `namespaces "` + name + `" is forbidden: this namespace may not be deleted`; !strings.Contains(err.Error(), want) {
				t.Errorf("kubectl delete namespace --all does not report %q:\n%v", want, err)
			}
		}
		for _, name := range []string{"team-a", "team-b"} {
			if !strings.Contains(out, `namespace "`+name+`" deleted`) {
				t.Errorf("kubectl delete namespace --all did not delete %s:\n%s", name, out)
			}
			waitFor(t, "namespace "+name+" to go", func() bool {
				_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			})
		}
		untouched(t)
	})

	t.Run("create in a terminating namespace", func(t *testing.T) {
		mustKubectl(t, h, "create", "namespace", "held")
		hold := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hold", Finalizers: []string{"example.com/hold"}}}
		if _, err := cs.CoreV1().ConfigMaps("held").Create(ctx, hold, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		mustKubectl(t, h, "delete", "namespace", "held", "--wait=false")
		// The namespace controller deletes the configmap, whose finalizer
		// keeps it, and with it the namespace, in place.
		waitFor(t, "the held configmap to be deleted", func() bool {
			c, err := cs.CoreV1().ConfigMaps("held").Get(ctx, "hold", metav1.GetOptions{})
			return err == nil && c.DeletionTimestamp != nil
		})
		_, err := h.Run("create", "configmap", "late", "-n", "held")
		want := `configmaps "late" is forbidden: unable to create new content in namespace held because it is being terminated`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("kubectl create in a terminating namespace: %v, want %q", err, want)
		}
		_, err = cs.CoreV1().ConfigMaps("held").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "late-"}}, metav1.CreateOptions{})
		var se *apierrors.StatusError
		if !errors.As(err, &se) || se.ErrStatus.Code != 403 || se.ErrStatus.Details == nil ||
			len(se.ErrStatus.Details.Causes) != 1 || se.ErrStatus.Details.Causes[0].Type != corev1.NamespaceTerminatingCause ||
			se.ErrStatus.Details.Causes[0].Field != "metadata.namespace" {
			t.Errorf("create in a terminating namespace: %#v, want 403 with a NamespaceTerminating cause", err)
		}
		if _, err := cs.CoreV1().ConfigMaps("held").Patch(ctx, "hold", types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the held namespace to go", func() bool {
			_, err := cs.CoreV1().Namespaces().Get(ctx, "held", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	})

	t.Run("restart recreates what the cluster starts with", func(t *testing.T) {
		// Deleting the kubernetes Service is allowed; the hub recreates it
		// within seconds while it runs, and at the latest when it starts.
		// The same holds for a kube-node-lease deleted above.
		if out := mustKubectl(t, h, "delete", "service", "kubernetes", "-n", "default"); !strings.Contains(out, `service "kubernetes" deleted`) {
			t.Fatalf("kubectl delete service kubernetes: %q", out)
		}
		h.Stop()
		h.Restart()
		cs = clientFor(t, h)
		svc, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("kubernetes service after restart: %v", err)
		}
		if svc.Spec.ClusterIP == "" || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 {
			t.Errorf("kubernetes service after restart: %+v", svc.Spec)
		}
		if _, err := cs.CoreV1().Namespaces().Get(ctx, "kube-node-lease", metav1.GetOptions{}); err != nil {
			t.Errorf("kube-node-lease after restart: %v", err)
		}
		untouched(t)
	})
}

// mustKubectl runs kubectl against h and fails t, which may be a
// subtest, when it fails.
func mustKubectl(t *testing.T, h *hubtest.Hub, args ...string) string {
	t.Helper()
	out, err := h.Run(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor polls cond for up to 30 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
