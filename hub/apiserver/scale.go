package apiserver

import (
	"fmt"
	"net/http"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// scaleOf builds the autoscaling/v1 Scale of obj.
func scaleOf(k *registry.Kind, obj runtime.Object) (*autoscalingv1.Scale, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	spec, status, sel := k.Scale.Get(obj)
	return &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: m.GetName(), Namespace: m.GetNamespace(), UID: m.GetUID(),
			ResourceVersion: m.GetResourceVersion(), CreationTimestamp: m.GetCreationTimestamp()},
		Spec:   autoscalingv1.ScaleSpec{Replicas: spec},
		Status: autoscalingv1.ScaleStatus{Replicas: status, Selector: sel},
	}, nil
}

var scaleGVK = autoscalingv1.SchemeGroupVersion.WithKind("Scale")

func (s *Server) getScale(w http.ResponseWriter, r *http.Request, t target) {
	out, err := s.negotiate(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	obj, err := s.cfg.Storage.Get(r.Context(), t.kind, t.namespace, t.name)
	if err != nil {
		s.writeError(w, err)
		return
	}
	sc, err := scaleOf(t.kind, obj)
	if err != nil {
		s.writeError(w, err)
		return
	}
	s.writeObject(w, r, http.StatusOK, out, sc, autoscalingv1.SchemeGroupVersion)
}

// applyScale writes sc into a copy of the parent, carrying sc's
// resourceVersion as a precondition.
func applyScale(k *registry.Kind, current runtime.Object, sc *autoscalingv1.Scale) (runtime.Object, error) {
	if sc.Spec.Replicas < 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: autoscalingv1.GroupName, Kind: "Scale"}, sc.Name,
			field.ErrorList{field.Invalid(field.NewPath("spec", "replicas"), sc.Spec.Replicas, "must be greater than or equal to 0")})
	}
	obj := current.DeepCopyObject()
	k.Scale.Set(obj, sc.Spec.Replicas)
	if sc.ResourceVersion != "" {
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		m.SetResourceVersion(sc.ResourceVersion)
	}
	return obj, nil
}

func (s *Server) updateScale(w http.ResponseWriter, r *http.Request, t target) {
	out, err := s.negotiate(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	opts, err := s.updateOptions(r.URL.Query())
	if err != nil {
		s.writeError(w, err)
		return
	}
	body, err := s.readBody(r)
	if err != nil {
		s.writeError(w, err)
		return
	}
	obj, warnings, err := s.decodeBody(r, body, scaleGVK, opts.fieldValidation)
	if err != nil {
		s.writeError(w, err)
		return
	}
	sc := obj.(*autoscalingv1.Scale)
	if sc.Name != t.name {
		s.writeError(w, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", sc.Name, t.name)))
		return
	}
	updated, err := s.cfg.Storage.GuaranteedUpdate(r.Context(), t.kind, t.namespace, t.name,
		storage.Options{DryRun: opts.dryRun, FieldManager: managerFor(opts, r)},
		func(current runtime.Object) (runtime.Object, error) { return applyScale(t.kind, current, sc) })
	s.writeScale(w, r, out, t, updated, warnings, err)
}

// writeScale answers a write to /scale with the parent's new Scale, or with
// the write's error.
func (s *Server) writeScale(w http.ResponseWriter, r *http.Request, out output, t target, updated runtime.Object, warnings []string, err error) {
	if err != nil {
		s.writeError(w, err)
		return
	}
	res, err := scaleOf(t.kind, updated)
	if err != nil {
		s.writeError(w, err)
		return
	}
	addWarnings(w, warnings)
	s.writeObject(w, r, http.StatusOK, out, res, autoscalingv1.SchemeGroupVersion)
}
