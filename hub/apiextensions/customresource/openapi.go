package customresource

import (
	"fmt"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/kube-openapi/pkg/schemamutation"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// openAPIDocs returns the builders of a version's published OpenAPI
// documents, as upstream's OpenAPI controllers build them: v2 with
// defaults pruned (they are dropped from the v2 document kubectl
// validates with), v3 as the schema says, both with selectable fields.
// Each document is built once, on first use; callers must not modify it,
// nor crd.
func openAPIDocs(crd *apiextensionsv1.CustomResourceDefinition, version string) (func() (*spec.Swagger, error), func() (*spec3.OpenAPI, error)) {
	v2 := sync.OnceValues(func() (*spec.Swagger, error) {
		s, err := builder.BuildOpenAPIV2(crd, version, builder.Options{V2: true, IncludeSelectableFields: true})
		if err != nil {
			return nil, fmt.Errorf("build OpenAPI v2 of %s %s: %w", crd.Name, version, err)
		}
		s.Definitions = pruneDefaults(s.Definitions)
		return s, nil
	})
	v3 := sync.OnceValues(func() (*spec3.OpenAPI, error) {
		s, err := builder.BuildOpenAPIV3(crd, version, builder.Options{V2: false, IncludeSelectableFields: true})
		if err != nil {
			return nil, fmt.Errorf("build OpenAPI v3 of %s %s: %w", crd.Name, version, err)
		}
		return s, nil
	})
	return v2, v3
}

// typeConverter returns the converter that managedFields and server-side
// apply use for the CRD's objects, from the OpenAPI v3 models of all its
// versions: it knows list-type, list-map-keys and map-type, so apply
// merges lists by their keys. As upstream, a CRD whose models cannot be
// built falls back to the deduced converter (every list atomic).
func typeConverter(crd *apiextensionsv1.CustomResourceDefinition) (managedfields.TypeConverter, error) {
	var specs []*spec3.OpenAPI
	for _, v := range crd.Spec.Versions {
		s, err := builder.BuildOpenAPIV3(crd, v.Name, builder.Options{})
		if err != nil {
			return managedfields.NewDeducedTypeConverter(), nil
		}
		specs = append(specs, s)
	}
	merged, err := builder.MergeSpecsV3(specs...)
	if err != nil || merged.Components == nil || len(merged.Components.Schemas) == 0 {
		return managedfields.NewDeducedTypeConverter(), nil
	}
	tc, err := managedfields.NewTypeConverter(merged.Components.Schemas, crd.Spec.PreserveUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("build type converter: %w", err)
	}
	return tc, nil
}

// pruneDefaults returns definitions without default values anywhere,
// leaving the input unchanged, as the v2 document upstream serves has
// them.
func pruneDefaults(defs spec.Definitions) spec.Definitions {
	w := &schemamutation.Walker{
		SchemaCallback: func(s *spec.Schema) *spec.Schema {
			if s.Default == nil {
				return s
			}
			c := *s
			c.Default = nil
			return &c
		},
		RefCallback: schemamutation.RefCallbackNoop,
	}
	out := make(spec.Definitions, len(defs))
	for name, s := range defs {
		out[name] = *w.WalkSchema(&s)
	}
	return out
}
