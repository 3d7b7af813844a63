package customresource

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"sigs.k8s.io/yaml"
)

// walkSchemas are the schemas the shortcuts past apiextensions' walks
// and validator are checked against: the benchmark's, and one of many
// keywords and extensions beside the test CRD's versions (which have
// every extension).
var walkSchemas = map[string]string{
	"record": `
type: object
properties:
  spec:
    type: object
    properties:
      data:
        type: object
        additionalProperties: {type: string}
`,
	"keywords": `
type: object
required: [spec]
properties:
  apiVersion: {type: string}
  kind: {type: string}
  metadata: {type: object}
  spec:
    type: object
    required: [name]
    minProperties: 1
    maxProperties: 10
    properties:
      name: {type: string, minLength: 2, maxLength: 4}
      count: {type: integer}
      ratio: {type: number}
      on: {type: boolean}
      maybe: {type: object, nullable: true, properties: {a: {type: string}}}
      list:
        type: array
        minItems: 1
        maxItems: 3
        items: {type: integer}
      closed:
        type: object
        additionalProperties: false
        properties: {x: {type: integer}}
      open:
        type: object
        additionalProperties: true
      anything:
        x-kubernetes-preserve-unknown-fields: true
      port:
        x-kubernetes-int-or-string: true
      objects:
        type: array
        items:
          type: object
          properties:
            k: {type: string}
          additionalProperties: {type: integer}
  status:
    type: object
    x-kubernetes-preserve-unknown-fields: true
    properties:
      phase: {type: string}
      history:
        type: array
        x-kubernetes-preserve-unknown-fields: true
        items:
          type: object
          properties:
            at: {type: object, properties: {t: {type: string}}}
`,
}

// testSchema converts a v1 schema to what newCRDSchemas builds from it:
// the structural schema and the OpenAPI schema with its validator.
func testSchema(t testing.TB, name, src string) (*structuralschema.Structural, *spec.Schema, apiservervalidation.SchemaValidator) {
	t.Helper()
	v1 := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{}}
	if err := yaml.UnmarshalStrict([]byte(src), v1.OpenAPIV3Schema); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	internal := &apiextensions.CustomResourceValidation{}
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(v1, internal, nil); err != nil {
		t.Fatal(err)
	}
	s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	validator, openAPI, err := apiservervalidation.NewSchemaValidator(internal.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	return s, openAPI, validator
}

// allTestSchemas returns walkSchemas and the test CRD's version schemas,
// by name.
func allTestSchemas(t testing.TB) map[string]string {
	out := map[string]string{}
	for name, src := range walkSchemas {
		out[name] = src
	}
	for _, v := range loadCRD(t).Spec.Versions {
		b, err := yaml.Marshal(v.Schema.OpenAPIV3Schema)
		if err != nil {
			t.Fatal(err)
		}
		out["widget-"+v.Name] = string(b)
	}
	return out
}

// valueFor returns a value for schema s: mostly one s allows, sometimes
// one of another type, a null, a missing required field or a field s
// does not declare, so that both answers of quickCheck and of the walks
// come up.
// noise is the chance in 1000 of each value being off the schema.
func valueFor(r *rand.Rand, s *spec.Schema, noise, depth int) any {
	if s == nil || r.IntN(1000) < noise || depth > 6 {
		return anyValue(r, depth)
	}
	t := ""
	if len(s.Type) > 0 {
		t = s.Type[r.IntN(len(s.Type))]
	} else if len(s.Properties) > 0 {
		t = "object"
	}
	switch t {
	case "string":
		return strings.Repeat(string([]rune{'a', 'é', '世'}[r.IntN(3)]), r.IntN(6))
	case "integer":
		return int64(r.IntN(20) - 5)
	case "number":
		if r.IntN(2) == 0 {
			return int64(r.IntN(9))
		}
		return r.Float64() * 10
	case "boolean":
		return r.IntN(2) == 0
	case "array":
		l := make([]any, r.IntN(5))
		var items *spec.Schema
		if s.Items != nil {
			items = s.Items.Schema
		}
		for i := range l {
			l[i] = valueFor(r, items, noise, depth+1)
		}
		return l
	case "object":
		m := map[string]any{}
		for name := range s.Properties {
			// Optional fields half the time, required ones but for noise.
			if slices.Contains(s.Required, name) && r.IntN(1000) >= noise || r.IntN(2) == 0 {
				p := s.Properties[name]
				m[name] = valueFor(r, &p, noise, depth+1)
			}
		}
		for i := range r.IntN(3) {
			var ap *spec.Schema
			if s.AdditionalProperties != nil {
				ap = s.AdditionalProperties.Schema
			}
			if ap != nil || r.IntN(1000) < noise {
				m[fmt.Sprintf("extra%d", i)] = valueFor(r, ap, noise, depth+1)
			}
		}
		return m
	}
	return anyValue(r, depth)
}

// anyValue returns a value of any JSON type, or one decoding never makes.
func anyValue(r *rand.Rand, depth int) any {
	n := 9
	if depth > 6 {
		n = 6
	}
	switch r.IntN(n) {
	case 0:
		return nil
	case 1:
		return "s"
	case 2:
		return int64(3)
	case 3:
		return 2.5
	case 4:
		return true
	case 5:
		return int32(1)
	case 6:
		return []any{anyValue(r, depth+1)}
	default:
		return map[string]any{"k": anyValue(r, depth+1), "metadata": anyValue(r, depth+1)}
	}
}

// TestShapeTellsWhatTheWalksDo checks, on many objects per schema, that
// wouldPrune says whether pruning changes the object, and that each walk
// a shape leaves out (nulls without a null, defaulting without defaults,
// embedded resources and list types without any) changes and reports
// nothing.
func TestShapeTellsWhatTheWalksDo(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ctx := context.Background()
	for name, src := range allTestSchemas(t) {
		s, openAPI, _ := testSchema(t, name, src)
		sh := newShape(s)
		var pruned, kept int
		for i := range 3000 {
			v, ok := valueFor(r, openAPI, []int{20, 150}[i%2], 0).(map[string]any)
			if !ok {
				continue
			}
			if r.IntN(2) == 0 {
				v["apiVersion"], v["kind"] = "x/v1", "X"
				v["metadata"] = map[string]any{"name": "a", "labels": map[string]any{"b": "c"}}
			}
			if r.IntN(4) == 0 {
				v["unknown"] = anyValue(r, 0)
			}
			pruneJSON(t, v)
			got := runtime.DeepCopyJSON(v)
			structuralpruning.Prune(got, s, true)
			changed := !equality.Semantic.DeepEqual(got, v)
			if sh.wouldPrune(v) != changed {
				t.Fatalf("%s: wouldPrune says %v, pruning changes %#v: %v", name, !changed, v, changed)
			}
			if changed {
				pruned++
			} else {
				kept++
			}
			if !hasNull(got) {
				c := runtime.DeepCopyJSON(got)
				structuraldefaulting.PruneNonNullableNullsWithoutDefaults(c, s)
				if !equality.Semantic.DeepEqual(c, got) {
					t.Fatalf("%s: removing nulls changes %#v, which has none", name, got)
				}
			}
			if !sh.mayDefault() {
				c := runtime.DeepCopyJSON(got)
				structuraldefaulting.Default(c, s)
				if !equality.Semantic.DeepEqual(c, got) {
					t.Fatalf("%s: defaulting changes %#v without defaults", name, got)
				}
			}
			if !sh.hasEmbedded() {
				c := runtime.DeepCopyJSON(got)
				ferr, paths := schemaobjectmeta.CoerceWithOptions(nil, c, s, false, schemaobjectmeta.CoerceOptions{ReturnUnknownFieldPaths: true})
				if ferr != nil || len(paths) > 0 || !equality.Semantic.DeepEqual(c, got) {
					t.Fatalf("%s: coercing embedded resources of %#v without any: %v %v", name, got, ferr, paths)
				}
				if errs := schemaobjectmeta.Validate(ctx, nil, got, s, false); len(errs) > 0 {
					t.Fatalf("%s: embedded resources of %#v without any: %v", name, got, errs)
				}
			}
			if !sh.hasListSetsOrMaps() {
				if errs := structurallisttype.ValidateListSetsAndMaps(nil, s, got); len(errs) > 0 {
					t.Fatalf("%s: list types of %#v without any: %v", name, got, errs)
				}
			}
		}
		t.Logf("%s: %d objects pruned, %d kept", name, pruned, kept)
		if pruned < 100 || kept < 100 {
			t.Errorf("%s: %d objects pruned, %d kept: the objects do not exercise both answers", name, pruned, kept)
		}
	}
}

// pruneJSON replaces the values decoding never makes (anyValue's int32)
// with ones it does: the walks are only ever given decoded objects.
func pruneJSON(t *testing.T, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, c := range v {
			if _, ok := c.(int32); ok {
				v[k] = int64(1)
				continue
			}
			pruneJSON(t, c)
		}
	case []any:
		for i, c := range v {
			if _, ok := c.(int32); ok {
				v[i] = int64(1)
				continue
			}
			pruneJSON(t, c)
		}
	}
}

// TestShapeOfSchemas checks what shapes record for the test schemas.
func TestShapeOfSchemas(t *testing.T) {
	schemas := allTestSchemas(t)
	for _, c := range []struct {
		name                            string
		defaults, embedded, listsOrMaps bool
	}{
		{"record", false, false, false},
		{"keywords", false, false, false},
		{"widget-v1", true, true, true},
		{"widget-v1beta1", true, false, false},
	} {
		s, _, _ := testSchema(t, c.name, schemas[c.name])
		sh := newShape(s)
		if sh.defaults != c.defaults || sh.embedded != c.embedded || sh.listSetsOrMaps != c.listsOrMaps {
			t.Errorf("%s: defaults %v, embedded %v, list sets or maps %v; want %v, %v, %v", c.name,
				sh.defaults, sh.embedded, sh.listSetsOrMaps, c.defaults, c.embedded, c.listsOrMaps)
		}
	}
	var none *shape
	if !none.wouldPrune(map[string]any{}) || !none.mayDefault() || !none.hasEmbedded() || !none.hasListSetsOrMaps() {
		t.Error("a nil shape leaves a walk out")
	}
}
