package customresource

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/managedfields/managedfieldstest"
)

// TestApplyMergesByListMapKeys applies two managers' configurations
// through the kinds' TypeConverter: lists of type map merge by their keys
// and sets by value, so each manager keeps its own entries; an atomic map
// belongs to its last applier.
func TestApplyMergesByListMapKeys(t *testing.T) {
	k := widgetKinds(t)["v1"]
	fm := managedfieldstest.NewTestFieldManager(k.TypeConverter, k.GVK)
	apply := func(manager, y string) {
		t.Helper()
		if err := fm.Apply(obj(t, y), manager, false); err != nil {
			t.Fatalf("apply by %s: %v", manager, err)
		}
	}
	apply("web", `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec:
  image: nginx
  ports: [{name: http, port: 80}]
  tags: [web]
  selectorLabels: {app: w}
`)
	apply("metrics", `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec:
  ports: [{name: metrics, port: 9090}]
  tags: [metrics]
`)
	live := fm.Live().(*unstructured.Unstructured)
	ports, _, _ := unstructured.NestedSlice(live.Object, "spec", "ports")
	want := []any{
		map[string]any{"name": "http", "port": int64(80)},
		map[string]any{"name": "metrics", "port": int64(9090)},
	}
	if !reflect.DeepEqual(ports, want) {
		t.Errorf("ports: got %v, want %v", ports, want)
	}
	tags, _, _ := unstructured.NestedStringSlice(live.Object, "spec", "tags")
	if !reflect.DeepEqual(tags, []string{"web", "metrics"}) {
		t.Errorf("tags: %v", tags)
	}

	// A second manager changing the first one's entry conflicts.
	err := fm.Apply(obj(t, `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec:
  ports: [{name: http, port: 8080}]
`), "metrics", false)
	if err == nil {
		t.Fatal("a conflicting apply succeeded")
	}
	if want := `Apply failed with 1 conflict: conflict with "web": .spec.ports[name="http"].port`; err.Error() != want {
		t.Errorf("conflict: got %q, want %q", err.Error(), want)
	}

	// The deduced converter, which knows no list types, makes the list
	// atomic: that is what the schema-built converter avoids.
	deduced := managedfieldstest.NewTestFieldManager(managedfields.NewDeducedTypeConverter(), k.GVK)
	if err := deduced.Apply(obj(t, `{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: w, namespace: default}, spec: {ports: [{name: http}]}}`), "web", false); err != nil {
		t.Fatal(err)
	}
	if err := deduced.Apply(obj(t, `{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: w, namespace: default}, spec: {ports: [{name: metrics}]}}`), "metrics", false); err == nil {
		t.Errorf("the deduced converter merged a list")
	}
}
