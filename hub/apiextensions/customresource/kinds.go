// Package customresource turns a CustomResourceDefinition into the
// registry kinds that serve its custom resources: one kind per served
// version, each describing how the objects of that version behave as
// kube-apiserver's apiextensions server makes them behave.
//
// Everything that depends on the schema comes from
// k8s.io/apiextensions-apiserver's own packages: the structural schema,
// pruning, defaulting, embedded ObjectMeta coercion and validation, list
// type invariants, OpenAPI schema validation (format, enum, types),
// x-kubernetes-validations CEL rules with transition rules and ratcheting,
// printer columns and the OpenAPI documents. Objects are
// *unstructured.Unstructured throughout.
//
// Conversion between versions is strategy None: every served version is
// stored as the storage version, and converting only rewrites apiVersion
// (then prunes by the target version's schema, as upstream's converter
// does).
package customresource

import (
	"fmt"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"

	"github.com/tether-edge/tether/hub/registry"
)

// patchTypes are the patch types served for custom resources: JSON patch,
// merge patch and server-side apply; strategic merge needs Go types and is
// refused with 415, as upstream.
var patchTypes = []types.PatchType{types.JSONPatchType, types.MergePatchType, types.ApplyYAMLPatchType}

// Kinds returns one registry.Kind per served version of crd, the highest
// version first (kube-aware version order, as discovery lists them).
// The storage version's kind stores the objects; the other versions are
// stored as it (StoredAs), with ToStorage and FromStorage rewriting
// apiVersion for conversion strategy None. Each kind carries the
// version's structural-schema validation, pruning, defaulting on write
// and on read, CEL x-kubernetes-validations (transition rules included),
// status and scale subresources, printer columns, selectable fields,
// the type converter for managedFields and server-side apply, and the
// version's OpenAPI v2 and v3 documents.
//
// Names come from status.acceptedNames once the CRD's names are accepted,
// from spec.names before. A CRD whose storage version is not served
// still gets a kind for its storage version (it holds the objects),
// marked NotServed.
func Kinds(crd *apiextensionsv1.CustomResourceDefinition) ([]*registry.Kind, error) {
	if crd == nil {
		return nil, fmt.Errorf("build custom resource kinds: no CustomResourceDefinition")
	}
	// The kinds keep parts of the definition (scale paths, columns,
	// the OpenAPI source): they get a copy the caller cannot change.
	crd = crd.DeepCopy()
	storageVersion := ""
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storageVersion = v.Name
			break
		}
	}
	if storageVersion == "" {
		return nil, fmt.Errorf("build kinds of %s: no storage version", crd.Name)
	}
	c, err := newCRDSchemas(crd, storageVersion)
	if err != nil {
		return nil, fmt.Errorf("build kinds of %s: %w", crd.Name, err)
	}
	names := acceptedNames(crd)
	tc, err := typeConverter(crd)
	if err != nil {
		return nil, fmt.Errorf("build kinds of %s: %w", crd.Name, err)
	}
	storageGVK := schema.GroupVersionKind{Group: crd.Spec.Group, Version: storageVersion, Kind: names.Kind}

	var kinds []*registry.Kind
	for i := range crd.Spec.Versions {
		v := &crd.Spec.Versions[i]
		if !v.Served && !v.Storage {
			continue
		}
		k, err := newKind(crd, c, names, v)
		if err != nil {
			return nil, fmt.Errorf("build kinds of %s: version %s: %w", crd.Name, v.Name, err)
		}
		k.TypeConverter = tc
		if !v.Served {
			k.NotServed = true
		}
		if v.Name != storageVersion {
			k.StoredAs = storageGVK
			k.ToStorage = c.toStorage()
			k.FromStorage = c.fromStorage(v.Name)
		}
		kinds = append(kinds, k)
	}
	sort.SliceStable(kinds, func(i, j int) bool {
		return version.CompareKubeAwareVersionStrings(kinds[i].GVK.Version, kinds[j].GVK.Version) > 0
	})
	return kinds, nil
}

// acceptedNames returns the names the CRD serves under: the accepted
// names once set, else the requested ones, with upstream's default for
// the singular (the kind in lower case).
func acceptedNames(crd *apiextensionsv1.CustomResourceDefinition) apiextensionsv1.CustomResourceDefinitionNames {
	n := crd.Status.AcceptedNames
	if n.Plural == "" || n.Kind == "" {
		n = crd.Spec.Names
	}
	n = *n.DeepCopy()
	if n.Singular == "" {
		n.Singular = strings.ToLower(n.Kind)
	}
	return n
}

// newKind builds the kind of one version, without the storage links.
func newKind(crd *apiextensionsv1.CustomResourceDefinition, c *crdSchemas, names apiextensionsv1.CustomResourceDefinitionNames, v *apiextensionsv1.CustomResourceDefinitionVersion) (*registry.Kind, error) {
	gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: names.Kind}
	vs, err := c.version(v.Name)
	if err != nil {
		return nil, err
	}
	b := &behaviour{crd: c, v: vs, gvk: gvk}
	k := &registry.Kind{
		GVK:        gvk,
		Resource:   names.Plural,
		Singular:   names.Singular,
		Namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
		ShortNames: names.ShortNames,
		Categories: names.Categories,
		HasSpec:    true,
		New: func() runtime.Object {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			return u
		},
		NameRule:             metavalidation.NameIsDNSSubdomain,
		Prune:                b.prune,
		Default:              b.defaultOnWrite,
		DefaultOnRead:        b.defaultOnRead,
		PrepareForCreate:     b.prepareForCreate,
		PrepareForUpdate:     b.prepareForUpdate,
		GenerationChanged:    generationChanged,
		Validate:             b.validate,
		ValidateUpdate:       b.validateUpdate,
		ValidateStatusUpdate: b.validateStatusUpdate,
		Admit:                warnFinalizers,
		PatchTypes:           patchTypes,
		NoProtobuf:           true,
		DefaultGC:            metav1.DeletePropagationBackground,
	}
	if sub := v.Subresources; sub != nil {
		if sub.Status != nil {
			k.HasStatus = true
			k.PrepareForStatusUpdate = prepareForStatusUpdate
		}
		if sub.Scale != nil {
			k.Scale = scaleAccess(sub.Scale)
		}
	}
	k.Fields, k.FieldLabels, err = selectableFields(v.SelectableFields)
	if err != nil {
		return nil, err
	}
	if k.Columns, k.Cells, err = table(v.AdditionalPrinterColumns); err != nil {
		return nil, err
	}
	k.OpenAPIV2, k.OpenAPIV3 = openAPIDocs(crd, v.Name)
	if v.Deprecated {
		k.Deprecated = true
		if v.DeprecationWarning != nil {
			k.DeprecationWarning = *v.DeprecationWarning
		} else {
			k.DeprecationWarning = defaultDeprecationWarning(v.Name, &crd.Spec)
		}
	}
	return k, nil
}

// defaultDeprecationWarning is upstream's warning for a deprecated version
// without a warning of its own: "<group>/<version> <Kind> is deprecated",
// followed by the newest served version that is not deprecated and newer
// than this one, if any ("; use <group>/<version> <Kind>").
func defaultDeprecationWarning(deprecated string, spec *apiextensionsv1.CustomResourceDefinitionSpec) string {
	msg := fmt.Sprintf("%s/%s %s is deprecated", spec.Group, deprecated, spec.Names.Kind)
	newest := ""
	for _, v := range spec.Versions {
		if !v.Served || v.Deprecated || version.CompareKubeAwareVersionStrings(deprecated, v.Name) >= 0 {
			continue
		}
		if newest == "" || version.CompareKubeAwareVersionStrings(newest, v.Name) < 0 {
			newest = v.Name
		}
	}
	if newest == "" {
		return msg
	}
	return msg + fmt.Sprintf("; use %s/%s %s", spec.Group, newest, spec.Names.Kind)
}
