package admission

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
)

// The finalizers that keep a claim in use by a pod, and a volume bound to
// a claim, from going; the volume controller removes them once nothing
// uses the object any more.
const (
	pvcProtectionFinalizer = "kubernetes.io/pvc-protection"
	pvProtectionFinalizer  = "kubernetes.io/pv-protection"
)

// protection is upstream's StorageObjectInUseProtection: every new claim
// and volume carries its protection finalizer from its first write, so one
// deleted before the volume controller has seen it is protected too.
type protection struct{}

func (protection) AdmitCreate(_ context.Context, k *registry.Kind, obj runtime.Object, _ bool) (func(), error) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		if k == pvcKind && !slices.Contains(o.Finalizers, pvcProtectionFinalizer) {
			o.Finalizers = append(o.Finalizers, pvcProtectionFinalizer)
		}
	case *corev1.PersistentVolume:
		if k == pvKind && !slices.Contains(o.Finalizers, pvProtectionFinalizer) {
			o.Finalizers = append(o.Finalizers, pvProtectionFinalizer)
		}
	}
	return nil, nil
}
