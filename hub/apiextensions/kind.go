// Package apiextensions serves apiextensions.k8s.io/v1: the
// CustomResourceDefinition kind (its defaults, validation, status
// subresource and table) and the controller that turns each definition
// into served kinds, as kube-apiserver's apiextensions server does: it
// accepts the definition's names, registers the kinds built by
// hub/apiextensions/customresource, reports Established, and on deletion
// removes every custom object before the kinds leave the registry.
package apiextensions

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/client/applyconfiguration"
	"k8s.io/apimachinery/pkg/util/managedfields"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/registry"
)

// Resource is the resource CustomResourceDefinitions are served as.
const Resource = "customresourcedefinitions"

// GVR is where CustomResourceDefinitions are served.
var gvrCRD = apiextensionsv1.SchemeGroupVersion.WithResource(Resource)

// nameMismatch is the message upstream's validation gives a definition
// whose name is not <plural>.<group>; the generic metadata checks do not
// know it, so it is the one metadata error kept from upstream's.
const nameMismatch = `must be spec.names.plural+"."+spec.group`

// Kinds returns the kinds this package serves: apiextensions.k8s.io/v1
// CustomResourceDefinition.
func Kinds() []*registry.Kind {
	v := newValidator()
	metaDocs := metav1.ObjectMeta{}.SwaggerDoc()
	// managedFields and server-side apply of definitions need their
	// schema, which client-go's type converter does not hold.
	var tc managedfields.TypeConverter
	if sch, err := registry.NewScheme(); err == nil {
		tc = applyconfiguration.NewTypeConverter(sch)
	}
	return []*registry.Kind{{
		TypeConverter: tc,
		GVK:           apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"),
		Resource:      Resource,
		Singular:      "customresourcedefinition",
		ShortNames:    []string{"crd", "crds"},
		Categories:    []string{"api-extensions"},
		HasStatus:     true,
		HasSpec:       true,
		Default: func(obj runtime.Object) {
			apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(obj.(*apiextensionsv1.CustomResourceDefinition))
		},
		// The cleanup finalizer is there from the start, so that a
		// definition deleted before the controller saw it still has its
		// objects removed.
		Mutate: func(_ context.Context, _ registry.Lister, obj, old runtime.Object) error {
			if old == nil {
				crd := obj.(*apiextensionsv1.CustomResourceDefinition)
				if !hasFinalizer(crd) {
					crd.Finalizers = append(crd.Finalizers, apiextensionsv1.CustomResourceCleanupFinalizer)
				}
			}
			return nil
		},
		PrepareForCreate: func(obj runtime.Object) {
			crd := obj.(*apiextensionsv1.CustomResourceDefinition)
			// Conditions start as an empty list, not null: `kubectl wait
			// --for=condition=Established` right after an apply reads a
			// null list as an error and gives up, where an empty one has
			// it wait for the controller's conditions.
			crd.Status = apiextensionsv1.CustomResourceDefinitionStatus{
				Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{},
			}
			addStoredVersion(crd)
		},
		PrepareForUpdate: func(obj, old runtime.Object) {
			addStoredVersion(obj.(*apiextensionsv1.CustomResourceDefinition))
		},
		Validate:             v.create,
		ValidateUpdate:       v.update,
		ValidateStatusUpdate: v.status,
		Columns: []metav1.TableColumnDefinition{
			{Name: "Name", Type: "string", Format: "name", Description: metaDocs["name"]},
			{Name: "Scope", Type: "string", Description: "Cluster/Namespaced"},
			{Name: "Versions", Type: "string", Description: "Served versions"},
			{Name: "Created At", Type: "date", Description: metaDocs["creationTimestamp"]},
			{Name: "Group", Type: "string", Priority: 1, Description: "API group"},
			{Name: "Kind", Type: "string", Priority: 1, Description: "CustomResource kind"},
			{Name: "ShortNames", Type: "string", Priority: 1, Description: "Short names"},
			{Name: "Established", Type: "boolean", Priority: 1, Description: "Established status"},
		},
		Cells: func(obj runtime.Object, _ time.Time) []any {
			crd := obj.(*apiextensionsv1.CustomResourceDefinition)
			var versions []string
			for _, v := range crd.Spec.Versions {
				if !v.Served {
					continue
				}
				if v.Storage {
					versions = append(versions, v.Name+"(storage)")
				} else {
					versions = append(versions, v.Name)
				}
			}
			sort.Strings(versions)
			return []any{crd.Name, string(crd.Spec.Scope), strings.Join(versions, ","),
				crd.CreationTimestamp.UTC().Format(time.RFC3339), crd.Spec.Group, crd.Spec.Names.Kind,
				strings.Join(crd.Spec.Names.ShortNames, ","), isTrue(crd, apiextensionsv1.Established)}
		},
	}}
}

// addStoredVersion records the storage version in status.storedVersions,
// as upstream's strategy does on every write of the main resource.
func addStoredVersion(crd *apiextensionsv1.CustomResourceDefinition) {
	for _, v := range crd.Spec.Versions {
		if !v.Storage {
			continue
		}
		for _, s := range crd.Status.StoredVersions {
			if s == v.Name {
				return
			}
		}
		crd.Status.StoredVersions = append(crd.Status.StoredVersions, v.Name)
		return
	}
}

func hasFinalizer(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, f := range crd.Finalizers {
		if f == apiextensionsv1.CustomResourceCleanupFinalizer {
			return true
		}
	}
	return false
}

// validator runs apiextensions-apiserver's validation, which is written
// for the internal type, on v1 objects converted by a scheme of its own.
type validator struct {
	scheme *runtime.Scheme
}

func newValidator() *validator {
	s := runtime.NewScheme()
	install.Install(s)
	return &validator{scheme: s}
}

func (v *validator) internal(obj runtime.Object) (*apiextensions.CustomResourceDefinition, error) {
	out := &apiextensions.CustomResourceDefinition{}
	if err := v.scheme.Convert(obj, out, nil); err != nil {
		return nil, fmt.Errorf("convert CustomResourceDefinition: %w", err)
	}
	return out, nil
}

func (v *validator) create(obj runtime.Object) field.ErrorList {
	crd, err := v.internal(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	return append(withoutMetadata(validation.ValidateCustomResourceDefinition(context.Background(), crd)), unservedConversion(obj)...)
}

// unservedConversion refuses a conversion webhook between several versions:
// tether converts custom objects between versions only by rewriting their
// apiVersion (strategy None), and serving such a definition would hand
// clients objects its webhook never converted. With a single version no
// conversion ever happens, so the strategy is accepted there.
func unservedConversion(obj runtime.Object) field.ErrorList {
	crd := obj.(*apiextensionsv1.CustomResourceDefinition)
	c := crd.Spec.Conversion
	if c == nil || c.Strategy != apiextensionsv1.WebhookConverter || len(crd.Spec.Versions) < 2 {
		return nil
	}
	return field.ErrorList{field.Invalid(field.NewPath("spec", "conversion", "strategy"), string(c.Strategy),
		"conversion webhooks are not supported by this API server; use strategy None or a single version")}
}

func (v *validator) update(obj, old runtime.Object) field.ErrorList {
	crd, err := v.internal(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	was, err := v.internal(old)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	return append(withoutMetadata(validation.ValidateCustomResourceDefinitionUpdate(context.Background(), crd, was)), unservedConversion(obj)...)
}

func (v *validator) status(obj, old runtime.Object) field.ErrorList {
	crd, err := v.internal(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	was, err := v.internal(old)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	return withoutMetadata(validation.ValidateUpdateCustomResourceDefinitionStatus(context.Background(), crd, was))
}

// withoutMetadata drops upstream's checks of metadata, which the generic
// code makes already, but keeps the definition's own naming rule.
func withoutMetadata(errs field.ErrorList) field.ErrorList {
	out := errs[:0]
	for _, e := range errs {
		if strings.HasPrefix(e.Field, "metadata") && !(e.Field == "metadata.name" && e.Detail == nameMismatch) {
			continue
		}
		out = append(out, e)
	}
	return out
}

func isTrue(crd *apiextensionsv1.CustomResourceDefinition, t apiextensionsv1.CustomResourceDefinitionConditionType) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == t {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}
