package customresource

import (
	"context"
	"fmt"
	"math"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/common"
)

// behaviour is the write and validation behaviour of one version's
// objects, as upstream's custom resource strategy.
type behaviour struct {
	crd *crdSchemas
	v   *versionSchema
	gvk schema.GroupVersionKind
}

// asUnstructured returns obj as unstructured, or the error upstream's
// strategy reports for anything else.
func asUnstructured(obj runtime.Object) (*unstructured.Unstructured, *field.Error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, field.Invalid(field.NewPath(""), obj, fmt.Sprintf("has type %T. Must be a pointer to an Unstructured type", obj))
	}
	return u, nil
}

// prune removes what the schema does not declare from a decoded request
// body and returns the removed paths, for fieldValidation Strict and Warn.
// A body whose metadata cannot be read as ObjectMeta is left as it is;
// validation reports it.
func (b *behaviour) prune(obj runtime.Object) []string {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	paths, err := b.crd.coerce(u, coerceOptions{trackUnknown: true})
	if err != nil {
		return nil
	}
	return paths
}

// defaultOnWrite applies the structural defaults of the object's version.
func (b *behaviour) defaultOnWrite(obj runtime.Object) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		b.crd.defaults(u)
	}
}

// defaultOnRead does to an object read from storage, while it is in the
// storage version, what upstream's storage decoder does: malformed
// metadata is dropped, a missing generation becomes 1, fields the schema
// no longer declares are pruned, and the storage version's defaults are
// applied. An object another version's FromStorage converted already had
// this done, as upstream defaults before converting; it is left alone.
func (b *behaviour) defaultOnRead(obj runtime.Object) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		_ = b.crd.decodeStored(u)
	}
}

// prepareForCreate drops status when the version has a status
// subresource: create cannot set it.
func (b *behaviour) prepareForCreate(obj runtime.Object) {
	if u, ok := obj.(*unstructured.Unstructured); ok && b.hasStatus() {
		delete(u.Object, "status")
	}
}

// prepareForUpdate keeps the stored status when the version has a status
// subresource: only /status writes it.
func (b *behaviour) prepareForUpdate(obj, old runtime.Object) {
	u, ok1 := obj.(*unstructured.Unstructured)
	o, ok2 := old.(*unstructured.Unstructured)
	if !ok1 || !ok2 || !b.hasStatus() {
		return
	}
	if st, ok := o.Object["status"]; ok {
		u.Object["status"] = st
	} else {
		delete(u.Object, "status")
	}
}

func (b *behaviour) hasStatus() bool {
	return b.v.statusSubresource
}

// prepareForStatusUpdate makes a /status write change status alone: the
// result is the stored object with the written status and the
// managedFields the write recorded.
func prepareForStatusUpdate(obj, old runtime.Object) {
	u, ok1 := obj.(*unstructured.Unstructured)
	o, ok2 := old.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return
	}
	status, hasStatus := u.Object["status"]
	managed := u.GetManagedFields()
	*u = *o.DeepCopy()
	u.SetManagedFields(managed)
	if hasStatus {
		u.Object["status"] = status
	} else {
		delete(u.Object, "status")
	}
}

// generationChanged reports a change anywhere outside metadata. With a
// status subresource the main resource's status is the stored one, so
// only /status changes it and those never bump generation.
func generationChanged(obj, old runtime.Object) bool {
	u, ok1 := obj.(*unstructured.Unstructured)
	o, ok2 := old.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return false
	}
	return !apiequality.Semantic.DeepEqual(withoutMetadata(u.Object), withoutMetadata(o.Object))
}

func withoutMetadata(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if k != "metadata" {
			out[k] = v
		}
	}
	return out
}

// validate checks a new object: apiVersion and kind, the OpenAPI schema,
// the scale subresource's paths, embedded resources, list-type
// invariants, then the CEL rules (unless a blocking error came first).
// The object's own ObjectMeta is checked by the generic code.
func (b *behaviour) validate(obj runtime.Object) field.ErrorList {
	u, ferr := asUnstructured(obj)
	if ferr != nil {
		return field.ErrorList{ferr}
	}
	if errs := b.validateTypeMeta(u); len(errs) > 0 {
		return errs
	}
	ctx := context.Background()
	errs := validateMetadataShape(u)
	if !b.v.quick.valid(u.Object) {
		errs = append(errs, apiservervalidation.ValidateCustomResource(nil, u.Object, b.v.validator)...)
	}
	errs = append(errs, validateScaleSpec(u, b.v.scale)...)
	errs = append(errs, validateScaleStatus(u, b.v.scale)...)
	errs = append(errs, b.validateEmbedded(ctx, u)...)
	if b.v.shape.hasListSetsOrMaps() {
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, b.v.structural, u.Object)...)
	}
	return b.withCEL(ctx, errs, u.Object, nil)
}

// validateUpdate checks an update of the main resource, ratcheting as
// upstream: a value the update leaves unchanged is not refused for rules
// it already broke, and transition rules see oldSelf.
func (b *behaviour) validateUpdate(obj, old runtime.Object) field.ErrorList {
	u, o, errs := b.updatePair(obj, old)
	if len(errs) > 0 {
		return errs
	}
	ctx := context.Background()
	correlated := common.NewCorrelatedObject(u.Object, o.Object, &model.Structural{Structural: b.v.structural})
	errs = validateMetadataShape(u)
	// Ratcheting only lets errors of unchanged values pass: an object
	// known to be valid is valid with it too.
	if !b.v.quick.valid(u.Object) {
		errs = append(errs, apiservervalidation.ValidateCustomResourceUpdate(nil, u.Object, o.Object, b.v.validator,
			apiservervalidation.WithRatcheting(correlated))...)
	}
	errs = append(errs, validateScaleSpec(u, b.v.scale)...)
	errs = append(errs, validateScaleStatus(u, b.v.scale)...)
	errs = append(errs, b.validateEmbedded(ctx, u)...)
	if b.v.shape.hasListSetsOrMaps() {
		if oldErrs := structurallisttype.ValidateListSetsAndMaps(nil, b.v.structural, o.Object); len(oldErrs) == 0 {
			errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, b.v.structural, u.Object)...)
		}
	}
	return b.withCEL(ctx, errs, u.Object, o.Object, cel.WithRatcheting(correlated))
}

// validateStatusUpdate checks a /status write: status against the
// schema's status property, the scale status paths, list-type invariants
// and every CEL rule, ratcheting as upstream.
func (b *behaviour) validateStatusUpdate(obj, old runtime.Object) field.ErrorList {
	u, o, errs := b.updatePair(obj, old)
	if len(errs) > 0 {
		return errs
	}
	ctx := context.Background()
	correlated := common.NewCorrelatedObject(u.Object, o.Object, &model.Structural{Structural: b.v.structural})
	errs = validateMetadataShape(u)
	if status, ok := u.Object["status"]; ok && !b.v.statusQuick.valid(status) {
		var opts []apiservervalidation.ValidationOption
		if b.v.structural != nil {
			opts = append(opts, apiservervalidation.WithRatcheting(correlated.Key("status")))
		}
		errs = append(errs, apiservervalidation.ValidateCustomResourceUpdate(field.NewPath("status"), status, o.Object["status"],
			b.v.statusValidator, opts...)...)
	}
	errs = append(errs, validateScaleStatus(u, b.v.scale)...)
	if b.v.shape.hasListSetsOrMaps() {
		if newErrs := structurallisttype.ValidateListSetsAndMaps(nil, b.v.structural, u.Object); len(newErrs) > 0 {
			if oldErrs := structurallisttype.ValidateListSetsAndMaps(nil, b.v.structural, o.Object); len(oldErrs) == 0 {
				errs = append(errs, newErrs...)
			}
		}
	}
	return b.withCEL(ctx, errs, u.Object, o.Object, cel.WithRatcheting(correlated))
}

// validateEmbedded checks the apiVersion, kind and metadata of the
// embedded resources in u, which only a schema with some has.
func (b *behaviour) validateEmbedded(ctx context.Context, u *unstructured.Unstructured) field.ErrorList {
	if !b.v.shape.hasEmbedded() {
		return nil
	}
	return schemaobjectmeta.Validate(ctx, nil, u.Object, b.v.structural, false)
}

// updatePair returns obj and old as unstructured objects, or the errors
// that end an update's validation at once: an object that is not one, or
// not of this version's kind.
func (b *behaviour) updatePair(obj, old runtime.Object) (u, o *unstructured.Unstructured, errs field.ErrorList) {
	u, ferr := asUnstructured(obj)
	if ferr != nil {
		return nil, nil, field.ErrorList{ferr}
	}
	o, ferr = asUnstructured(old)
	if ferr != nil {
		return nil, nil, field.ErrorList{ferr}
	}
	return u, o, b.validateTypeMeta(u)
}

// withCEL adds the x-kubernetes-validations results to errs, which the
// schema checks found, unless one of those leaves the rules unchecked as
// upstream does (blockingError). old is nil on create.
func (b *behaviour) withCEL(ctx context.Context, errs field.ErrorList, obj, old map[string]any, opts ...cel.Option) field.ErrorList {
	if b.v.cel == nil {
		return errs
	}
	if blocking := blockingError(errs); blocking != nil {
		return append(errs, blocking)
	}
	var oldSelf any
	if old != nil {
		oldSelf = old
	}
	celErrs, _ := b.v.cel.Validate(ctx, nil, b.v.structural, obj, oldSelf, celconfig.RuntimeCELCostBudget, opts...)
	return append(errs, celErrs...)
}

// validateTypeMeta checks that the object is of this version's kind.
func (b *behaviour) validateTypeMeta(u *unstructured.Unstructured) field.ErrorList {
	var errs field.ErrorList
	if kind := u.GetKind(); kind != b.gvk.Kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), kind, fmt.Sprintf("must be %v", b.gvk.Kind)))
	}
	want := b.gvk.Group + "/" + b.gvk.Version
	if av := u.GetAPIVersion(); av != want {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), av, fmt.Sprintf("must be %v", want)))
	}
	return errs
}

// validateMetadataShape reports metadata that cannot be read as
// ObjectMeta, as upstream's custom resource validator does; the fields of
// a readable ObjectMeta are checked by the generic code.
func validateMetadataShape(u *unstructured.Unstructured) field.ErrorList {
	raw := u.Object["metadata"]
	if raw == nil {
		return nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return field.ErrorList{field.Invalid(field.NewPath("metadata"), raw, fmt.Sprintf("expected map[string]interface{}, got %T", raw))}
	}
	if roundTripsAsIs(m) {
		// Metadata in the form ObjectMeta writes reads as ObjectMeta.
		return nil
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &metav1.ObjectMeta{}); err != nil {
		return field.ErrorList{field.Invalid(field.NewPath("metadata"), raw, err.Error())}
	}
	return nil
}

// blockingError returns the error upstream adds instead of running the
// CEL rules when the object already breaks a type, required, enum or size
// rule, or nil.
func blockingError(errs field.ErrorList) *field.Error {
	for _, err := range errs {
		switch err.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return field.Invalid(nil, nil, "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation")
		}
	}
	return nil
}

// validateScaleSpec checks the replicas at specReplicasPath.
func validateScaleSpec(u *unstructured.Unstructured, scale *apiextensionsv1.CustomResourceSubresourceScale) field.ErrorList {
	if scale == nil {
		return nil
	}
	return validateReplicas(u, scale.SpecReplicasPath)
}

// validateScaleStatus checks the replicas at statusReplicasPath and the
// selector at labelSelectorPath.
func validateScaleStatus(u *unstructured.Unstructured, scale *apiextensionsv1.CustomResourceSubresourceScale) field.ErrorList {
	if scale == nil {
		return nil
	}
	errs := validateReplicas(u, scale.StatusReplicasPath)
	if scale.LabelSelectorPath != nil {
		sel, _, err := unstructured.NestedString(u.Object, splitPath(*scale.LabelSelectorPath)...)
		if err != nil {
			errs = append(errs, field.Invalid(field.NewPath(*scale.LabelSelectorPath), sel, err.Error()))
		}
	}
	return errs
}

func validateReplicas(u *unstructured.Unstructured, path string) field.ErrorList {
	n, _, err := unstructured.NestedInt64(u.Object, splitPath(path)...)
	switch {
	case err != nil:
		return field.ErrorList{field.Invalid(field.NewPath(path), n, err.Error())}
	case n < 0:
		return field.ErrorList{field.Invalid(field.NewPath(path), n, "should be a non-negative integer")}
	case n > math.MaxInt32:
		return field.ErrorList{field.Invalid(field.NewPath(path), n, fmt.Sprintf("should be less than or equal to %v", math.MaxInt32))}
	}
	return nil
}

// splitPath splits a scale path (".spec.replicas") into its fields.
func splitPath(path string) []string {
	return strings.Split(strings.TrimPrefix(path, "."), ".")
}
