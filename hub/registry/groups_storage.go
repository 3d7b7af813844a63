package registry

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ---- StorageClass ----

// annDefaultStorageClass marks the class claims without one get.
const annDefaultStorageClass = "storageclass.kubernetes.io/is-default-class"

var storageClassKind = &Kind{
	GVK:        storagev1.SchemeGroupVersion.WithKind("StorageClass"),
	Resource:   "storageclasses",
	Singular:   "storageclass",
	ShortNames: []string{"sc"},
	Default: func(obj runtime.Object) {
		sc := obj.(*storagev1.StorageClass)
		if sc.ReclaimPolicy == nil {
			sc.ReclaimPolicy = ptrTo(corev1.PersistentVolumeReclaimDelete)
		}
		if sc.VolumeBindingMode == nil {
			sc.VolumeBindingMode = ptrTo(storagev1.VolumeBindingImmediate)
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateStorageClass(obj.(*storagev1.StorageClass))
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		sc, o := obj.(*storagev1.StorageClass), old.(*storagev1.StorageClass)
		errs := validateStorageClass(sc)
		if !equalStringMaps(sc.Parameters, o.Parameters) {
			errs = append(errs, field.Forbidden(field.NewPath("parameters"), "updates to parameters are forbidden."))
		}
		if sc.Provisioner != o.Provisioner {
			errs = append(errs, field.Forbidden(field.NewPath("provisioner"), "updates to provisioner are forbidden."))
		}
		if *sc.ReclaimPolicy != *o.ReclaimPolicy {
			errs = append(errs, field.Forbidden(field.NewPath("reclaimPolicy"), "updates to reclaimPolicy are forbidden."))
		}
		errs = append(errs, apivalidation.ValidateImmutableField(sc.VolumeBindingMode, o.VolumeBindingMode, field.NewPath("volumeBindingMode"))...)
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Provisioner", "string", 0, "provisioner indicates the type of the provisioner."),
		column("ReclaimPolicy", "string", 0, "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class."),
		column("VolumeBindingMode", "string", 0, "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound."),
		column("AllowVolumeExpansion", "string", 0, "allowVolumeExpansion shows whether the storage class allow volume expand."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		sc := obj.(*storagev1.StorageClass)
		name := sc.Name
		if isDefaultClass(sc) {
			name += " (default)"
		}
		reclaim, mode := string(corev1.PersistentVolumeReclaimDelete), string(storagev1.VolumeBindingImmediate)
		if sc.ReclaimPolicy != nil {
			reclaim = string(*sc.ReclaimPolicy)
		}
		if sc.VolumeBindingMode != nil {
			mode = string(*sc.VolumeBindingMode)
		}
		expand := "false"
		if sc.AllowVolumeExpansion != nil && *sc.AllowVolumeExpansion {
			expand = "true"
		}
		return []any{name, sc.Provisioner, reclaim, mode, expand, age(sc.CreationTimestamp, now)}
	},
}

func isDefaultClass(sc *storagev1.StorageClass) bool {
	return sc.Annotations[annDefaultStorageClass] == "true" || sc.Annotations["storageclass.beta.kubernetes.io/is-default-class"] == "true"
}

func equalStringMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func validateStorageClass(sc *storagev1.StorageClass) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("provisioner")
	switch {
	case sc.Provisioner == "":
		errs = append(errs, field.Required(p, ""))
	case len(sc.Provisioner) > 63:
		errs = append(errs, field.TooLongMaxLength(p, sc.Provisioner, 63))
	default:
		for _, msg := range validation.IsQualifiedName(strings.ToLower(sc.Provisioner)) {
			errs = append(errs, field.Invalid(p, sc.Provisioner, msg))
		}
	}
	if sc.ReclaimPolicy != nil && *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete && *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		errs = append(errs, field.NotSupported(field.NewPath("reclaimPolicy"), *sc.ReclaimPolicy,
			[]string{string(corev1.PersistentVolumeReclaimDelete), string(corev1.PersistentVolumeReclaimRetain)}))
	}
	if m := sc.VolumeBindingMode; m == nil {
		errs = append(errs, field.Required(field.NewPath("volumeBindingMode"), ""))
	} else if *m != storagev1.VolumeBindingImmediate && *m != storagev1.VolumeBindingWaitForFirstConsumer {
		errs = append(errs, field.NotSupported(field.NewPath("volumeBindingMode"), *m,
			[]string{string(storagev1.VolumeBindingImmediate), string(storagev1.VolumeBindingWaitForFirstConsumer)}))
	}
	return errs
}

// admitPVC gives a claim that names no class the default StorageClass, as
// the upstream DefaultStorageClass admission plugin does: the newest of
// the classes marked default, if any.
func admitPVC(ctx context.Context, l Lister, obj, old runtime.Object) error {
	if old != nil || l == nil {
		return nil
	}
	pvc := obj.(*corev1.PersistentVolumeClaim)
	if pvc.Spec.StorageClassName != nil {
		return nil
	}
	if _, ok := pvc.Annotations[betaStorageClassAnnotation]; ok {
		return nil
	}
	classes, err := l.List(ctx, "storageclasses.storage.k8s.io", "")
	if err != nil {
		return fmt.Errorf("list storage classes: %w", err)
	}
	var defaults []*storagev1.StorageClass
	for _, o := range classes {
		if sc, ok := o.(*storagev1.StorageClass); ok && isDefaultClass(sc) {
			defaults = append(defaults, sc)
		}
	}
	if len(defaults) == 0 {
		return nil
	}
	sort.Slice(defaults, func(i, j int) bool {
		a, b := defaults[i].CreationTimestamp, defaults[j].CreationTimestamp
		if !a.Equal(&b) {
			return b.Before(&a)
		}
		return defaults[i].Name < defaults[j].Name
	})
	pvc.Spec.StorageClassName = &defaults[0].Name
	return nil
}
