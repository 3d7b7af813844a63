package storage

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"sigs.k8s.io/yaml"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// Apply implements API.
func (s *Storage) Apply(ctx context.Context, k *registry.Kind, namespace, name string, patch []byte, opts Options) (runtime.Object, bool, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, false, err
	}
	if opts.FieldManager == "" {
		return nil, false, apierrors.NewBadRequest("PATCH /apply requires fieldManager to be set")
	}
	// Numbers decode as int64 where they are integers, as upstream's
	// unstructured decoding does: a schema's integer fields refuse float64.
	var pm map[string]any
	js, err := yaml.YAMLToJSON(patch)
	if err == nil {
		err = utiljson.Unmarshal(js, &pm)
	}
	if err != nil {
		return nil, false, apierrors.NewBadRequest(fmt.Sprintf("error decoding YAML: %v", err))
	}
	if pm == nil {
		return nil, false, apierrors.NewBadRequest("the apply patch is empty")
	}
	po := &unstructured.Unstructured{Object: pm}
	if po.GetAPIVersion() != k.GVK.GroupVersion().String() || po.GetKind() != k.GVK.Kind {
		return nil, false, apierrors.NewBadRequest(fmt.Sprintf("the apply patch has apiVersion %q and kind %q, expected %q and %q",
			po.GetAPIVersion(), po.GetKind(), k.GVK.GroupVersion().String(), k.GVK.Kind))
	}
	if po.GetName() != "" && po.GetName() != name {
		return nil, false, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", po.GetName(), name))
	}
	if k.Namespaced && po.GetNamespace() != "" && po.GetNamespace() != namespace {
		return nil, false, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
	}
	fm, err := s.fieldManager(k, opts.Subresource, false)
	if err != nil {
		return nil, false, err
	}
	_, err = s.st.Get(ctx, s.key(k, namespace, name))
	if errors.Is(err, store.ErrNotFound) {
		if opts.Subresource != "" {
			return nil, false, apierrors.NewNotFound(k.GroupResource(), name)
		}
		live, err := s.newObjectOf(k)
		if err != nil {
			return nil, false, err
		}
		lm, _ := meta.Accessor(live)
		lm.SetName(name)
		if k.Namespaced {
			lm.SetNamespace(namespace)
		}
		obj, err := fm.Apply(live, po.DeepCopy(), opts.FieldManager, opts.Force)
		if err != nil {
			return nil, false, applyError(err)
		}
		out, err := s.create(ctx, k, namespace, obj, opts, false)
		if apierrors.IsAlreadyExists(err) {
			// Created concurrently: apply to what is there now.
			out, err = s.applyUpdate(ctx, k, namespace, name, po, fm, opts)
			return out, false, err
		}
		return out, err == nil, err
	}
	if err != nil {
		return nil, false, storeError(err, k.GroupResource(), name)
	}
	out, err := s.applyUpdate(ctx, k, namespace, name, po, fm, opts)
	return out, false, err
}

func (s *Storage) applyUpdate(ctx context.Context, k *registry.Kind, namespace, name string, po *unstructured.Unstructured, fm *managedfields.FieldManager, opts Options) (runtime.Object, error) {
	return s.update(ctx, k, namespace, name, opts, applied, func(cur runtime.Object) (runtime.Object, error) {
		obj, err := fm.Apply(withType(k, cur), po.DeepCopy(), opts.FieldManager, opts.Force)
		if err != nil {
			return nil, applyError(err)
		}
		if po.GetResourceVersion() == "" {
			if m, err := meta.Accessor(obj); err == nil {
				m.SetResourceVersion("")
			}
		}
		return obj, nil
	})
}

func applyError(err error) error {
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		return se
	}
	var ae apierrors.APIStatus
	if errors.As(err, &ae) {
		return &apierrors.StatusError{ErrStatus: ae.Status()}
	}
	return apierrors.NewBadRequest(err.Error())
}
