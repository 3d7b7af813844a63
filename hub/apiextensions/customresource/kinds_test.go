package customresource

import (
	"reflect"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func TestKindsDescribeEachServedVersion(t *testing.T) {
	kinds, err := Kinds(loadCRD(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(kinds) != 2 || kinds[0].GVK.Version != "v1" || kinds[1].GVK.Version != "v1beta1" {
		t.Fatalf("kinds: want v1 then v1beta1, got %d kinds", len(kinds))
	}
	v1GVK := schema.GroupVersionKind{Group: "example.tether.dev", Version: "v1", Kind: "Widget"}
	for _, k := range kinds {
		if k.Resource != "widgets" || k.Singular != "widget" || !k.Namespaced || !k.HasStatus || !k.HasSpec {
			t.Errorf("%s: names or shape wrong: %+v", k.GVK, k)
		}
		if !reflect.DeepEqual(k.ShortNames, []string{"wd"}) || !reflect.DeepEqual(k.Categories, []string{"all", "tether"}) {
			t.Errorf("%s: shortNames %v categories %v", k.GVK, k.ShortNames, k.Categories)
		}
		if !reflect.DeepEqual(k.PatchTypes, []types.PatchType{types.JSONPatchType, types.MergePatchType, types.ApplyYAMLPatchType}) {
			t.Errorf("%s: patch types %v", k.GVK, k.PatchTypes)
		}
		if !k.NoProtobuf || k.TypeConverter == nil || k.OpenAPIV2 == nil || k.OpenAPIV3 == nil || k.Prune == nil || k.DefaultOnRead == nil {
			t.Errorf("%s: missing custom resource hooks", k.GVK)
		}
		if k.GracefulDelete != nil || k.DefaultGC != metav1.DeletePropagationBackground || k.Verbs != nil {
			t.Errorf("%s: delete behaviour or verbs wrong", k.GVK)
		}
		o := k.New()
		u, ok := o.(*unstructured.Unstructured)
		if !ok || u.GroupVersionKind() != k.GVK {
			t.Errorf("%s: New returned %T %v", k.GVK, o, o.GetObjectKind().GroupVersionKind())
		}
		if msgs := k.NameRule("Not_A_Name", false); len(msgs) == 0 {
			t.Errorf("%s: name rule accepts Not_A_Name", k.GVK)
		}
		if msgs := k.NameRule("a.b-c", false); len(msgs) != 0 {
			t.Errorf("%s: name rule refuses a DNS subdomain: %v", k.GVK, msgs)
		}
	}
	v1, beta := kinds[0], kinds[1]
	if !v1.StoredAs.Empty() || v1.ToStorage != nil || v1.Deprecated {
		t.Errorf("v1 is the storage version and not deprecated: %+v", v1)
	}
	if v1.Scale == nil || beta.Scale != nil {
		t.Errorf("scale: v1 %v, v1beta1 %v", v1.Scale, beta.Scale)
	}
	if beta.StoredAs != v1GVK || beta.ToStorage == nil || beta.FromStorage == nil {
		t.Errorf("v1beta1 stored as %v", beta.StoredAs)
	}
	if !beta.Deprecated || beta.DeprecationWarning != "example.tether.dev/v1beta1 Widget is deprecated; use example.tether.dev/v1 Widget" {
		t.Errorf("v1beta1 deprecation: %v %q", beta.Deprecated, beta.DeprecationWarning)
	}
	if !reflect.DeepEqual(v1.FieldLabels, []string{"spec.mode", "spec.replicas"}) || beta.FieldLabels != nil {
		t.Errorf("field labels: v1 %v, v1beta1 %v", v1.FieldLabels, beta.FieldLabels)
	}
}

func TestKindsNamesScopeAndVersions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*apiextensionsv1.CustomResourceDefinition)
		check  func(t *testing.T, versions []string, crd *apiextensionsv1.CustomResourceDefinition)
		err    bool
	}{{
		name: "accepted names win over the requested ones",
		modify: func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Status.AcceptedNames = apiextensionsv1.CustomResourceDefinitionNames{Plural: "gadgets", Kind: "Gadget", ShortNames: []string{"gd"}}
		},
		check: func(t *testing.T, _ []string, c *apiextensionsv1.CustomResourceDefinition) {
			ks, _ := Kinds(c)
			if ks[0].Resource != "gadgets" || ks[0].Singular != "gadget" || ks[0].GVK.Kind != "Gadget" || ks[0].ShortNames[0] != "gd" {
				t.Errorf("names: %s %s %s %v", ks[0].Resource, ks[0].Singular, ks[0].GVK.Kind, ks[0].ShortNames)
			}
		},
	}, {
		name:   "cluster scope",
		modify: func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Scope = apiextensionsv1.ClusterScoped },
		check: func(t *testing.T, _ []string, c *apiextensionsv1.CustomResourceDefinition) {
			ks, _ := Kinds(c)
			for _, k := range ks {
				if k.Namespaced {
					t.Errorf("%s is namespaced", k.GVK)
				}
			}
		},
	}, {
		name:   "a version that is not served has no kind",
		modify: func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[0].Served = false },
		check: func(t *testing.T, versions []string, _ *apiextensionsv1.CustomResourceDefinition) {
			if !reflect.DeepEqual(versions, []string{"v1"}) {
				t.Errorf("versions %v", versions)
			}
		},
	}, {
		name:   "an unserved storage version holds the objects and is not served",
		modify: func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Served = false },
		check: func(t *testing.T, versions []string, c *apiextensionsv1.CustomResourceDefinition) {
			ks, _ := Kinds(c)
			if len(ks) != 2 || !ks[0].NotServed || ks[1].NotServed || ks[1].StoredAs != ks[0].GVK {
				t.Errorf("versions %v", versions)
			}
		},
	}, {
		name: "a version's own deprecation warning",
		modify: func(c *apiextensionsv1.CustomResourceDefinition) {
			w := "widgets/v1beta1 goes away in 2027"
			c.Spec.Versions[0].DeprecationWarning = &w
		},
		check: func(t *testing.T, _ []string, c *apiextensionsv1.CustomResourceDefinition) {
			ks, _ := Kinds(c)
			if ks[1].DeprecationWarning != "widgets/v1beta1 goes away in 2027" {
				t.Errorf("warning %q", ks[1].DeprecationWarning)
			}
		},
	}, {
		name:   "no storage version",
		modify: func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Storage = false },
		err:    true,
	}, {
		name: "a schema that cannot be made structural",
		modify: func(c *apiextensionsv1.CustomResourceDefinition) {
			s := c.Spec.Versions[1].Schema.OpenAPIV3Schema.Properties["spec"]
			p := s.Properties["image"]
			ref := "#/definitions/io.k8s.api.core.v1.Container"
			p.Ref = &ref
			s.Properties["image"] = p
			c.Spec.Versions[1].Schema.OpenAPIV3Schema.Properties["spec"] = s
		},
		err: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			crd := loadCRD(t)
			tc.modify(crd)
			ks, err := Kinds(crd)
			if tc.err {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var versions []string
			for _, k := range ks {
				versions = append(versions, k.GVK.Version)
			}
			tc.check(t, versions, crd)
		})
	}
}

func TestConversionRewritesAPIVersionAndPrunes(t *testing.T) {
	beta := widgetKinds(t)["v1beta1"]
	in := obj(t, `
apiVersion: example.tether.dev/v1beta1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, replicas: 2}
`)
	stored, err := beta.ToStorage(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := stored.(*unstructured.Unstructured).GetAPIVersion(); got != "example.tether.dev/v1" {
		t.Errorf("stored apiVersion %s", got)
	}
	if in.GetAPIVersion() != "example.tether.dev/v1beta1" {
		t.Errorf("ToStorage changed its input")
	}
	// A stored object is decoded as upstream's storage decoder does, with
	// the storage version's defaults (spec.mode, spec.minReplicas), then
	// converted: what v1beta1 does not declare is pruned on the way out.
	v1obj := obj(t, `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, email: a@b.c}
status: {phase: Ready}
`)
	out, err := beta.FromStorage(v1obj)
	if err != nil {
		t.Fatal(err)
	}
	want := obj(t, `
apiVersion: example.tether.dev/v1beta1
kind: Widget
metadata: {name: w, namespace: default, generation: 1}
spec: {image: nginx, replicas: 1}
status: {phase: Ready}
`)
	got := out.(*unstructured.Unstructured)
	if !reflect.DeepEqual(got.Object, want.Object) {
		t.Errorf("FromStorage:\n got %v\nwant %v", got.Object, want.Object)
	}
	if _, found := v1obj.Object["spec"].(map[string]any)["mode"]; found {
		t.Errorf("FromStorage changed its input")
	}
	// Read through v1beta1, the converted object is not defaulted again.
	beta.DefaultOnRead(got)
	if !reflect.DeepEqual(got.Object, want.Object) {
		t.Errorf("DefaultOnRead after FromStorage:\n got %v\nwant %v", got.Object, want.Object)
	}
}

func TestOpenAPIDocuments(t *testing.T) {
	k := widgetKinds(t)["v1"]
	v2, err := k.OpenAPIV2()
	if err != nil {
		t.Fatal(err)
	}
	def, ok := v2.Definitions["dev.tether.example.v1.Widget"]
	if !ok {
		t.Fatalf("v2 definitions: %v", keys(v2.Definitions))
	}
	spec := def.Properties["spec"]
	if spec.Properties["replicas"].Default != nil {
		t.Errorf("v2 keeps a default: %v", spec.Properties["replicas"].Default)
	}
	if _, ok := v2.Paths.Paths["/apis/example.tether.dev/v1/namespaces/{namespace}/widgets/{name}/scale"]; !ok {
		t.Errorf("v2 has no scale path")
	}
	gvks, _ := def.Extensions["x-kubernetes-group-version-kind"].([]any)
	if len(gvks) != 1 {
		t.Errorf("v2 group-version-kind: %v", def.Extensions)
	}
	v3, err := k.OpenAPIV3()
	if err != nil {
		t.Fatal(err)
	}
	s3, ok := v3.Components.Schemas["dev.tether.example.v1.Widget"]
	if !ok {
		t.Fatalf("v3 schemas: %v", v3.Components.Schemas)
	}
	if d := s3.Properties["spec"].Properties["replicas"].Default; d == nil {
		t.Errorf("v3 lost the default")
	}
	if lt := s3.Properties["spec"].Properties["ports"].Extensions["x-kubernetes-list-type"]; lt != "map" {
		t.Errorf("v3 list type %v", lt)
	}
	if sf := s3.Extensions["x-kubernetes-selectable-fields"]; sf == nil {
		t.Errorf("v3 has no selectable fields: %v", s3.Extensions)
	}
	// Built once: a second call returns the same document.
	again, _ := k.OpenAPIV3()
	if again != v3 {
		t.Errorf("v3 built again")
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
