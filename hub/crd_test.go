package hub_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

var (
	crdGVR    = apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
	widgetGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
)

func dynamicFor(t *testing.T, h *hubtest.Hub) dynamic.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dc
}

// crdCondition returns a definition's condition of type typ.
func crdCondition(t *testing.T, dc dynamic.Interface, name, typ string) (status, reason, message string) {
	t.Helper()
	u, err := dc.Resource(crdGVR).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return "", "", err.Error()
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			s, _ := m["status"].(string)
			r, _ := m["reason"].(string)
			msg, _ := m["message"].(string)
			return s, r, msg
		}
	}
	return "", "", ""
}

// applyWidgets creates the Widget definition and waits, with kubectl,
// until it is Established; it returns how long that took.
func applyWidgets(t *testing.T, h *hubtest.Hub) time.Duration {
	t.Helper()
	start := time.Now()
	mustKubectl(t, h, "apply", "-f", "testdata/crd/widgets.yaml")
	mustKubectl(t, h, "wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=10s")
	return time.Since(start)
}

// TestCRDLifecycle creates a CustomResourceDefinition and checks what
// kube-apiserver does with one: names accepted and Established within a
// second, its conditions, a conflicting definition's names refused, the
// kinds served again after a restart before the hub is ready, and, on
// deletion, its objects removed, watches on them ended and the resource
// gone from discovery.
func TestCRDLifecycle(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	dc := dynamicFor(t, h)
	ctx := t.Context()

	t.Run("established", func(t *testing.T) {
		took := applyWidgets(t, h)
		for _, typ := range []string{"NamesAccepted", "Established"} {
			if s, r, _ := crdCondition(t, dc, "widgets.example.com", typ); s != "True" {
				t.Errorf("%s = %s (%s), want True", typ, s, r)
			}
		}
		t.Logf("apply and wait took %v", took)
		u, err := dc.Resource(crdGVR).Get(ctx, "widgets.example.com", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := unstructured.NestedString(u.Object, "status", "acceptedNames", "kind"); got != "Widget" {
			t.Errorf("acceptedNames.kind = %q", got)
		}
		if got, _, _ := unstructured.NestedStringSlice(u.Object, "status", "storedVersions"); len(got) != 1 || got[0] != "v1" {
			t.Errorf("storedVersions = %v", got)
		}
		if fins := u.GetFinalizers(); len(fins) != 1 || fins[0] != "customresourcecleanup.apiextensions.k8s.io" {
			t.Errorf("finalizers = %v", fins)
		}
		out := mustKubectl(t, h, "get", "crd", "widgets.example.com")
		if first := strings.Join(strings.Fields(strings.SplitN(out, "\n", 2)[0]), " "); first != "NAME SCOPE VERSIONS CREATED AT" {
			t.Errorf("kubectl get crd header %q", first)
		}
		if out := mustKubectl(t, h, "api-resources", "--api-group=example.com"); !regexp.MustCompile(`widgets\s+wd\s+example.com/v1\s+true\s+Widget`).MatchString(out) {
			t.Errorf("api-resources:\n%s", out)
		}
	})

	t.Run("conflicting names", func(t *testing.T) {
		mustKubectl(t, h, "apply", "-f", "testdata/crd/conflict.yaml")
		waitFor(t, "NamesAccepted=False on gadgets", func() bool {
			s, _, _ := crdCondition(t, dc, "gadgets.example.com", "NamesAccepted")
			return s == "False"
		})
		_, r, msg := crdCondition(t, dc, "gadgets.example.com", "NamesAccepted")
		if r != "ShortNamesConflict" || msg != `"wd" is already in use` {
			t.Errorf("NamesAccepted reason %q message %q", r, msg)
		}
		if s, r, _ := crdCondition(t, dc, "gadgets.example.com", "Established"); s != "False" || r != "NotAccepted" {
			t.Errorf("Established = %s (%s), want False (NotAccepted)", s, r)
		}
		// Fixing the names establishes it.
		mustKubectl(t, h, "patch", "crd", "gadgets.example.com", "--type=json", "-p", `[{"op":"replace","path":"/spec/names/shortNames","value":["gd"]}]`)
		mustKubectl(t, h, "wait", "--for=condition=Established", "crd/gadgets.example.com", "--timeout=10s")
		mustKubectl(t, h, "get", "gd")
	})

	t.Run("bad definitions", func(t *testing.T) {
		cases := []struct{ file, name, want string }{
			{"nonstructural.yaml", "gizmos.example.com", `spec.validation.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields`},
			{"misnamed.yaml", "sprockets.example.org", `metadata.name: Invalid value: "sprockets.example.org": must be spec.names.plural+"."+spec.group`},
		}
		for _, c := range cases {
			_, err := h.Run("apply", "-f", "testdata/crd/"+c.file)
			if err == nil || !strings.Contains(err.Error(), `is invalid: `) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("apply %s: %v\nwant %q", c.file, err, c.want)
			}
			if _, err := dc.Resource(crdGVR).Get(ctx, c.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s stored: %v", c.name, err)
			}
		}
		// An invalid caBundle is refused once a definition is
		// established (upstream lets one that never was keep it).
		_, err := h.Run("patch", "crd", "widgets.example.com", "--type=merge", "-p",
			`{"spec":{"conversion":{"strategy":"Webhook","webhook":{"conversionReviewVersions":["v1"],"clientConfig":{"url":"https://conv.example.com","caBundle":"bm90IGEgY2VydGlmaWNhdGU="}}}}}`)
		if err == nil || !strings.Contains(err.Error(), `spec.conversion.webhookClientConfig.caBundle: Invalid value:`) || !strings.Contains(err.Error(), "unable to load root certificates") {
			t.Errorf("invalid caBundle: %v", err)
		}
		if out := mustKubectl(t, h, "get", "crd", "widgets.example.com", "-o", "jsonpath={.spec.conversion.strategy}"); out != "None" {
			t.Errorf("conversion strategy %q stored", out)
		}
		// The API answers 422 with a cause per field.
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apiextensions.k8s.io/v1")
		u.SetKind("CustomResourceDefinition")
		u.SetName("things.example.org")
		_ = unstructured.SetNestedMap(u.Object, map[string]any{
			"group": "example.com", "scope": "Cluster",
			"names":    map[string]any{"plural": "things", "kind": "Thing"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true}},
		}, "spec")
		_, err = dc.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{})
		var se *apierrors.StatusError
		if !errors.As(err, &se) || se.Status().Code != 422 || se.Status().Details == nil {
			t.Fatalf("create: %v, want 422 with details", err)
		}
		fields := map[string]bool{}
		for _, c := range se.Status().Details.Causes {
			fields[c.Field] = true
		}
		for _, f := range []string{"metadata.name", "spec.versions[0].schema.openAPIV3Schema"} {
			if !fields[f] {
				t.Errorf("no cause for %s in %+v", f, se.Status().Details.Causes)
			}
		}
	})

	t.Run("served again after a restart", func(t *testing.T) {
		mustKubectl(t, h, "create", "namespace", "restart")
		mustKubectlIn(t, h, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: kept, namespace: restart}\nspec: {replicas: 2}\n", "apply", "-f", "-")
		h.Restart()
		// Ready means the stored definitions are served: no waiting.
		if out := mustKubectl(t, h, "get", "widgets", "-n", "restart", "-o", "name"); strings.TrimSpace(out) != "widget.example.com/kept" {
			t.Errorf("after restart: %q", out)
		}
	})

	t.Run("delete the definition", func(t *testing.T) {
		dc := dynamicFor(t, h)
		for _, ns := range []string{"del-a", "del-b"} {
			mustKubectl(t, h, "create", "namespace", ns)
			mustKubectlIn(t, h, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: "+ns+"}\n", "apply", "-f", "-")
		}
		// An object with a finalizer of its own holds the deletion until
		// it is removed, as upstream.
		mustKubectlIn(t, h, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: held, namespace: del-a, finalizers: [example.com/hold]}\n", "apply", "-f", "-")
		w, err := dc.Resource(widgetGVR).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		mustKubectl(t, h, "delete", "crd", "widgets.example.com", "--wait=false")
		waitFor(t, "Terminating=True", func() bool {
			s, _, _ := crdCondition(t, dc, "widgets.example.com", "Terminating")
			return s == "True"
		})
		_, err = h.RunInput(ctx, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: late, namespace: del-b}\n", nil, "create", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), "create not allowed while custom resource definition is terminating") {
			t.Errorf("create while terminating: %v", err)
		}
		waitFor(t, "unheld objects deleted", func() bool {
			l, err := dc.Resource(widgetGVR).List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 1 && l.Items[0].GetName() == "held"
		})
		if _, err := dc.Resource(crdGVR).Get(ctx, "widgets.example.com", metav1.GetOptions{}); err != nil {
			t.Fatalf("definition gone while an object is held: %v", err)
		}
		mustKubectl(t, h, "patch", "widget", "held", "-n", "del-a", "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
		waitFor(t, "definition deleted", func() bool {
			_, err := dc.Resource(crdGVR).Get(ctx, "widgets.example.com", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		ended := time.After(5 * time.Second)
	drain:
		for {
			select {
			case _, ok := <-w.ResultChan():
				if !ok {
					break drain
				}
			case <-ended:
				t.Fatal("watch of widgets still open after the definition was deleted")
			}
		}
		if out := mustKubectl(t, h, "api-resources", "--api-group=example.com"); strings.Contains(out, "widgets") {
			t.Errorf("api-resources still lists widgets:\n%s", out)
		}
		if _, err := h.Run("get", "widgets", "-A"); err == nil || !strings.Contains(err.Error(), `the server doesn't have a resource type "widgets"`) {
			t.Errorf("kubectl get widgets after deletion: %v", err)
		}
	})
}
