package hub_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/hubtest"
)

func widget(name, ns, spec string) string {
	return "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec: " + spec + "\n"
}

// TestCustomObjects checks that objects of a CustomResourceDefinition get
// what built-in objects get, as kube-apiserver serves them: schema and
// CEL validation, pruning, defaults, printer columns, the status and
// scale subresources, generation, watches, pagination, patches,
// finalizers, garbage collection, namespace deletion, kubectl wait and
// categories.
func TestCustomObjects(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	dc := dynamicFor(t, h)
	ctx := t.Context()
	applyWidgets(t, h)
	mustKubectl(t, h, "create", "namespace", "shop")
	ws := dc.Resource(widgetGVR).Namespace("shop")

	t.Run("columns", func(t *testing.T) {
		mustKubectlIn(t, h, widget("a", "shop", "{replicas: 2, color: red}"), "apply", "-f", "-")
		out := mustKubectl(t, h, "get", "widgets", "-n", "shop")
		if first := strings.Join(strings.Fields(strings.SplitN(out, "\n", 2)[0]), " "); first != "NAME REPLICAS COLOR AGE" {
			t.Errorf("header %q", first)
		}
		if !regexp.MustCompile(`(?m)^a\s+2\s+red\s+\S+$`).MatchString(out) {
			t.Errorf("row:\n%s", out)
		}
	})

	t.Run("schema and rule violations", func(t *testing.T) {
		cases := []struct{ spec, want string }{
			{"{color: purple}", `spec.color: Unsupported value: "purple": supported values: "red", "green", "blue"`},
			{"{replicas: -1}", `spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0`},
			{"{replicas: 1, minReplicas: 3}", `minReplicas must not exceed replicas`},
		}
		for _, c := range cases {
			_, err := h.RunInput(ctx, widget("bad", "shop", c.spec), nil, "create", "-f", "-")
			if err == nil || !strings.Contains(err.Error(), `The Widget "bad" is invalid`) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("create with %s: %v\nwant %q", c.spec, err, c.want)
			}
		}
	})

	t.Run("pruning and defaults", func(t *testing.T) {
		obj := widget("pruned", "shop", "{bogus: 1}")
		_, err := h.RunInput(ctx, obj, nil, "create", "--validate=strict", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), `unknown field "spec.bogus"`) {
			t.Errorf("strict create with an unknown field: %v", err)
		}
		mustKubectlIn(t, h, obj, "create", "--validate=false", "-f", "-")
		out := mustKubectl(t, h, "get", "widget", "pruned", "-n", "shop", "-o", "jsonpath={.spec}")
		if out != `{"minReplicas":0,"replicas":1}` {
			t.Errorf("stored spec %s, want the unknown field pruned and the defaults set", out)
		}
	})

	t.Run("default on read", func(t *testing.T) {
		// A default added to the schema later shows on objects stored
		// before it.
		mustKubectl(t, h, "patch", "crd", "widgets.example.com", "--type=json", "-p",
			`[{"op":"add","path":"/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/mode","value":{"type":"string","default":"auto"}}]`)
		waitFor(t, "default on read", func() bool {
			out, err := h.Run("get", "widget", "a", "-n", "shop", "-o", "jsonpath={.spec.mode}")
			return err == nil && out == "auto"
		})
	})

	t.Run("scale, status and generation", func(t *testing.T) {
		gen := func() int64 {
			u, err := ws.Get(ctx, "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return u.GetGeneration()
		}
		g0 := gen()
		mustKubectl(t, h, "scale", "widget/a", "-n", "shop", "--replicas=3")
		if out := mustKubectl(t, h, "get", "widget", "a", "-n", "shop", "-o", "jsonpath={.spec.replicas}"); out != "3" {
			t.Errorf("spec.replicas after scale = %s", out)
		}
		if g := gen(); g != g0+1 {
			t.Errorf("generation after a spec change %d, want %d", g, g0+1)
		}
		mustKubectl(t, h, "patch", "widget", "a", "-n", "shop", "--subresource=status", "--type=merge", "-p",
			`{"status":{"replicas":3,"selector":"app=a"},"spec":{"replicas":9}}`)
		if out := mustKubectl(t, h, "get", "widget", "a", "-n", "shop", "-o", "jsonpath={.status.replicas}/{.spec.replicas}"); out != "3/3" {
			t.Errorf("status/spec after status patch = %s, want 3/3", out)
		}
		if g := gen(); g != g0+1 {
			t.Errorf("generation after a status change %d, want %d", g, g0+1)
		}
		out := mustKubectl(t, h, "get", "--raw", "/apis/example.com/v1/namespaces/shop/widgets/a/scale")
		if !strings.Contains(out, `"kind":"Scale"`) || !strings.Contains(out, `"selector":"app=a"`) || !strings.Contains(out, `"replicas":3`) {
			t.Errorf("scale: %s", out)
		}
	})

	t.Run("patches", func(t *testing.T) {
		mustKubectl(t, h, "patch", "widget", "a", "-n", "shop", "--type=merge", "-p", `{"spec":{"color":"green"}}`)
		mustKubectl(t, h, "patch", "widget", "a", "-n", "shop", "--type=json", "-p", `[{"op":"replace","path":"/spec/replicas","value":4}]`)
		if out := mustKubectl(t, h, "get", "widget", "a", "-n", "shop", "-o", "jsonpath={.spec.color}/{.spec.replicas}"); out != "green/4" {
			t.Errorf("after patches: %s", out)
		}
		_, err := h.Run("patch", "widget", "a", "-n", "shop", "--type=strategic", "-p", `{"spec":{"color":"blue"}}`)
		// kubectl words the 415 itself.
		if err == nil || !strings.Contains(err.Error(), "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml") {
			t.Errorf("strategic merge patch: %v, want 415", err)
		}
		mustKubectlIn(t, h, widget("ssa", "shop", "{color: blue, replicas: 3}"), "apply", "--server-side", "--field-manager=me", "-f", "-")
		// An integer field applied from YAML stays an integer.
		if out, err := h.Run("get", "widget", "ssa", "-n", "shop", "-o", "jsonpath={.spec.replicas}"); err != nil || strings.TrimSpace(string(out)) != "3" {
			t.Errorf("applied replicas: %q, %v", out, err)
		}
		_, err = h.RunInput(ctx, widget("ssa", "shop", "{color: red}"), nil, "apply", "--server-side", "--field-manager=other", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), `conflict with "me": .spec.color`) {
			t.Errorf("conflicting apply: %v", err)
		}
	})

	t.Run("watch and pagination", func(t *testing.T) {
		for _, n := range []string{"p1", "p2", "p3", "p4"} {
			mustKubectlIn(t, h, widget(n, "shop", "{}"), "apply", "-f", "-")
		}
		l, err := ws.List(ctx, metav1.ListOptions{Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		n := len(l.Items)
		for l.GetContinue() != "" {
			if l, err = ws.List(ctx, metav1.ListOptions{Limit: 2, Continue: l.GetContinue()}); err != nil {
				t.Fatal(err)
			}
			n += len(l.Items)
		}
		all, _ := ws.List(ctx, metav1.ListOptions{})
		if n != len(all.Items) || n < 6 {
			t.Errorf("paged %d objects, listed %d", n, len(all.Items))
		}
		// A streaming list ends its initial events with a bookmark.
		w, err := ws.Watch(ctx, metav1.ListOptions{AllowWatchBookmarks: true, SendInitialEvents: ptr.To(true),
			ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		added, bookmark := 0, false
		timeout := time.After(10 * time.Second)
		for !bookmark {
			select {
			case ev := <-w.ResultChan():
				switch ev.Type {
				case watch.Added:
					added++
				case watch.Bookmark:
					bookmark = true
				}
			case <-timeout:
				t.Fatalf("no bookmark after %d initial events", added)
			}
		}
		if added != len(all.Items) {
			t.Errorf("initial events %d, want %d", added, len(all.Items))
		}
		mustKubectl(t, h, "label", "widget", "p1", "-n", "shop", "seen=yes")
		select {
		case ev := <-w.ResultChan():
			if u, ok := ev.Object.(*unstructured.Unstructured); ev.Type != watch.Modified || !ok || u.GetName() != "p1" {
				t.Errorf("event %s %T", ev.Type, ev.Object)
			}
		case <-time.After(5 * time.Second):
			t.Error("no event for the label")
		}
	})

	t.Run("finalizers", func(t *testing.T) {
		mustKubectlIn(t, h, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: fin, namespace: shop, finalizers: [example.com/hold]}\n", "apply", "-f", "-")
		mustKubectl(t, h, "delete", "widget", "fin", "-n", "shop", "--wait=false")
		if out := mustKubectl(t, h, "get", "widget", "fin", "-n", "shop", "-o", "jsonpath={.metadata.deletionTimestamp}"); out == "" {
			t.Error("no deletionTimestamp on a held object")
		}
		mustKubectl(t, h, "patch", "widget", "fin", "-n", "shop", "--type=json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`)
		waitFor(t, "held object deleted", func() bool {
			_, err := h.Run("get", "widget", "fin", "-n", "shop")
			return err != nil && strings.Contains(err.Error(), "NotFound")
		})
	})

	t.Run("garbage collection", func(t *testing.T) {
		owner := func(name string) string {
			u, err := ws.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return "ownerReferences: [{apiVersion: example.com/v1, kind: Widget, name: " + name + ", uid: " + string(u.GetUID()) + "}]"
		}
		gone := func(args ...string) func() bool {
			return func() bool {
				_, err := h.Run(append([]string{"get"}, args...)...)
				return err != nil && strings.Contains(err.Error(), "NotFound")
			}
		}
		// Background: a ConfigMap owned by a Widget goes with it.
		mustKubectlIn(t, h, widget("bg", "shop", "{}"), "apply", "-f", "-")
		mustKubectlIn(t, h, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bg-dep, namespace: shop, "+owner("bg")+"}\n", "apply", "-f", "-")
		mustKubectl(t, h, "delete", "widget", "bg", "-n", "shop")
		waitFor(t, "background dependent deleted", gone("cm", "bg-dep", "-n", "shop"))

		// Foreground: a Widget owned by a Widget goes first.
		mustKubectlIn(t, h, widget("fg", "shop", "{}"), "apply", "-f", "-")
		mustKubectlIn(t, h, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: fg-dep, namespace: shop, "+owner("fg")+"}\n", "apply", "-f", "-")
		mustKubectl(t, h, "delete", "widget", "fg", "-n", "shop", "--cascade=foreground", "--timeout=30s")
		waitFor(t, "foreground dependent deleted", gone("widget", "fg-dep", "-n", "shop"))

		// Orphan: the dependent stays, without the reference.
		mustKubectlIn(t, h, widget("or", "shop", "{}"), "apply", "-f", "-")
		mustKubectlIn(t, h, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: or-dep, namespace: shop, "+owner("or")+"}\n", "apply", "-f", "-")
		mustKubectl(t, h, "delete", "widget", "or", "-n", "shop", "--cascade=orphan")
		waitFor(t, "orphan's reference removed", func() bool {
			out, err := h.Run("get", "widget", "or-dep", "-n", "shop", "-o", "jsonpath={.metadata.ownerReferences}")
			return err == nil && out == ""
		})
	})

	t.Run("wait for a condition", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := h.Run("wait", "--for=condition=Ready", "widget/a", "-n", "shop", "--timeout=20s")
			done <- err
		}()
		time.Sleep(500 * time.Millisecond)
		mustKubectl(t, h, "patch", "widget", "a", "-n", "shop", "--subresource=status", "--type=merge", "-p",
			`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Up"}]}}`)
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	t.Run("categories", func(t *testing.T) {
		out := mustKubectl(t, h, "get", "all", "-n", "shop")
		if !strings.Contains(out, "widget.example.com/a") {
			t.Errorf("kubectl get all lacks the widgets:\n%s", out)
		}
	})

	t.Run("finalizer name warnings", func(t *testing.T) {
		const prefer = `: prefer a domain-qualified finalizer name to avoid accidental conflicts with other finalizer writers`
		const preferPath = `: prefer a domain-qualified finalizer name including a path (/) to avoid accidental conflicts with other finalizer writers`
		_, stderr, err := kubectlBoth(h, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: fin, namespace: shop, finalizers: [example.com/ok, plain, a.b, orphan]}\n", "create", "-f", "-")
		if err != nil {
			t.Fatalf("create: %v\n%s", err, stderr)
		}
		for _, want := range []string{
			`Warning: metadata.finalizers: "a.b"` + preferPath,
			`Warning: metadata.finalizers: "plain"` + prefer,
		} {
			if !strings.Contains(stderr, want) {
				t.Errorf("create warnings lack %q:\n%s", want, stderr)
			}
		}
		if strings.Count(stderr, "Warning:") != 2 {
			t.Errorf("create warnings:\n%s", stderr)
		}
		// An update warns only about the finalizers it adds.
		_, stderr, err = kubectlBoth(h, "", "patch", "widget", "fin", "-n", "shop", "--type=json",
			"-p", `[{"op":"add","path":"/metadata/finalizers/-","value":"other"}]`)
		if err != nil {
			t.Fatalf("patch: %v\n%s", err, stderr)
		}
		want := `Warning: metadata.finalizers: "other"` + prefer + "\n"
		if !strings.Contains(stderr, want) || strings.Count(stderr, "Warning:") != 1 {
			t.Errorf("patch warnings:\n%s\nwant\n%s", stderr, want)
		}
		mustKubectl(t, h, "patch", "widget", "fin", "-n", "shop", "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
		mustKubectl(t, h, "delete", "widget", "fin", "-n", "shop")
	})

	t.Run("namespace deletion", func(t *testing.T) {
		mustKubectl(t, h, "create", "namespace", "gone")
		mustKubectlIn(t, h, widget("x", "gone", "{}"), "apply", "-f", "-")
		mustKubectl(t, h, "delete", "namespace", "gone", "--timeout=60s")
		l, err := dc.Resource(widgetGVR).Namespace("gone").List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 0 {
			t.Errorf("widgets left in a deleted namespace: %v %v", l, err)
		}
	})
}
