package apiextensions

import (
	"fmt"
	"reflect"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/sets"
)

// metaZero is the zero time conditions are compared with.
var metaZero = metav1.Time{}

// namesInUse returns the resource names (plural, singular, short names)
// and kinds (kind, list kind) the definitions of group have been given,
// as upstream's naming controller collects them.
func (c *Controller) namesInUse(group string) (resources, kinds sets.Set[string]) {
	resources, kinds = sets.New[string](), sets.New[string]()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, crd := range c.crds {
		if crd.Spec.Group != group {
			continue
		}
		n := crd.Status.AcceptedNames
		resources.Insert(n.Plural, n.Singular)
		resources.Insert(n.ShortNames...)
		kinds.Insert(n.Kind, n.ListKind)
	}
	return resources, kinds
}

// namesAndConditions decides which of the names a definition asks for it
// is given, and its NamesAccepted and Established conditions, with
// upstream's rules: a name another definition of the group was given is
// refused, the rest are given; Established stays what it was until the
// names are accepted.
func (c *Controller) namesAndConditions(in *apiextensionsv1.CustomResourceDefinition) (apiextensionsv1.CustomResourceDefinitionNames, apiextensionsv1.CustomResourceDefinitionCondition, apiextensionsv1.CustomResourceDefinitionCondition) {
	resources, kinds := c.namesInUse(in.Spec.Group)
	accepted := apiextensionsv1.CustomResourceDefinitionCondition{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionUnknown}
	conflict := func(reason string, err error) {
		accepted.Status = apiextensionsv1.ConditionFalse
		accepted.Reason = reason
		accepted.Message = err.Error()
	}
	want, had := in.Spec.Names, in.Status.AcceptedNames
	names := had
	if err := freshOrOwn(want.Plural, had.Plural, resources); err != nil {
		conflict("PluralConflict", err)
	} else {
		names.Plural = want.Plural
	}
	if err := freshOrOwn(want.Singular, had.Singular, resources); err != nil {
		conflict("SingularConflict", err)
	} else {
		names.Singular = want.Singular
	}
	if !reflect.DeepEqual(want.ShortNames, had.ShortNames) {
		own := sets.New(had.ShortNames...)
		var errs []error
		for _, s := range want.ShortNames {
			if own.Has(s) {
				continue
			}
			if err := freshOrOwn(s, "", resources); err != nil {
				errs = append(errs, err)
			}
		}
		if err := utilerrors.NewAggregate(errs); err != nil {
			conflict("ShortNamesConflict", err)
		} else {
			names.ShortNames = want.ShortNames
		}
	}
	if err := freshOrOwn(want.Kind, had.Kind, kinds); err != nil {
		conflict("KindConflict", err)
	} else {
		names.Kind = want.Kind
	}
	if err := freshOrOwn(want.ListKind, had.ListKind, kinds); err != nil {
		conflict("ListKindConflict", err)
	} else {
		names.ListKind = want.ListKind
	}
	names.Categories = want.Categories
	if accepted.Status == apiextensionsv1.ConditionUnknown {
		accepted.Status = apiextensionsv1.ConditionTrue
		accepted.Reason = "NoConflicts"
		accepted.Message = "no conflicts found"
	}

	established := apiextensionsv1.CustomResourceDefinitionCondition{
		Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionFalse,
		Reason: "NotAccepted", Message: "not all names are accepted",
	}
	if old := apihelpers.FindCRDCondition(in, apiextensionsv1.Established); old != nil {
		established = *old
	}
	if established.Status != apiextensionsv1.ConditionTrue && accepted.Status == apiextensionsv1.ConditionTrue {
		established = apiextensionsv1.CustomResourceDefinitionCondition{
			Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionFalse,
			Reason: "Installing", Message: "the initial names have been accepted",
		}
	}
	return names, accepted, established
}

// freshOrOwn refuses a requested name that differs from the one the
// definition has and that another definition has been given.
func freshOrOwn(requested, accepted string, used sets.Set[string]) error {
	if requested == accepted || !used.Has(requested) {
		return nil
	}
	return fmt.Errorf("%q is already in use", requested)
}
