package apiserver

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/registry"
)

// This file holds what the API server does differently for kinds that are
// not Go types of the scheme (custom resources, registry.Kind.New set) or
// that prune their bodies (registry.Kind.Prune), as upstream's custom
// resource handler does: decode into unstructured objects, prune the
// fields the schema does not declare and report them per fieldValidation,
// serve only the kind's patch types, no protobuf, and warn on deprecated
// versions.

// newObject returns an empty object of kind k.
func (s *Server) newObject(k *registry.Kind) (runtime.Object, error) {
	if k.New != nil {
		return k.New(), nil
	}
	obj, err := s.scheme.New(k.GVK)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("create %s: %w", k.GVK, err))
	}
	return obj, nil
}

// decodeKind returns a decode function for writeBody that decodes a body
// as an object of kind k.
func (s *Server) decodeKind(r *http.Request, k *registry.Kind) func([]byte, string) (runtime.Object, []string, error) {
	if k.New == nil && k.Prune == nil {
		return s.decodeAs(r, k.GVK)
	}
	return func(body []byte, validation string) (runtime.Object, []string, error) {
		info, err := s.bodySerializer(r)
		if err != nil {
			return nil, nil, err
		}
		into, err := s.newObject(k)
		if err != nil {
			return nil, nil, err
		}
		gvk := k.GVK
		obj, actual, strict, err := decodeLenient(info, body, gvk, into, validation)
		if err != nil {
			return nil, nil, decodeError(err, actual, gvk, body)
		}
		warnings, err := pruneFields(k, obj, strict, validation)
		if err != nil {
			return nil, nil, decodeError(err, actual, gvk, body)
		}
		if actual != nil && actual.GroupVersion() != gvk.GroupVersion() {
			return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s)", actual.GroupVersion(), gvk.GroupVersion()))
		}
		if err := checkCustomKind(k, obj); err != nil {
			return nil, nil, err
		}
		return obj, warnings, nil
	}
}

// decodeLenient decodes body strictly unless validation is Ignore and
// returns the strict decoding errors (duplicate fields) apart, with the
// object decoded despite them.
func decodeLenient(info runtime.SerializerInfo, body []byte, gvk schema.GroupVersionKind, into runtime.Object, validation string) (runtime.Object, *schema.GroupVersionKind, []error, error) {
	dec := info.Serializer
	if validation != metav1.FieldValidationIgnore && info.StrictSerializer != nil {
		dec = info.StrictSerializer
	}
	obj, actual, err := dec.Decode(body, &gvk, into)
	if err == nil {
		return obj, actual, nil, nil
	}
	strict, ok := runtime.AsStrictDecodingError(err)
	if !ok || obj == nil {
		return nil, actual, nil, err
	}
	return obj, actual, strict.Errors(), nil
}

// pruneFields drops from obj the fields kind k does not declare and
// decides, with the strict decoding errors already found, as
// fieldValidation says: Strict fails with upstream's strict decoding
// error, Warn returns each as a warning, Ignore drops them silently.
func pruneFields(k *registry.Kind, obj runtime.Object, strict []error, validation string) ([]string, error) {
	if k.Prune != nil {
		for _, p := range k.Prune(obj) {
			strict = append(strict, fmt.Errorf(`unknown field "%s"`, p))
		}
	}
	if len(strict) == 0 || validation == metav1.FieldValidationIgnore {
		return nil, nil
	}
	if validation == metav1.FieldValidationWarn {
		warnings := make([]string, 0, len(strict))
		for _, e := range strict {
			warnings = append(warnings, e.Error())
		}
		return warnings, nil
	}
	return nil, runtime.NewStrictDecodingError(strict)
}

// checkCustomKind refuses an unstructured body of another kind than the
// endpoint's, as upstream's custom resource validation does (422).
func checkCustomKind(k *registry.Kind, obj runtime.Object) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || k.New == nil {
		return nil
	}
	if kind := u.GetKind(); kind != k.GVK.Kind {
		return apierrors.NewInvalid(k.GVK.GroupKind(), u.GetName(), field.ErrorList{
			field.Invalid(field.NewPath("kind"), kind, "must be "+k.GVK.Kind)})
	}
	return nil
}

// decodePatched decodes the result of a patch as an object of kind k and
// prunes it as decodeKind prunes a body; errors are upstream's for a
// patch result.
func (s *Server) decodePatched(info runtime.SerializerInfo, patched []byte, k *registry.Kind, validation string) (runtime.Object, []string, error) {
	into, err := s.newObject(k)
	if err != nil {
		return nil, nil, err
	}
	if k.New == nil && k.Prune == nil {
		return s.decodeWith(info, patched, k.GVK, into, validation)
	}
	obj, warnings, err := s.decodeWith(info, patched, k.GVK, into, metav1.FieldValidationWarn)
	if err != nil {
		return nil, nil, err
	}
	var strict []error
	if validation != metav1.FieldValidationIgnore {
		for _, w := range warnings {
			strict = append(strict, stringError(w))
		}
	}
	warnings, err = pruneFields(k, obj, strict, validation)
	if err != nil {
		return nil, nil, apierrors.NewBadRequest(err.Error())
	}
	if err := checkCustomKind(k, obj); err != nil {
		return nil, nil, err
	}
	return obj, warnings, nil
}

// stringError is an error whose message is already formatted.
type stringError string

func (e stringError) Error() string { return string(e) }

// patchTypeFor returns the request's patch type if kind k serves it, else
// upstream's 415 listing the types it does serve.
func patchTypeFor(r *http.Request, k *registry.Kind) (types.PatchType, error) {
	if k == nil || k.PatchTypes == nil {
		return patchType(r)
	}
	served := k.PatchTypes
	ct := r.Header.Get("Content-Type")
	if i := strings.Index(ct, ";"); i > 0 {
		ct = ct[:i]
	}
	pt := types.PatchType(strings.TrimSpace(ct))
	if slices.Contains(served, pt) {
		return pt, nil
	}
	names := make([]string, len(served))
	for i, t := range served {
		names[i] = string(t)
	}
	return "", statusErr(http.StatusUnsupportedMediaType, "the body of the request was in an unknown format - accepted media types include: "+strings.Join(names, ", "))
}

// deprecationWarning is the Warning a request to a deprecated kind gets.
func deprecationWarning(k *registry.Kind) string {
	if k.DeprecationWarning != "" {
		return k.DeprecationWarning
	}
	return fmt.Sprintf("%s %s is deprecated", k.GVK.GroupVersion(), k.GVK.Kind)
}

// partialMeta returns the ObjectMeta of an object that does not keep it
// as a struct (an unstructured object).
func partialMeta(obj runtime.Object) (*metav1.ObjectMeta, bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, false
	}
	om := &metav1.ObjectMeta{}
	// The conversion copies what it reads: the metadata need not be
	// copied first.
	m, _ := u.Object["metadata"].(map[string]any)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, om); err != nil {
		return nil, false
	}
	return om, true
}
