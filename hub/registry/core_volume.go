package registry

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var (
	supportedAccessModes = sets.New[string](string(corev1.ReadWriteOnce), string(corev1.ReadOnlyMany), string(corev1.ReadWriteMany), string(corev1.ReadWriteOncePod))
	supportedVolumeModes = sets.New[string](string(corev1.PersistentVolumeBlock), string(corev1.PersistentVolumeFilesystem))
	supportedReclaim     = sets.New[string](string(corev1.PersistentVolumeReclaimRecycle), string(corev1.PersistentVolumeReclaimDelete), string(corev1.PersistentVolumeReclaimRetain))
)

const betaStorageClassAnnotation = "volume.beta.kubernetes.io/storage-class"

func validateAccessModes(modes []corev1.PersistentVolumeAccessMode, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(modes) == 0 {
		return field.ErrorList{field.Required(path, "")}
	}
	for _, m := range modes {
		if !supportedAccessModes.Has(string(m)) {
			errs = append(errs, field.NotSupported(path, m, sets.List(supportedAccessModes)))
		}
		if m == corev1.ReadWriteOncePod && len(modes) > 1 {
			errs = append(errs, field.Forbidden(path, "may not use ReadWriteOncePod with other access modes"))
		}
	}
	return errs
}

func validateVolumeMode(m *corev1.PersistentVolumeMode, path *field.Path) field.ErrorList {
	if m != nil && !supportedVolumeModes.Has(string(*m)) {
		return field.ErrorList{field.NotSupported(path, *m, sets.List(supportedVolumeModes))}
	}
	return nil
}

func positiveQuantity(q resource.Quantity, path *field.Path) field.ErrorList {
	if q.Sign() <= 0 {
		return field.ErrorList{field.Invalid(path, q.String(), "must be greater than zero")}
	}
	return nil
}

func accessModesString(modes []corev1.PersistentVolumeAccessMode) string {
	has := func(m corev1.PersistentVolumeAccessMode) bool {
		for _, x := range modes {
			if x == m {
				return true
			}
		}
		return false
	}
	var out []string
	for _, m := range []struct {
		mode  corev1.PersistentVolumeAccessMode
		short string
	}{{corev1.ReadWriteOnce, "RWO"}, {corev1.ReadOnlyMany, "ROX"}, {corev1.ReadWriteMany, "RWX"}, {corev1.ReadWriteOncePod, "RWOP"}} {
		if has(m.mode) {
			out = append(out, m.short)
		}
	}
	return strings.Join(out, ",")
}

func volumeModeString(m *corev1.PersistentVolumeMode) string {
	if m == nil {
		return "<unset>"
	}
	return string(*m)
}

func ptrOrUnset(s *string) string {
	if s == nil {
		return "<unset>"
	}
	return *s
}

func storageClass(annotations map[string]string, name *string) string {
	if c, ok := annotations[betaStorageClassAnnotation]; ok {
		return c
	}
	if name != nil {
		return *name
	}
	return ""
}

var pvKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("PersistentVolume"),
	Resource:   "persistentvolumes",
	Singular:   "persistentvolume",
	ShortNames: []string{"pv"},
	HasStatus:  true,
	Default: func(obj runtime.Object) {
		pv := obj.(*corev1.PersistentVolume)
		if pv.Spec.PersistentVolumeReclaimPolicy == "" {
			pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		}
		if pv.Spec.VolumeMode == nil {
			m := corev1.PersistentVolumeFilesystem
			pv.Spec.VolumeMode = &m
		}
		if pv.Status.Phase == "" {
			pv.Status.Phase = corev1.VolumePending
		}
		if hp := pv.Spec.HostPath; hp != nil && hp.Type == nil {
			t := corev1.HostPathUnset
			hp.Type = &t
		}
	},
	PrepareForCreate: func(obj runtime.Object) {
		now := metav1.Now()
		obj.(*corev1.PersistentVolume).Status = corev1.PersistentVolumeStatus{Phase: corev1.VolumePending, LastPhaseTransitionTime: &now}
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validatePV(obj.(*corev1.PersistentVolume)) },
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		pv, o := obj.(*corev1.PersistentVolume), old.(*corev1.PersistentVolume)
		errs := validatePV(pv)
		if !apiequality.Semantic.DeepEqual(pv.Spec.PersistentVolumeSource, o.Spec.PersistentVolumeSource) {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "persistentvolumesource"), "spec.persistentvolumesource is immutable after creation"))
		}
		errs = append(errs, immutable(pv.Spec.VolumeMode, o.Spec.VolumeMode, field.NewPath("spec", "volumeMode"))...)
		return errs
	},
	PrepareForUpdate: func(obj, old runtime.Object) {
		pv, o := obj.(*corev1.PersistentVolume), old.(*corev1.PersistentVolume)
		if pv.Status.Phase != o.Status.Phase {
			now := metav1.Now()
			pv.Status.LastPhaseTransitionTime = &now
		}
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		pv := obj.(*corev1.PersistentVolume)
		ok := sets.New(string(corev1.VolumePending), string(corev1.VolumeAvailable), string(corev1.VolumeBound), string(corev1.VolumeReleased), string(corev1.VolumeFailed))
		if pv.Status.Phase != "" && !ok.Has(string(pv.Status.Phase)) {
			return field.ErrorList{field.NotSupported(field.NewPath("status", "phase"), pv.Status.Phase, sets.List(ok))}
		}
		return nil
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Capacity", "string", 0, "capacity is the description of the persistent volume's resources and capacity."),
		column("Access Modes", "string", 0, "accessModes contains all ways the volume can be mounted."),
		column("Reclaim Policy", "string", 0, "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim."),
		column("Status", "string", 0, "phase indicates if a volume is available, bound to a claim, or released by a claim."),
		column("Claim", "string", 0, "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim."),
		column("StorageClass", "string", 0, "storageClassName is the name of StorageClass to which this persistent volume belongs."),
		column("VolumeAttributesClass", "string", 0, "Name of VolumeAttributesClass to which this persistent volume belongs."),
		column("Reason", "string", 0, "reason is a brief CamelCase string that describes any failure."),
		ageColumn,
		column("VolumeMode", "string", 1, "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		pv := obj.(*corev1.PersistentVolume)
		claim := ""
		if pv.Spec.ClaimRef != nil {
			claim = pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name
		}
		q := pv.Spec.Capacity[corev1.ResourceStorage]
		phase := string(pv.Status.Phase)
		if pv.DeletionTimestamp != nil {
			phase = "Terminating"
		}
		return []any{pv.Name, q.String(), accessModesString(pv.Spec.AccessModes), string(pv.Spec.PersistentVolumeReclaimPolicy),
			phase, claim, storageClass(pv.Annotations, &pv.Spec.StorageClassName), ptrOrUnset(pv.Spec.VolumeAttributesClassName),
			pv.Status.Reason, age(pv.CreationTimestamp, now), volumeModeString(pv.Spec.VolumeMode)}
	},
}

func validatePV(pv *corev1.PersistentVolume) field.ErrorList {
	sp := field.NewPath("spec")
	errs := validateAccessModes(pv.Spec.AccessModes, sp.Child("accessModes"))
	if len(pv.Spec.Capacity) == 0 {
		errs = append(errs, field.Required(sp.Child("capacity"), ""))
	} else if _, ok := pv.Spec.Capacity[corev1.ResourceStorage]; !ok || len(pv.Spec.Capacity) > 1 {
		errs = append(errs, field.NotSupported(sp.Child("capacity"), pv.Spec.Capacity, []string{string(corev1.ResourceStorage)}))
	}
	for name, q := range pv.Spec.Capacity {
		errs = append(errs, positiveQuantity(q, sp.Child("capacity").Key(string(name)))...)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != "" && !supportedReclaim.Has(string(pv.Spec.PersistentVolumeReclaimPolicy)) {
		errs = append(errs, field.NotSupported(sp.Child("persistentVolumeReclaimPolicy"), pv.Spec.PersistentVolumeReclaimPolicy, sets.List(supportedReclaim)))
	}
	errs = append(errs, validateVolumeMode(pv.Spec.VolumeMode, sp.Child("volumeMode"))...)
	switch n := countSet(pv.Spec.PersistentVolumeSource); {
	case n == 0:
		errs = append(errs, field.Required(sp, "must specify a volume type"))
	case n > 1:
		errs = append(errs, field.Forbidden(sp, "may not specify more than 1 volume type"))
	}
	if hp := pv.Spec.HostPath; hp != nil && hp.Path == "" {
		errs = append(errs, field.Required(sp.Child("hostPath", "path"), ""))
	}
	if l := pv.Spec.Local; l != nil {
		if l.Path == "" {
			errs = append(errs, field.Required(sp.Child("local", "path"), ""))
		}
		if pv.Spec.NodeAffinity == nil {
			errs = append(errs, field.Required(sp.Child("nodeAffinity"), "Local volume requires node affinity"))
		}
	}
	if pv.Spec.StorageClassName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(pv.Spec.StorageClassName) {
			errs = append(errs, field.Invalid(sp.Child("storageClassName"), pv.Spec.StorageClassName, msg))
		}
	}
	return errs
}

var pvcKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"),
	Resource:   "persistentvolumeclaims",
	Singular:   "persistentvolumeclaim",
	Namespaced: true,
	ShortNames: []string{"pvc"},
	HasStatus:  true,
	Admit:      admitPVC,
	Default: func(obj runtime.Object) {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		if pvc.Spec.VolumeMode == nil {
			m := corev1.PersistentVolumeFilesystem
			pvc.Spec.VolumeMode = &m
		}
		if pvc.Status.Phase == "" {
			pvc.Status.Phase = corev1.ClaimPending
		}
	},
	PrepareForCreate: func(obj runtime.Object) {
		obj.(*corev1.PersistentVolumeClaim).Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validatePVCSpec(&obj.(*corev1.PersistentVolumeClaim).Spec, field.NewPath("spec"))
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validatePVCUpdate(obj.(*corev1.PersistentVolumeClaim), old.(*corev1.PersistentVolumeClaim))
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		var errs field.ErrorList
		for name, q := range pvc.Status.Capacity {
			errs = append(errs, validateResourceQuantity(name, q, field.NewPath("status", "capacity").Key(string(name)))...)
		}
		if len(pvc.Spec.AccessModes) > 0 {
			for _, m := range pvc.Status.AccessModes {
				if !supportedAccessModes.Has(string(m)) {
					errs = append(errs, field.NotSupported(field.NewPath("status", "accessModes"), m, sets.List(supportedAccessModes)))
				}
			}
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Status", "string", 0, "phase represents the current phase of PersistentVolumeClaim."),
		column("Volume", "string", 0, "volumeName is the binding reference to the PersistentVolume backing this claim."),
		column("Capacity", "string", 0, "capacity represents the actual resources of the underlying volume."),
		column("Access Modes", "string", 0, "accessModes contains the actual access modes the volume backing the PVC has."),
		column("StorageClass", "string", 0, "storageClassName is the name of the StorageClass required by the claim."),
		column("VolumeAttributesClass", "string", 0, "volumeAttributesClassName may be used to set the VolumeAttributesClass used by this claim."),
		ageColumn,
		column("VolumeMode", "string", 1, "volumeMode defines what type of volume is required by the claim."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		phase := string(pvc.Status.Phase)
		if pvc.DeletionTimestamp != nil {
			phase = "Terminating"
		}
		capacity, modes := "", ""
		if pvc.Spec.VolumeName != "" {
			modes = accessModesString(pvc.Status.AccessModes)
			q := pvc.Status.Capacity[corev1.ResourceStorage]
			capacity = q.String()
		}
		return []any{pvc.Name, phase, pvc.Spec.VolumeName, capacity, modes,
			storageClass(pvc.Annotations, pvc.Spec.StorageClassName), ptrOrUnset(pvc.Spec.VolumeAttributesClassName),
			age(pvc.CreationTimestamp, now), volumeModeString(pvc.Spec.VolumeMode)}
	},
}

func validatePVCSpec(spec *corev1.PersistentVolumeClaimSpec, sp *field.Path) field.ErrorList {
	errs := validateAccessModes(spec.AccessModes, sp.Child("accessModes"))
	if spec.Selector != nil {
		errs = append(errs, validateLabelSelector(spec.Selector, sp.Child("selector"))...)
	}
	rp := sp.Child("resources", "requests").Key(string(corev1.ResourceStorage))
	if q, ok := spec.Resources.Requests[corev1.ResourceStorage]; !ok {
		errs = append(errs, field.Required(rp, ""))
	} else {
		errs = append(errs, positiveQuantity(q, rp)...)
	}
	for name, q := range spec.Resources.Requests {
		if name != corev1.ResourceStorage {
			errs = append(errs, validateResourceQuantity(name, q, sp.Child("resources", "requests").Key(string(name)))...)
		}
	}
	errs = append(errs, validateVolumeMode(spec.VolumeMode, sp.Child("volumeMode"))...)
	if spec.StorageClassName != nil && *spec.StorageClassName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(*spec.StorageClassName) {
			errs = append(errs, field.Invalid(sp.Child("storageClassName"), *spec.StorageClassName, msg))
		}
	}
	return errs
}

func validatePVCUpdate(pvc, old *corev1.PersistentVolumeClaim) field.ErrorList {
	sp := field.NewPath("spec")
	errs := validatePVCSpec(&pvc.Spec, sp)
	munged := pvc.Spec.DeepCopy()
	// Binding may set the volume name once.
	if old.Spec.VolumeName == "" {
		munged.VolumeName = old.Spec.VolumeName
	}
	munged.VolumeAttributesClassName = old.Spec.VolumeAttributesClassName
	bound := old.Status.Phase == corev1.ClaimBound
	if bound {
		munged.Resources.Requests = old.Spec.Resources.Requests
		// Only a shrinking request is checked against the capacity: a
		// claim bound to a larger volume keeps its smaller request.
		newQ := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
		oldQ := old.Spec.Resources.Requests[corev1.ResourceStorage]
		if capQ, ok := old.Status.Capacity[corev1.ResourceStorage]; ok && newQ.Cmp(oldQ) < 0 && newQ.Cmp(capQ) <= 0 {
			errs = append(errs, field.Forbidden(sp.Child("resources", "requests", "storage"), "field can not be less than status.capacity"))
		}
	}
	if !apiequality.Semantic.DeepEqual(*munged, old.Spec) {
		errs = append(errs, field.Forbidden(sp, "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"))
	}
	return errs
}
