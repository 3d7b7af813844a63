package apiserver

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	listvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// target is a parsed resource path.
type target struct {
	kind        *registry.Kind
	namespace   string
	name        string
	subresource string
	// proxyPath is what follows nodes/<name>/proxy (or the pods' or
	// services'), with its leading slash.
	proxyPath string
}

// parseResourcePath resolves /api/v1/... or /apis/<g>/<v>/... segments.
func (s *Server) parseResourcePath(segs []string) (target, schema.GroupVersion, error) {
	var gv schema.GroupVersion
	var rest []string
	if segs[0] == "api" {
		if segs[1] != "v1" {
			return target{}, gv, notFoundPath()
		}
		gv, rest = schema.GroupVersion{Version: "v1"}, segs[2:]
	} else {
		gv, rest = schema.GroupVersion{Group: segs[1], Version: segs[2]}, segs[3:]
	}
	kinds := s.routing()[gv]
	if kinds == nil {
		return target{}, gv, notFoundPath()
	}
	var t target
	if len(rest) >= 3 && rest[0] == "namespaces" {
		if k := kinds[rest[2]]; k != nil && k.Namespaced {
			t.kind, t.namespace = k, rest[1]
			rest = rest[3:]
			switch len(rest) {
			case 0:
			case 1:
				t.name = rest[0]
			case 2:
				t.name, t.subresource = rest[0], rest[1]
			default:
				if rest[1] != "proxy" || !proxiable(k) {
					return target{}, gv, notFoundPath()
				}
				t.name, t.subresource, t.proxyPath = rest[0], "proxy", "/"+strings.Join(rest[2:], "/")
			}
			return t, gv, nil
		}
	}
	k := kinds[rest[0]]
	if k == nil {
		return target{}, gv, notFoundPath()
	}
	t.kind = k
	switch len(rest) {
	case 1:
	case 2:
		if k.Namespaced {
			return target{}, gv, notFoundPath()
		}
		t.name = rest[1]
	case 3:
		if k.Namespaced {
			return target{}, gv, notFoundPath()
		}
		t.name, t.subresource = rest[1], rest[2]
	default:
		if !k.Namespaced && k.GVK.Group == "" && k.Resource == "nodes" && rest[2] == "proxy" {
			t.name, t.subresource = rest[1], "proxy"
			t.proxyPath = "/" + strings.Join(rest[3:], "/")
			break
		}
		return target{}, gv, notFoundPath()
	}
	return t, gv, nil
}

func hasVerb(k *registry.Kind, verb string) bool {
	if k.Verbs == nil {
		return true
	}
	for _, v := range k.Verbs {
		if v == verb {
			return true
		}
	}
	return false
}

// verbFor maps the HTTP method and target to a Kubernetes verb.
func verbFor(r *http.Request, t target) string {
	q := r.URL.Query()
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if t.name == "" {
			if w := q.Get("watch"); w == "true" || w == "1" {
				return "watch"
			}
			return "list"
		}
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		if t.name == "" {
			return "deletecollection"
		}
		return "delete"
	}
	return strings.ToLower(r.Method)
}

func (s *Server) serveResource(w http.ResponseWriter, r *http.Request, req *request, u *auth.User, segs []string) {
	t, gv, err := s.parseResourcePath(segs)
	if err != nil {
		s.writeError(w, err)
		return
	}
	verb := verbFor(r, t)
	if !longRunning(verb, t.subresource) {
		var cancel context.CancelFunc
		if r, cancel, err = withRequestDeadline(r); err != nil {
			s.writeError(w, err)
			return
		}
		defer cancel()
	}
	req.kind = t.kind
	req.attrs = Attributes{Verb: verb, Resource: true, Group: gv.Group, Version: gv.Version, Kind: t.kind.Resource,
		Namespace: t.namespace, Name: t.name, Subresource: t.subresource, Path: r.URL.Path}
	if verb == "list" || verb == "watch" || verb == "deletecollection" {
		q := r.URL.Query()
		req.attrs.LabelSelector, req.attrs.FieldSelector = q.Get("labelSelector"), q.Get("fieldSelector")
	}
	if err := s.authorize(r, u, req.attrs); err != nil {
		s.writeError(w, toStatus(err))
		return
	}
	if t.kind.Deprecated {
		addWarnings(w, []string{deprecationWarning(t.kind)})
	}
	notAllowed := apierrors.NewMethodNotSupported(t.kind.GroupResource(), verb)
	if t.kind.NotStored {
		switch {
		case t.subresource != "":
			s.writeError(w, notFoundPath())
		case verb != "create" || t.name != "":
			// Upstream serves no route but POST for them.
			s.writeError(w, apierrors.NewGenericServerResponse(http.StatusMethodNotAllowed, "", schema.GroupResource{}, "", "", 0, false))
		default:
			s.serveReview(w, r, t)
		}
		return
	}
	if t.subresource != "" {
		s.serveSubresource(w, r, t, verb, notAllowed)
		return
	}
	if !hasVerb(t.kind, verb) {
		s.writeError(w, notAllowed)
		return
	}
	switch verb {
	case "get":
		s.get(w, r, t, "")
	case "list":
		s.list(w, r, t)
	case "watch":
		s.watch(w, r, t)
	case "create":
		if t.name != "" {
			s.writeError(w, notAllowed)
			return
		}
		s.create(w, r, t)
	case "update":
		s.update(w, r, t, "")
	case "patch":
		s.patch(w, r, t, "")
	case "delete":
		s.delete(w, r, t)
	case "deletecollection":
		s.deleteCollection(w, r, t)
	default:
		s.writeError(w, notAllowed)
	}
}

func (s *Server) serveSubresource(w http.ResponseWriter, r *http.Request, t target, verb string, notAllowed error) {
	k := t.kind
	switch {
	case t.subresource == "status" && k.HasStatus:
		switch verb {
		case "get":
			s.get(w, r, t, "status")
		case "update":
			s.update(w, r, t, "status")
		case "patch":
			s.patch(w, r, t, "status")
		default:
			s.writeError(w, notAllowed)
		}
	case t.subresource == "scale" && k.Scale != nil:
		switch verb {
		case "get":
			s.getScale(w, r, t)
		case "update":
			s.updateScale(w, r, t)
		case "patch":
			s.patchScale(w, r, t)
		default:
			s.writeError(w, notAllowed)
		}
	case t.subresource == "finalize" && k.GVK.Group == "" && k.Resource == "namespaces":
		if verb != "update" {
			s.writeError(w, notAllowed)
			return
		}
		s.update(w, r, t, "finalize")
	case t.subresource == "proxy" && k.GVK.Group == "" && k.Resource == "nodes":
		s.nodeProxy(w, r, t)
	case t.subresource == "proxy" && proxiable(k):
		s.proxyToPods(w, r, t)
	case t.subresource == "token" && k.GVK.Group == "" && k.Resource == "serviceaccounts":
		if verb != "create" {
			s.writeError(w, notAllowed)
			return
		}
		s.requestToken(w, r, t)
	case t.subresource == "eviction" && k.GVK.Group == "" && k.Resource == "pods":
		if verb != "create" {
			s.writeError(w, notAllowed)
			return
		}
		s.evict(w, r, t)
	case podStreamPaths[t.subresource] != "" && k.GVK.Group == "" && k.Resource == "pods":
		s.podStream(w, r, t)
	case t.subresource == "binding" && k.GVK.Group == "" && k.Resource == "pods":
		if verb != "create" {
			s.writeError(w, notAllowed)
			return
		}
		s.bind(w, r, t)
	case k.Subresources[t.subresource] != nil:
		s.kindSubresource(w, r, t, verb, notAllowed)
	default:
		s.writeError(w, notFoundPath())
	}
}

// decodeListOptions parses list and watch query parameters.
func decodeListOptions(q url.Values) (*metainternalversion.ListOptions, error) {
	opts := &metainternalversion.ListOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if errs := listvalidation.ValidateListOptions(opts, true); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	return opts, nil
}

func storageListOptions(o *metainternalversion.ListOptions) storage.ListOptions {
	return storage.ListOptions{Label: o.LabelSelector, Field: o.FieldSelector, Limit: o.Limit, Continue: o.Continue,
		ResourceVersion: o.ResourceVersion, ResourceVersionMatch: o.ResourceVersionMatch}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, t target, sub string) {
	out, err := s.negotiateKind(r, t.kind, "Table", "PartialObjectMetadata")
	if err != nil {
		s.writeError(w, err)
		return
	}
	obj, err := s.cfg.Storage.Get(r.Context(), t.kind, t.namespace, t.name)
	if err != nil {
		s.writeError(w, err)
		return
	}
	s.respond(w, r, http.StatusOK, out, t.kind, obj)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, t target) {
	out, err := s.negotiateKind(r, t.kind, "Table", "PartialObjectMetadataList")
	if err != nil {
		s.writeError(w, err)
		return
	}
	opts, err := decodeListOptions(r.URL.Query())
	if err != nil {
		s.writeError(w, err)
		return
	}
	body, err := s.storedList(r.Context(), t, out, storageListOptions(opts))
	if err != nil {
		s.writeError(w, err)
		return
	}
	if body != nil {
		w.Header().Set("Content-Type", out.info.MediaType)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		writeBody(w, r, http.StatusOK, body.Len(), func(w io.Writer) error {
			_, err := body.WriteTo(w)
			return err
		})
		return
	}
	obj, err := s.cfg.Storage.List(r.Context(), t.kind, t.namespace, storageListOptions(opts))
	if err != nil {
		s.writeError(w, err)
		return
	}
	s.respond(w, r, http.StatusOK, out, t.kind, obj)
}

// respond writes obj (an object or a list of kind k) transformed as out asks.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, code int, out output, k *registry.Kind, obj runtime.Object) {
	gv := k.GVK.GroupVersion()
	switch out.as {
	case "Table":
		tbl, err := s.toTable(k, obj, r.URL.Query().Get("includeObject"), true)
		if err != nil {
			s.writeError(w, err)
			return
		}
		tbl.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("Table"))
		obj, gv = tbl, schema.GroupVersion{Group: metav1.GroupName, Version: out.asVersion}
	case "PartialObjectMetadata", "PartialObjectMetadataList":
		p, err := toPartial(obj)
		if err != nil {
			s.writeError(w, err)
			return
		}
		obj, gv = p, schema.GroupVersion{Group: metav1.GroupName, Version: out.asVersion}
	}
	s.writeObject(w, r, code, out, obj, gv)
}

// writeOptions holds the query parameters shared by create, update and patch.
type writeOptions struct {
	dryRun          bool
	fieldManager    string
	fieldValidation string
	force           bool
}

func (s *Server) createOptions(q url.Values) (writeOptions, error) {
	o := &metav1.CreateOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, o); err != nil {
		return writeOptions{}, apierrors.NewBadRequest(err.Error())
	}
	if errs := metavalidation.ValidateCreateOptions(o); len(errs) > 0 {
		return writeOptions{}, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "CreateOptions"}, "", errs)
	}
	return writeOptions{dryRun: len(o.DryRun) > 0, fieldManager: o.FieldManager, fieldValidation: fieldValidation(o.FieldValidation)}, nil
}

func (s *Server) updateOptions(q url.Values) (writeOptions, error) {
	o := &metav1.UpdateOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, o); err != nil {
		return writeOptions{}, apierrors.NewBadRequest(err.Error())
	}
	if errs := metavalidation.ValidateUpdateOptions(o); len(errs) > 0 {
		return writeOptions{}, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "UpdateOptions"}, "", errs)
	}
	return writeOptions{dryRun: len(o.DryRun) > 0, fieldManager: o.FieldManager, fieldValidation: fieldValidation(o.FieldValidation)}, nil
}

func (s *Server) patchOptions(q url.Values, pt types.PatchType) (writeOptions, error) {
	o := &metav1.PatchOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, o); err != nil {
		return writeOptions{}, apierrors.NewBadRequest(err.Error())
	}
	if errs := metavalidation.ValidatePatchOptions(o, pt); len(errs) > 0 {
		return writeOptions{}, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "PatchOptions"}, "", errs)
	}
	wo := writeOptions{dryRun: len(o.DryRun) > 0, fieldManager: o.FieldManager, fieldValidation: fieldValidation(o.FieldValidation)}
	if o.Force != nil {
		wo.force = *o.Force
	}
	return wo, nil
}

// fieldValidation applies upstream's default for a missing directive.
func fieldValidation(d string) string {
	if d == "" {
		return metav1.FieldValidationWarn
	}
	return d
}

// managerFor returns the field manager, defaulting to the user agent's
// program name as upstream does.
func managerFor(o writeOptions, r *http.Request) string {
	if o.fieldManager != "" {
		return o.fieldManager
	}
	ua := r.UserAgent()
	if i := strings.Index(ua, "/"); i >= 0 {
		ua = ua[:i]
	}
	if len(ua) > 128 {
		ua = ua[:128]
	}
	return ua
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, t target) {
	out, err := s.negotiateKind(r, t.kind, "Table", "PartialObjectMetadata")
	if err != nil {
		s.writeError(w, err)
		return
	}
	obj, warnings, opts, ok := s.writeBody(w, r, s.createOptions, s.decodeKind(r, t.kind))
	if !ok {
		return
	}
	if t.namespace != "" {
		if err := checkNamespace(obj, t.namespace); err != nil {
			s.writeError(w, err)
			return
		}
	}
	if ca, ok := s.authz.(CreateAuthorizer); ok {
		u, _ := auth.UserFrom(r.Context())
		attrs := Attributes{Verb: "create", Resource: true, Group: t.kind.GVK.Group, Version: t.kind.GVK.Version,
			Kind: t.kind.Resource, Namespace: t.namespace, Path: r.URL.Path}
		if u != nil {
			if err := ca.AuthorizeCreate(u, attrs, obj); err != nil {
				auditDenied(r, err)
				s.writeError(w, toStatus(err))
				return
			}
		}
	}
	created, err := s.cfg.Storage.Create(r.Context(), t.kind, t.namespace, obj,
		storage.Options{DryRun: opts.dryRun, FieldManager: managerFor(opts, r)})
	if err != nil {
		s.writeError(w, err)
		return
	}
	addWarnings(w, warnings)
	code := http.StatusCreated
	if opts.dryRun {
		code = http.StatusOK
	}
	s.respond(w, r, code, out, t.kind, created)
}

// checkNamespace rejects a body whose namespace differs from the URL's and
// fills it in when absent.
func checkNamespace(obj runtime.Object, ns string) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	switch m.GetNamespace() {
	case "":
		m.SetNamespace(ns)
	case ns:
	default:
		return apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
	}
	return nil
}

func checkName(obj runtime.Object, name string) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	switch m.GetName() {
	case "":
		m.SetName(name)
	case name:
	default:
		return apierrors.NewBadRequest("the name of the object (" + m.GetName() + ") does not match the name on the URL (" + name + ")")
	}
	return nil
}

func (s *Server) update(w http.ResponseWriter, r *http.Request, t target, sub string) {
	out, err := s.negotiateKind(r, t.kind, "Table", "PartialObjectMetadata")
	if err != nil {
		s.writeError(w, err)
		return
	}
	obj, warnings, opts, ok := s.writeBody(w, r, s.updateOptions, s.decodeKind(r, t.kind))
	if !ok {
		return
	}
	if err := checkName(obj, t.name); err != nil {
		s.writeError(w, err)
		return
	}
	if t.namespace != "" {
		if err := checkNamespace(obj, t.namespace); err != nil {
			s.writeError(w, err)
			return
		}
	}
	updated, err := s.cfg.Storage.Update(r.Context(), t.kind, t.namespace, t.name, obj,
		storage.Options{DryRun: opts.dryRun, FieldManager: managerFor(opts, r), Subresource: sub})
	if err != nil {
		s.writeError(w, err)
		return
	}
	addWarnings(w, warnings)
	s.respond(w, r, http.StatusOK, out, t.kind, updated)
}

// deleteOptions reads DeleteOptions from the body or the query.
func (s *Server) deleteOptions(r *http.Request) (*metav1.DeleteOptions, error) {
	opts := &metav1.DeleteOptions{}
	body, err := s.readBody(r)
	if err != nil {
		return nil, err
	}
	if len(body) > 0 {
		info, err := s.bodySerializer(r)
		if err != nil {
			return nil, err
		}
		// The body is decoded with apimachinery's meta scheme, where
		// DeleteOptions is known under every group version, as upstream
		// decodes it: clientsets send it under their own group's version
		// (cert-manager's under cert-manager.io/v1), kubectl under v1 or
		// meta.k8s.io/v1.
		meta, ok := runtime.SerializerInfoForMediaType(metainternalversionscheme.Codecs.SupportedMediaTypes(), info.MediaType)
		if !ok {
			return nil, unsupportedMedia(info.MediaType, s.acceptedTypes())
		}
		gvk := metav1.SchemeGroupVersion.WithKind("DeleteOptions")
		dec := metainternalversionscheme.Codecs.DecoderToVersion(meta.Serializer, metav1.SchemeGroupVersion)
		obj, _, err := dec.Decode(body, &gvk, opts)
		if err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("decode DeleteOptions: %v", err))
		}
		if obj != opts {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("expected DeleteOptions, got %T", obj))
		}
	} else if err := metainternalversionscheme.ParameterCodec.DecodeParameters(r.URL.Query(), metav1.SchemeGroupVersion, opts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if dr := r.URL.Query()["dryRun"]; len(dr) > 0 && len(opts.DryRun) == 0 {
		opts.DryRun = dr
	}
	if errs := metavalidation.ValidateDeleteOptions(opts); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "DeleteOptions"}, "", errs)
	}
	return opts, nil
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request, t target) {
	out, err := s.negotiateKind(r, t.kind)
	if err != nil {
		s.writeError(w, err)
		return
	}
	opts, err := s.deleteOptions(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	obj, deleted, err := s.cfg.Storage.Delete(r.Context(), t.kind, t.namespace, t.name, opts, len(opts.DryRun) > 0)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if !deleted {
		s.respond(w, r, http.StatusOK, out, t.kind, obj)
		return
	}
	st := &metav1.Status{Status: metav1.StatusSuccess, Details: &metav1.StatusDetails{
		Name: t.name, Group: t.kind.GVK.Group, Kind: t.kind.Resource}}
	if m, err := meta.Accessor(obj); err == nil {
		st.Details.UID = m.GetUID()
	}
	s.writeObject(w, r, http.StatusOK, out, st, schema.GroupVersion{Version: "v1"})
}

func (s *Server) deleteCollection(w http.ResponseWriter, r *http.Request, t target) {
	out, err := s.negotiateKind(r, t.kind)
	if err != nil {
		s.writeError(w, err)
		return
	}
	lo, err := decodeListOptions(r.URL.Query())
	if err != nil {
		s.writeError(w, err)
		return
	}
	opts, err := s.deleteOptions(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	list, err := s.cfg.Storage.DeleteCollection(r.Context(), t.kind, t.namespace, storageListOptions(lo), opts, len(opts.DryRun) > 0)
	if err != nil {
		s.writeError(w, err)
		return
	}
	s.respond(w, r, http.StatusOK, out, t.kind, list)
}

func (s *Server) bind(w http.ResponseWriter, r *http.Request, t target) {
	obj, warnings, opts, ok := s.postBody(w, r, s.decodeAs(r, corev1.SchemeGroupVersion.WithKind("Binding")))
	if !ok {
		return
	}
	b := obj.(*corev1.Binding)
	if err := checkTargetName(b, t, "Binding"); err != nil {
		s.writeError(w, err)
		return
	}
	if err := s.cfg.Storage.Bind(r.Context(), t.namespace, b, storage.Options{DryRun: opts.dryRun, FieldManager: managerFor(opts, r)}); err != nil {
		s.writeError(w, err)
		return
	}
	s.writeCreated(w, r, warnings, nil, schema.GroupVersion{})
}
