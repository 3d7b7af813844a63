package customresource

import (
	"fmt"
	"maps"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

// crdSchemas holds what every version of one CRD needs from the schemas:
// the structural schema of each version (objects are pruned and
// defaulted by the schema of the version they are in) and the
// validators of each version.
type crdSchemas struct {
	gk schema.GroupKind
	// storageVersion is the version objects are stored in.
	storageVersion string
	// preserveUnknownFields is spec.preserveUnknownFields: nothing is
	// pruned (only possible for CRDs from apiextensions.k8s.io/v1beta1).
	preserveUnknownFields bool
	// structural is each version's structural schema with defaults
	// pruned, nil for a version without schema.
	structural map[string]*structuralschema.Structural
	// shapes is what each version's structural schema can make the
	// walks over an object do (see shape).
	shapes   map[string]*shape
	versions map[string]*versionSchema
}

// versionSchema holds the validators of one version.
type versionSchema struct {
	name       string
	structural *structuralschema.Structural
	shape      *shape
	// validator checks the whole object against the OpenAPI schema
	// (types, formats, enums, bounds); statusValidator checks status
	// alone against the schema's status property, for /status writes.
	validator       apiservervalidation.SchemaValidator
	statusValidator apiservervalidation.SchemaValidator
	// quick and statusQuick tell, for most valid objects, that the
	// validators would find nothing (see quickCheck).
	quick, statusQuick *quickCheck
	// cel evaluates the x-kubernetes-validations rules; nil without any.
	cel *cel.Validator
	// statusSubresource: the version serves /status.
	statusSubresource bool
	// scale is the version's scale subresource, nil without one.
	scale *apiextensionsv1.CustomResourceSubresourceScale
}

// newCRDSchemas converts each version's schema to its structural form and
// builds its validators, as upstream's handler does when it starts
// serving a CRD.
func newCRDSchemas(crd *apiextensionsv1.CustomResourceDefinition, storageVersion string) (*crdSchemas, error) {
	c := &crdSchemas{
		gk:                    schema.GroupKind{Group: crd.Spec.Group, Kind: acceptedNames(crd).Kind},
		storageVersion:        storageVersion,
		preserveUnknownFields: crd.Spec.PreserveUnknownFields,
		structural:            map[string]*structuralschema.Structural{},
		shapes:                map[string]*shape{},
		versions:              map[string]*versionSchema{},
	}
	for i := range crd.Spec.Versions {
		v := &crd.Spec.Versions[i]
		vs := &versionSchema{name: v.Name}
		if v.Subresources != nil {
			vs.scale = v.Subresources.Scale
			vs.statusSubresource = v.Subresources.Status != nil
		}
		var props *apiextensions.JSONSchemaProps
		if v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
			internal := &apiextensions.CustomResourceValidation{}
			if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(v.Schema, internal, nil); err != nil {
				return nil, fmt.Errorf("convert schema of version %s: %w", v.Name, err)
			}
			props = internal.OpenAPIV3Schema
			s, err := structuralschema.NewStructural(props)
			if err != nil && !crd.Spec.PreserveUnknownFields {
				return nil, fmt.Errorf("build structural schema of version %s: %w", v.Name, err)
			}
			if s != nil && !crd.Spec.PreserveUnknownFields {
				s = s.DeepCopy()
				if err := structuraldefaulting.PruneDefaults(s); err != nil {
					return nil, fmt.Errorf("prune defaults of version %s: %w", v.Name, err)
				}
			}
			vs.structural = s
		}
		c.structural[v.Name] = vs.structural
		vs.shape = newShape(vs.structural)
		c.shapes[v.Name] = vs.shape
		validator, openAPISchema, err := apiservervalidation.NewSchemaValidator(props)
		if err != nil {
			return nil, fmt.Errorf("build schema validator of version %s: %w", v.Name, err)
		}
		vs.validator, vs.quick = validator, newQuickCheck(openAPISchema)
		if v.Subresources != nil && v.Subresources.Status != nil && props != nil && props.Properties != nil {
			if status, ok := props.Properties["status"]; ok {
				validator, openAPISchema, err := apiservervalidation.NewSchemaValidator(&status)
				if err != nil {
					return nil, fmt.Errorf("build status validator of version %s: %w", v.Name, err)
				}
				vs.statusValidator, vs.statusQuick = validator, newQuickCheck(openAPISchema)
			}
		}
		if vs.structural != nil {
			// Compiles the rules once; a rule that does not compile
			// reports its error on every validation, as upstream.
			vs.cel = cel.NewValidator(vs.structural, true, celconfig.PerCallLimit)
		}
		c.versions[v.Name] = vs
	}
	return c, nil
}

// version returns the schemas of a version.
func (c *crdSchemas) version(name string) (*versionSchema, error) {
	vs := c.versions[name]
	if vs == nil {
		return nil, fmt.Errorf("no version %q", name)
	}
	return vs, nil
}

// coerceOptions selects what coerce does beyond pruning.
type coerceOptions struct {
	// dropInvalidMetadata drops malformed ObjectMeta fields instead of
	// failing (objects read from storage).
	dropInvalidMetadata bool
	// repairGeneration sets a missing generation to 1 (objects read from
	// storage).
	repairGeneration bool
	// trackUnknown returns the paths of what was pruned.
	trackUnknown bool
}

// coerce does to a custom object what decoding into a Go type does to a
// built-in one, as upstream's schema coercer: ObjectMeta is read as
// metav1.ObjectMeta (unknown and, when asked, malformed fields dropped),
// fields the schema of the object's version does not declare are pruned,
// nulls the schema neither allows nor defaults are removed, and embedded
// resources' metadata is coerced likewise. It returns the pruned paths
// ("spec.foo", "metadata.bar") when asked. Objects of another group or
// kind are left alone.
func (c *crdSchemas) coerce(u *unstructured.Unstructured, opts coerceOptions) ([]string, error) {
	kind, foundKind, err := unstructured.NestedString(u.Object, "kind")
	if err != nil {
		return nil, err
	}
	apiVersion, foundAPIVersion, err := unstructured.NestedString(u.Object, "apiVersion")
	if err != nil {
		return nil, err
	}
	// Metadata the round trip through ObjectMeta leaves as it is keeps
	// its map; pruning and coercion below do not enter it.
	metadata, asIs := u.Object["metadata"], roundTripsAsIs(u.Object["metadata"])
	var objectMeta *metav1.ObjectMeta
	var foundObjectMeta bool
	var unknown []string
	if !asIs {
		objectMeta, foundObjectMeta, unknown, err = schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{
			DropMalformedFields:     opts.dropInvalidMetadata,
			ReturnUnknownFieldPaths: opts.trackUnknown,
		})
		if err != nil {
			return nil, err
		}
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, err
	}
	if gv.Group == c.gk.Group && kind == c.gk.Kind {
		// A version the CRD does not have has neither schema nor
		// shape: every walk runs.
		s, sh := c.structural[gv.Version], c.shapes[gv.Version]
		if !c.preserveUnknownFields {
			if sh.wouldPrune(u.Object) {
				unknown = append(unknown, structuralpruning.PruneWithOptions(u.Object, s, true,
					structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: opts.trackUnknown})...)
			}
			if hasNull(u.Object) {
				structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, s)
			}
		}
		if sh.hasEmbedded() {
			ferr, paths := schemaobjectmeta.CoerceWithOptions(nil, u.Object, s, false, schemaobjectmeta.CoerceOptions{
				DropInvalidFields:       opts.dropInvalidMetadata,
				ReturnUnknownFieldPaths: opts.trackUnknown,
			})
			if ferr != nil {
				return nil, ferr
			}
			unknown = append(unknown, paths...)
		}
		if opts.repairGeneration && objectMeta != nil && objectMeta.Generation == 0 {
			objectMeta.Generation = 1
		}
		if opts.repairGeneration && asIs {
			if _, ok := metadata.(map[string]any)["generation"]; !ok {
				// As the round trip would write it, in a map of its own.
				m := maps.Clone(metadata.(map[string]any))
				m["generation"] = int64(1)
				metadata = m
			}
		}
	}
	if foundKind {
		u.SetKind(kind)
	}
	if foundAPIVersion {
		u.SetAPIVersion(apiVersion)
	}
	if asIs {
		u.Object["metadata"] = metadata
	} else if foundObjectMeta {
		if err := schemaobjectmeta.SetObjectMeta(u.Object, objectMeta); err != nil {
			return nil, err
		}
	}
	return unknown, nil
}

// defaults applies the structural defaults of the object's version.
func (c *crdSchemas) defaults(u *unstructured.Unstructured) {
	gvk := u.GroupVersionKind()
	if gvk.GroupKind() != c.gk {
		return
	}
	if s := c.structural[gvk.Version]; s != nil && c.shapes[gvk.Version].mayDefault() {
		structuraldefaulting.Default(u.Object, s)
	}
}

// decodeStored does to an object read from storage, while it is still in
// the storage version, what upstream's storage decoder does: malformed
// metadata is dropped, a missing generation becomes 1, fields the schema
// no longer declares are pruned, and the storage version's defaults are
// applied. An object in another version (already converted) is left
// alone.
func (c *crdSchemas) decodeStored(u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	if gvk.GroupKind() != c.gk || gvk.Version != c.storageVersion {
		return nil
	}
	if _, err := c.coerce(u, coerceOptions{dropInvalidMetadata: true, repairGeneration: true}); err != nil {
		return err
	}
	c.defaults(u)
	return nil
}

// toStorage returns the conversion (strategy None) of an object to the
// storage version: a copy with apiVersion rewritten, pruned by the
// storage version's schema as upstream's converter does.
func (c *crdSchemas) toStorage() func(runtime.Object) (runtime.Object, error) {
	return c.convert(c.storageVersion, false)
}

// fromStorage returns the conversion of a stored object to version to:
// the stored object decoded as upstream's storage decoder does (with the
// storage version's defaults), then converted as toStorage does.
func (c *crdSchemas) fromStorage(to string) func(runtime.Object) (runtime.Object, error) {
	return c.convert(to, true)
}

func (c *crdSchemas) convert(to string, stored bool) func(runtime.Object) (runtime.Object, error) {
	gv := schema.GroupVersion{Group: c.gk.Group, Version: to}.String()
	return func(obj runtime.Object) (runtime.Object, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return nil, fmt.Errorf("convert %s to %s: got %T, not unstructured", c.gk, gv, obj)
		}
		out := u.DeepCopy()
		if stored {
			if err := c.decodeStored(out); err != nil {
				return nil, fmt.Errorf("convert %s to %s: %w", c.gk, gv, err)
			}
		}
		out.SetAPIVersion(gv)
		if _, err := c.coerce(out, coerceOptions{}); err != nil {
			return nil, fmt.Errorf("convert %s to %s: %w", c.gk, gv, err)
		}
		return out, nil
	}
}
