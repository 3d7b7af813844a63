package customresource

import (
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
)

func TestTableColumnsAndCells(t *testing.T) {
	ks := widgetKinds(t)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	u := obj(t, validWidget)
	u.SetCreationTimestamp(metav1.NewTime(now.Add(-90 * time.Minute)))
	u.Object["status"] = map[string]any{"phase": "Ready"}

	for _, tc := range []struct {
		version string
		columns []metav1.TableColumnDefinition
		cells   []any
	}{{
		version: "v1",
		columns: []metav1.TableColumnDefinition{
			{Name: "Name", Type: "string", Format: "name", Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
			{Name: "Image", Type: "string", Description: "Custom resource definition column (in JSONPath format): .spec.image"},
			{Name: "Replicas", Type: "integer", Description: "Custom resource definition column (in JSONPath format): .spec.replicas"},
			{Name: "Phase", Type: "string", Priority: 1, Description: "The phase the widget is in."},
			{Name: "Age", Type: "date", Description: "Custom resource definition column (in JSONPath format): .metadata.creationTimestamp"},
		},
		cells: []any{"w", "nginx", int64(3), "Ready", "90m"},
	}, {
		// Without printer columns: Name and Age, as upstream's default.
		version: "v1beta1",
		columns: []metav1.TableColumnDefinition{
			{Name: "Name", Type: "string", Format: "name", Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
			{Name: "Age", Type: "date", Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]},
		},
		cells: []any{"w", "90m"},
	}} {
		t.Run(tc.version, func(t *testing.T) {
			k := ks[tc.version]
			if !reflect.DeepEqual(k.Columns, tc.columns) {
				t.Errorf("columns:\n got %+v\nwant %+v", k.Columns, tc.columns)
			}
			if got := k.Cells(u, now); !reflect.DeepEqual(got, tc.cells) {
				t.Errorf("cells: got %#v, want %#v", got, tc.cells)
			}
		})
	}

	// A missing value is an empty cell.
	bare := obj(t, `{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: b}}`)
	if got := ks["v1"].Cells(bare, now); !reflect.DeepEqual(got, []any{"b", nil, nil, nil, nil}) {
		t.Errorf("cells of a bare object: %#v", got)
	}
}

func TestSelectableFields(t *testing.T) {
	k := widgetKinds(t)["v1"]
	for _, tc := range []struct {
		name string
		obj  *unstructured.Unstructured
		want fields.Set
	}{
		{"set", obj(t, validWidget), fields.Set{"spec.mode": "Fast", "spec.replicas": "3"}},
		{"absent", withSpec(t, map[string]any{"mode": nil, "replicas": nil}), fields.Set{"spec.mode": "", "spec.replicas": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := k.Fields(tc.obj); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("fields: got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestScaleReadsAndWritesThePaths(t *testing.T) {
	k := widgetKinds(t)["v1"]
	u := obj(t, validWidget)
	u.Object["status"] = map[string]any{"replicas": int64(2), "selector": "app=w"}
	spec, status, sel := k.Scale.Get(u)
	if spec != 3 || status != 2 || sel != "app=w" {
		t.Errorf("scale: %d %d %q", spec, status, sel)
	}
	k.Scale.Set(u, 7)
	if got, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas"); got != 7 {
		t.Errorf("spec.replicas after Set: %d", got)
	}
	if spec, status, sel := k.Scale.Get(obj(t, `{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: b}}`)); spec != 0 || status != 0 || sel != "" {
		t.Errorf("scale of a bare object: %d %d %q", spec, status, sel)
	}
}
