package apiserver

import (
	"bytes"
	"errors"
	"fmt"
	"mime"
	"net/http"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// maxJSONPatchOps bounds the operations of one JSON patch, as upstream.
const maxJSONPatchOps = 10000

func patchType(r *http.Request) (types.PatchType, error) {
	ct := r.Header.Get("Content-Type")
	media, _, err := mime.ParseMediaType(ct)
	if err == nil {
		switch pt := types.PatchType(media); pt {
		case types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType, types.ApplyYAMLPatchType:
			return pt, nil
		}
	}
	return "", statusErr(http.StatusUnsupportedMediaType, fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: %s, %s, %s, %s",
		types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType, types.ApplyYAMLPatchType))
}

// applyPatch applies a non-apply patch to the JSON of an object and
// returns the patched JSON. schemaObj is the typed struct used as the
// strategic-merge schema.
func applyPatch(pt types.PatchType, original, patch []byte, schemaObj runtime.Object) ([]byte, error) {
	switch pt {
	case types.JSONPatchType:
		p, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		if len(p) > maxJSONPatchOps {
			return nil, statusErr(http.StatusRequestEntityTooLarge, fmt.Sprintf("The allowed maximum operations in a JSON patch is %d, got %d", maxJSONPatchOps, len(p)))
		}
		out, err := applyJSONPatch(p, original)
		if err != nil {
			return nil, statusErr(http.StatusUnprocessableEntity, err.Error())
		}
		return out, nil
	case types.MergePatchType:
		out, err := jsonpatch.MergePatch(original, patch)
		if err != nil {
			if errors.Is(err, jsonpatch.ErrBadJSONPatch) || errors.Is(err, jsonpatch.ErrBadJSONDoc) {
				return nil, apierrors.NewBadRequest(err.Error())
			}
			return nil, statusErr(http.StatusUnprocessableEntity, err.Error())
		}
		return out, nil
	case types.StrategicMergePatchType:
		out, err := strategicpatch.StrategicMergePatch(original, patch, schemaObj)
		if err != nil {
			return nil, statusErr(http.StatusUnprocessableEntity, err.Error())
		}
		return out, nil
	}
	return nil, statusErr(http.StatusUnsupportedMediaType, fmt.Sprintf("unsupported patch type %q", pt))
}

// patchObject encodes current as JSON, applies the patch and decodes the
// result as an object of kind k (as gvk when k is nil: the typed bodies of
// subresources), honouring fieldValidation.
func (s *Server) patchObject(pt types.PatchType, current runtime.Object, patch []byte, k *registry.Kind, gvk schema.GroupVersionKind, validation string) (runtime.Object, []string, error) {
	info, _ := s.serializerFor(mediaJSON)
	var buf bytes.Buffer
	if err := s.encode(output{info: info}, current, gvk.GroupVersion(), &buf); err != nil {
		return nil, nil, apierrors.NewInternalError(err)
	}
	var schemaObj runtime.Object
	if pt == types.StrategicMergePatchType {
		var err error
		if schemaObj, err = s.scheme.New(gvk); err != nil {
			return nil, nil, apierrors.NewInternalError(err)
		}
	}
	patched, err := applyPatch(pt, buf.Bytes(), patch, schemaObj)
	if err != nil {
		return nil, nil, err
	}
	if k != nil {
		return s.decodePatched(info, patched, k, validation)
	}
	into, _ := s.scheme.New(gvk)
	return s.decodeWith(info, patched, gvk, into, validation)
}

func (s *Server) patch(w http.ResponseWriter, r *http.Request, t target, sub string) {
	out, err := s.negotiateKind(r, t.kind, "Table", "PartialObjectMetadata")
	if err != nil {
		s.writeError(w, err)
		return
	}
	pt, err := patchTypeFor(r, t.kind)
	if err != nil {
		s.writeError(w, err)
		return
	}
	opts, err := s.patchOptions(r.URL.Query(), pt)
	if err != nil {
		s.writeError(w, err)
		return
	}
	body, err := s.readBody(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	sopts := storage.Options{DryRun: opts.dryRun, FieldManager: managerFor(opts, r), Force: opts.force, Subresource: sub}
	if pt == types.ApplyYAMLPatchType {
		sopts.FieldManager = opts.fieldManager
		obj, created, err := s.cfg.Storage.Apply(r.Context(), t.kind, t.namespace, t.name, body, sopts)
		if err != nil {
			s.writeError(w, err)
			return
		}
		code := http.StatusOK
		if created && !opts.dryRun {
			code = http.StatusCreated
		}
		s.respond(w, r, code, out, t.kind, obj)
		return
	}
	var warnings []string
	updated, err := s.cfg.Storage.GuaranteedUpdate(r.Context(), t.kind, t.namespace, t.name, sopts,
		func(current runtime.Object) (runtime.Object, error) {
			obj, warn, err := s.patchObject(pt, current, body, t.kind, t.kind.GVK, opts.fieldValidation)
			if err != nil {
				return nil, err
			}
			warnings = warn
			if err := checkName(obj, t.name); err != nil {
				return nil, err
			}
			if t.namespace != "" {
				if err := checkNamespace(obj, t.namespace); err != nil {
					return nil, err
				}
			}
			return obj, nil
		})
	if err != nil {
		s.writeError(w, err)
		return
	}
	addWarnings(w, warnings)
	s.respond(w, r, http.StatusOK, out, t.kind, updated)
}

func (s *Server) patchScale(w http.ResponseWriter, r *http.Request, t target) {
	out, err := s.negotiate(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	pt, err := patchTypeFor(r, t.kind)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if pt == types.ApplyYAMLPatchType {
		s.writeError(w, statusErr(http.StatusUnsupportedMediaType, "server-side apply is not supported on the scale subresource"))
		return
	}
	opts, err := s.patchOptions(r.URL.Query(), pt)
	if err != nil {
		s.writeError(w, err)
		return
	}
	body, err := s.readBody(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	var warnings []string
	updated, err := s.cfg.Storage.GuaranteedUpdate(r.Context(), t.kind, t.namespace, t.name,
		storage.Options{DryRun: opts.dryRun, FieldManager: managerFor(opts, r)},
		func(current runtime.Object) (runtime.Object, error) {
			sc, err := scaleOf(t.kind, current)
			if err != nil {
				return nil, err
			}
			obj, warn, err := s.patchObject(pt, sc, body, nil, scaleGVK, opts.fieldValidation)
			if err != nil {
				return nil, err
			}
			warnings = warn
			return applyScale(t.kind, current, obj.(*autoscalingv1.Scale))
		})
	s.writeScale(w, r, out, t, updated, warnings, err)
}

// applyJSONPatch applies an RFC 6902 patch. The patch library panics on
// some malformed operations (a "test" whose value is missing, for one);
// those become an error for the client instead of a failed request.
func applyJSONPatch(p jsonpatch.Patch, original []byte) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("the JSON patch could not be applied: %v", r)
		}
	}()
	return p.Apply(original)
}
