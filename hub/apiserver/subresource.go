package apiserver

import (
	"fmt"
	"net/http"
	"net/url"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// writeBody reads the options (with options, e.g. createOptions) and the
// body of a write and decodes it with decode. ok is false when it already
// answered with an error.
func (s *Server) writeBody(w http.ResponseWriter, r *http.Request, options func(url.Values) (writeOptions, error),
	decode func(body []byte, validation string) (runtime.Object, []string, error)) (obj runtime.Object, warnings []string, opts writeOptions, ok bool) {
	opts, err := options(r.URL.Query())
	if err != nil {
		s.writeError(w, err)
		return nil, nil, opts, false
	}
	body, err := s.readBody(r)
	if err != nil {
		s.writeError(w, err)
		return nil, nil, opts, false
	}
	obj, warnings, err = decode(body, opts.fieldValidation)
	if err != nil {
		s.writeError(w, err)
		return nil, nil, opts, false
	}
	auditRequestObject(r, obj)
	return obj, warnings, opts, true
}

// postBody is writeBody for a POST to a subresource (pods/binding,
// pods/eviction, serviceaccounts/token).
func (s *Server) postBody(w http.ResponseWriter, r *http.Request,
	decode func(body []byte, validation string) (runtime.Object, []string, error)) (runtime.Object, []string, writeOptions, bool) {
	return s.writeBody(w, r, s.createOptions, decode)
}

// decodeAs returns a decode function for postBody that expects gvk.
func (s *Server) decodeAs(r *http.Request, gvk schema.GroupVersionKind) func([]byte, string) (runtime.Object, []string, error) {
	return func(body []byte, validation string) (runtime.Object, []string, error) {
		return s.decodeBody(r, body, gvk, validation)
	}
}

// checkTargetName fills in the name and namespace of a subresource body
// that names its object (a Binding, an Eviction) and refuses one that
// names another object than the URL.
func checkTargetName(obj runtime.Object, t target, kind string) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	if m.GetName() == "" {
		m.SetName(t.name)
	}
	if err := checkNamespace(obj, t.namespace); err != nil {
		return err
	}
	if m.GetName() != t.name {
		return apierrors.NewBadRequest(fmt.Sprintf("name in URL does not match name in %s object", kind))
	}
	return nil
}

// writeCreated answers a subresource POST with 201 and obj, or with a
// success Status when obj is nil, in the negotiated form (JSON when the
// client accepts nothing we serve).
func (s *Server) writeCreated(w http.ResponseWriter, r *http.Request, warnings []string, obj runtime.Object, gv schema.GroupVersion) {
	addWarnings(w, warnings)
	out, _ := s.negotiate(r)
	if out.info.Serializer == nil {
		out.info, _ = s.serializerFor(mediaJSON)
	}
	if obj == nil {
		obj, gv = &metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusCreated}, schema.GroupVersion{Version: "v1"}
	}
	s.writeObject(w, r, http.StatusCreated, out, obj, gv)
}
