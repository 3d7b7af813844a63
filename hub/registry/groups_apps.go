package registry

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ---- Deployment ----

var deploymentKind = &Kind{
	GVK:        appsv1.SchemeGroupVersion.WithKind("Deployment"),
	Resource:   "deployments",
	Singular:   "deployment",
	Namespaced: true,
	ShortNames: []string{"deploy"},
	Categories: []string{"all"},
	HasStatus:  true,
	HasSpec:    true,
	Scale: &ScaleAccess{
		Get: func(obj runtime.Object) (int32, int32, string) {
			d := obj.(*appsv1.Deployment)
			return int32Val(d.Spec.Replicas, 1), d.Status.Replicas, selectorString(d.Spec.Selector)
		},
		Set: func(obj runtime.Object, n int32) { obj.(*appsv1.Deployment).Spec.Replicas = &n },
	},
	Default: func(obj runtime.Object) { defaultDeployment(obj.(*appsv1.Deployment)) },
	GenerationChanged: func(obj, old runtime.Object) bool {
		d, o := obj.(*appsv1.Deployment), old.(*appsv1.Deployment)
		return !apiequality.Semantic.DeepEqual(d.Spec, o.Spec) || !apiequality.Semantic.DeepEqual(d.Annotations, o.Annotations)
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateDeploymentSpec(&obj.(*appsv1.Deployment).Spec)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		d, o := obj.(*appsv1.Deployment), old.(*appsv1.Deployment)
		errs := validateDeploymentSpec(&d.Spec)
		return append(errs, apivalidation.ValidateImmutableField(d.Spec.Selector, o.Spec.Selector, gSpec.Child("selector"))...)
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		s := obj.(*appsv1.Deployment).Status
		p := field.NewPath("status")
		errs := collisionCountDecremented(s.CollisionCount, old.(*appsv1.Deployment).Status.CollisionCount)
		errs = append(errs, nonNegative(s.ObservedGeneration, p.Child("observedGeneration"))...)
		errs = append(errs, nonNegative(int64(s.Replicas), p.Child("replicas"))...)
		errs = append(errs, nonNegative(int64(s.UpdatedReplicas), p.Child("updatedReplicas"))...)
		errs = append(errs, nonNegative(int64(s.ReadyReplicas), p.Child("readyReplicas"))...)
		errs = append(errs, nonNegative(int64(s.AvailableReplicas), p.Child("availableReplicas"))...)
		errs = append(errs, nonNegative(int64(s.UnavailableReplicas), p.Child("unavailableReplicas"))...)
		errs = append(errs, nonNegativePtr(s.TerminatingReplicas, p.Child("terminatingReplicas"))...)
		errs = append(errs, nonNegativePtr(s.CollisionCount, p.Child("collisionCount"))...)
		for _, c := range []struct {
			name string
			v    int32
		}{{"updatedReplicas", s.UpdatedReplicas}, {"readyReplicas", s.ReadyReplicas}, {"availableReplicas", s.AvailableReplicas}} {
			if c.v > s.Replicas {
				errs = append(errs, field.Invalid(p.Child(c.name), c.v, "cannot be greater than status.replicas"))
			}
		}
		if s.AvailableReplicas > s.ReadyReplicas {
			errs = append(errs, field.Invalid(p.Child("availableReplicas"), s.AvailableReplicas, "cannot be greater than readyReplicas"))
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Ready", "string", 0, "Number of the pod with ready state"),
		column("Up-to-date", "string", 0, "Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
		column("Available", "string", 0, "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment."),
		ageColumn,
		containersColumn, imagesColumn, selectorColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		d := obj.(*appsv1.Deployment)
		c, i := podContainersCells(&d.Spec.Template.Spec)
		return []any{d.Name, ratio(d.Status.ReadyReplicas, int32Val(d.Spec.Replicas, 0)), int64(d.Status.UpdatedReplicas),
			int64(d.Status.AvailableReplicas), age(d.CreationTimestamp, now), c, i, selectorString(d.Spec.Selector)}
	},
}

func defaultDeployment(d *appsv1.Deployment) {
	if d.Spec.Replicas == nil {
		d.Spec.Replicas = ptrTo[int32](1)
	}
	st := &d.Spec.Strategy
	if st.Type == "" {
		st.Type = appsv1.RollingUpdateDeploymentStrategyType
	}
	if st.Type == appsv1.RollingUpdateDeploymentStrategyType {
		if st.RollingUpdate == nil {
			st.RollingUpdate = &appsv1.RollingUpdateDeployment{}
		}
		if st.RollingUpdate.MaxUnavailable == nil {
			st.RollingUpdate.MaxUnavailable = ptrTo(intstr.FromString("25%"))
		}
		if st.RollingUpdate.MaxSurge == nil {
			st.RollingUpdate.MaxSurge = ptrTo(intstr.FromString("25%"))
		}
	}
	if d.Spec.RevisionHistoryLimit == nil {
		d.Spec.RevisionHistoryLimit = ptrTo[int32](10)
	}
	if d.Spec.ProgressDeadlineSeconds == nil {
		d.Spec.ProgressDeadlineSeconds = ptrTo[int32](600)
	}
	defaultPodSpec(&d.Spec.Template.Spec)
}

func validateDeploymentSpec(s *appsv1.DeploymentSpec) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, nonNegative(int64(int32Val(s.Replicas, 0)), gSpec.Child("replicas"))...)
	errs = append(errs, validateWorkloadSelector(s.Selector, &s.Template, "deployment", gSpec)...)
	errs = append(errs, validateWorkloadTemplate(&s.Template, "ReplicaSet", gSpec.Child("template"))...)
	sp := gSpec.Child("strategy")
	switch s.Strategy.Type {
	case appsv1.RecreateDeploymentStrategyType:
		if s.Strategy.RollingUpdate != nil {
			errs = append(errs, field.Forbidden(sp.Child("rollingUpdate"), "may not be specified when strategy `type` is 'Recreate'"))
		}
	case appsv1.RollingUpdateDeploymentStrategyType:
		if s.Strategy.RollingUpdate == nil {
			errs = append(errs, field.Required(sp.Child("rollingUpdate"), "this should be defaulted and never be nil"))
			break
		}
		ru, rp := s.Strategy.RollingUpdate, sp.Child("rollingUpdate")
		errs = append(errs, validateIntOrPercent(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
		errs = append(errs, validateIntOrPercent(ru.MaxSurge, rp.Child("maxSurge"))...)
		mu, _ := intOrPercentValue(ru.MaxUnavailable)
		ms, _ := intOrPercentValue(ru.MaxSurge)
		if mu == 0 && ms == 0 {
			errs = append(errs, field.Invalid(rp.Child("maxUnavailable"), ru.MaxUnavailable, "may not be 0 when `maxSurge` is 0"))
		}
		errs = append(errs, notMoreThan100Percent(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
	default:
		errs = append(errs, field.NotSupported(sp, s.Strategy,
			[]string{string(appsv1.RecreateDeploymentStrategyType), string(appsv1.RollingUpdateDeploymentStrategyType)}))
	}
	errs = append(errs, nonNegative(int64(s.MinReadySeconds), gSpec.Child("minReadySeconds"))...)
	errs = append(errs, nonNegativePtr(s.RevisionHistoryLimit, gSpec.Child("revisionHistoryLimit"))...)
	if s.ProgressDeadlineSeconds != nil {
		errs = append(errs, nonNegative(int64(*s.ProgressDeadlineSeconds), gSpec.Child("progressDeadlineSeconds"))...)
		if *s.ProgressDeadlineSeconds <= s.MinReadySeconds {
			errs = append(errs, field.Invalid(gSpec.Child("progressDeadlineSeconds"), *s.ProgressDeadlineSeconds, "must be greater than minReadySeconds"))
		}
	}
	return errs
}

// ---- ReplicaSet ----

var replicaSetKind = &Kind{
	GVK:        appsv1.SchemeGroupVersion.WithKind("ReplicaSet"),
	Resource:   "replicasets",
	Singular:   "replicaset",
	Namespaced: true,
	ShortNames: []string{"rs"},
	Categories: []string{"all"},
	HasStatus:  true,
	HasSpec:    true,
	Scale: &ScaleAccess{
		Get: func(obj runtime.Object) (int32, int32, string) {
			r := obj.(*appsv1.ReplicaSet)
			return int32Val(r.Spec.Replicas, 1), r.Status.Replicas, selectorString(r.Spec.Selector)
		},
		Set: func(obj runtime.Object, n int32) { obj.(*appsv1.ReplicaSet).Spec.Replicas = &n },
	},
	Default: func(obj runtime.Object) {
		r := obj.(*appsv1.ReplicaSet)
		if r.Spec.Replicas == nil {
			r.Spec.Replicas = ptrTo[int32](1)
		}
		defaultPodSpec(&r.Spec.Template.Spec)
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateReplicaSetSpec(&obj.(*appsv1.ReplicaSet).Spec)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		r, o := obj.(*appsv1.ReplicaSet), old.(*appsv1.ReplicaSet)
		errs := validateReplicaSetSpec(&r.Spec)
		return append(errs, apivalidation.ValidateImmutableField(r.Spec.Selector, o.Spec.Selector, gSpec.Child("selector"))...)
	},
	ValidateStatusUpdate: func(obj, _ runtime.Object) field.ErrorList {
		s := obj.(*appsv1.ReplicaSet).Status
		errs := validateReplicaCounts(s.Replicas, s.FullyLabeledReplicas, s.ReadyReplicas, s.AvailableReplicas, s.ObservedGeneration)
		return append(errs, nonNegativePtr(s.TerminatingReplicas, field.NewPath("status", "terminatingReplicas"))...)
	},
	Fields: func(obj runtime.Object) fields.Set {
		return fields.Set{"status.replicas": itoa32(obj.(*appsv1.ReplicaSet).Status.Replicas)}
	},
	FieldLabels: []string{"status.replicas"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Desired", "integer", 0, "Replicas is the number of desired replicas."),
		column("Current", "integer", 0, "Replicas is the most recently observed number of replicas."),
		column("Ready", "integer", 0, "The number of ready replicas for this replica set."),
		ageColumn,
		containersColumn, imagesColumn, selectorColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		r := obj.(*appsv1.ReplicaSet)
		c, i := podContainersCells(&r.Spec.Template.Spec)
		return []any{r.Name, int64(int32Val(r.Spec.Replicas, 0)), int64(r.Status.Replicas), int64(r.Status.ReadyReplicas),
			age(r.CreationTimestamp, now), c, i, selectorString(r.Spec.Selector)}
	},
}

func validateReplicaSetSpec(s *appsv1.ReplicaSetSpec) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, nonNegative(int64(int32Val(s.Replicas, 0)), gSpec.Child("replicas"))...)
	errs = append(errs, nonNegative(int64(s.MinReadySeconds), gSpec.Child("minReadySeconds"))...)
	errs = append(errs, validateWorkloadSelector(s.Selector, &s.Template, "deployment", gSpec)...)
	errs = append(errs, validateWorkloadTemplate(&s.Template, "ReplicaSet", gSpec.Child("template"))...)
	return errs
}

// ---- StatefulSet ----

var statefulSetKind = &Kind{
	GVK:        appsv1.SchemeGroupVersion.WithKind("StatefulSet"),
	Resource:   "statefulsets",
	Singular:   "statefulset",
	Namespaced: true,
	ShortNames: []string{"sts"},
	NameRule:   apivalidation.NameIsDNSLabel,
	Categories: []string{"all"},
	HasStatus:  true,
	HasSpec:    true,
	Scale: &ScaleAccess{
		Get: func(obj runtime.Object) (int32, int32, string) {
			s := obj.(*appsv1.StatefulSet)
			return int32Val(s.Spec.Replicas, 1), s.Status.Replicas, selectorString(s.Spec.Selector)
		},
		Set: func(obj runtime.Object, n int32) { obj.(*appsv1.StatefulSet).Spec.Replicas = &n },
	},
	Default: func(obj runtime.Object) { defaultStatefulSet(obj.(*appsv1.StatefulSet)) },
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateStatefulSetSpec(&obj.(*appsv1.StatefulSet).Spec)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		s, o := obj.(*appsv1.StatefulSet), old.(*appsv1.StatefulSet)
		errs := validateStatefulSetSpec(&s.Spec)
		// Only some fields may change; compare the rest with those reset.
		a, b := s.Spec.DeepCopy(), o.Spec.DeepCopy()
		for _, x := range []*appsv1.StatefulSetSpec{a, b} {
			x.Replicas, x.Ordinals, x.Template, x.UpdateStrategy = nil, nil, corev1.PodTemplateSpec{}, appsv1.StatefulSetUpdateStrategy{}
			x.RevisionHistoryLimit, x.PersistentVolumeClaimRetentionPolicy, x.MinReadySeconds = nil, nil, 0
		}
		if !apiequality.Semantic.DeepEqual(a, b) {
			errs = append(errs, field.Forbidden(gSpec, "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"))
		}
		return errs
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		s := obj.(*appsv1.StatefulSet).Status
		p := field.NewPath("status")
		errs := collisionCountDecremented(s.CollisionCount, old.(*appsv1.StatefulSet).Status.CollisionCount)
		errs = append(errs, nonNegative(int64(s.Replicas), p.Child("replicas"))...)
		errs = append(errs, nonNegative(int64(s.ReadyReplicas), p.Child("readyReplicas"))...)
		errs = append(errs, nonNegative(int64(s.CurrentReplicas), p.Child("currentReplicas"))...)
		errs = append(errs, nonNegative(int64(s.UpdatedReplicas), p.Child("updatedReplicas"))...)
		errs = append(errs, nonNegative(int64(s.AvailableReplicas), p.Child("availableReplicas"))...)
		errs = append(errs, nonNegative(s.ObservedGeneration, p.Child("observedGeneration"))...)
		errs = append(errs, nonNegativePtr(s.CollisionCount, p.Child("collisionCount"))...)
		for _, c := range []struct {
			name string
			v    int32
		}{{"readyReplicas", s.ReadyReplicas}, {"currentReplicas", s.CurrentReplicas}, {"updatedReplicas", s.UpdatedReplicas}, {"availableReplicas", s.AvailableReplicas}} {
			if c.v > s.Replicas {
				errs = append(errs, field.Invalid(p.Child(c.name), c.v, "cannot be greater than status.replicas"))
			}
		}
		if s.AvailableReplicas > s.ReadyReplicas {
			errs = append(errs, field.Invalid(p.Child("availableReplicas"), s.AvailableReplicas, "cannot be greater than status.readyReplicas"))
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Ready", "string", 0, "Number of the pod with ready state"),
		ageColumn,
		containersColumn, imagesColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		s := obj.(*appsv1.StatefulSet)
		c, i := podContainersCells(&s.Spec.Template.Spec)
		return []any{s.Name, ratio(s.Status.ReadyReplicas, int32Val(s.Spec.Replicas, 0)), age(s.CreationTimestamp, now), c, i}
	},
}

func defaultStatefulSet(s *appsv1.StatefulSet) {
	if s.Spec.PodManagementPolicy == "" {
		s.Spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement
	}
	us := &s.Spec.UpdateStrategy
	if us.Type == "" {
		us.Type = appsv1.RollingUpdateStatefulSetStrategyType
	}
	if us.Type == appsv1.RollingUpdateStatefulSetStrategyType {
		if us.RollingUpdate == nil {
			us.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{}
		}
		if us.RollingUpdate.Partition == nil {
			us.RollingUpdate.Partition = ptrTo[int32](0)
		}
	}
	if s.Spec.PersistentVolumeClaimRetentionPolicy == nil {
		s.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{}
	}
	rp := s.Spec.PersistentVolumeClaimRetentionPolicy
	if rp.WhenDeleted == "" {
		rp.WhenDeleted = appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	}
	if rp.WhenScaled == "" {
		rp.WhenScaled = appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	}
	if s.Spec.Replicas == nil {
		s.Spec.Replicas = ptrTo[int32](1)
	}
	if s.Spec.RevisionHistoryLimit == nil {
		s.Spec.RevisionHistoryLimit = ptrTo[int32](10)
	}
	for i := range s.Spec.VolumeClaimTemplates {
		pvc := &s.Spec.VolumeClaimTemplates[i]
		if pvc.Spec.VolumeMode == nil {
			pvc.Spec.VolumeMode = ptrTo(corev1.PersistentVolumeFilesystem)
		}
		if pvc.Status.Phase == "" {
			pvc.Status.Phase = corev1.ClaimPending
		}
	}
	defaultPodSpec(&s.Spec.Template.Spec)
}

func validateStatefulSetSpec(s *appsv1.StatefulSetSpec) field.ErrorList {
	var errs field.ErrorList
	switch s.PodManagementPolicy {
	case "":
		errs = append(errs, field.Required(gSpec.Child("podManagementPolicy"), ""))
	case appsv1.OrderedReadyPodManagement, appsv1.ParallelPodManagement:
	default:
		errs = append(errs, field.Invalid(gSpec.Child("podManagementPolicy"), s.PodManagementPolicy,
			"must be 'OrderedReady' or 'Parallel'"))
	}
	up := gSpec.Child("updateStrategy")
	switch s.UpdateStrategy.Type {
	case "":
		errs = append(errs, field.Required(up, ""))
	case appsv1.OnDeleteStatefulSetStrategyType:
		if s.UpdateStrategy.RollingUpdate != nil {
			errs = append(errs, field.Invalid(up.Child("rollingUpdate"), s.UpdateStrategy.RollingUpdate,
				"only allowed for updateStrategy 'RollingUpdate'"))
		}
	case appsv1.RollingUpdateStatefulSetStrategyType:
		if ru := s.UpdateStrategy.RollingUpdate; ru != nil {
			errs = append(errs, nonNegativePtr(ru.Partition, up.Child("rollingUpdate", "partition"))...)
			if ru.MaxUnavailable != nil {
				mp := up.Child("rollingUpdate", "maxUnavailable")
				errs = append(errs, validateIntOrPercent(ru.MaxUnavailable, mp)...)
				if n, _ := intOrPercentValue(ru.MaxUnavailable); n == 0 {
					errs = append(errs, field.Invalid(mp, ru.MaxUnavailable, "cannot be 0"))
				}
				errs = append(errs, notMoreThan100Percent(ru.MaxUnavailable, mp)...)
			}
		}
	default:
		errs = append(errs, field.Invalid(up, s.UpdateStrategy,
			"must be 'RollingUpdate' or 'OnDelete'"))
	}
	if rp := s.PersistentVolumeClaimRetentionPolicy; rp != nil {
		valid := []string{string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType), string(appsv1.DeletePersistentVolumeClaimRetentionPolicyType)}
		pp := gSpec.Child("persistentVolumeClaimRetentionPolicy")
		for name, v := range map[string]appsv1.PersistentVolumeClaimRetentionPolicyType{"whenDeleted": rp.WhenDeleted, "whenScaled": rp.WhenScaled} {
			if v != appsv1.RetainPersistentVolumeClaimRetentionPolicyType && v != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
				errs = append(errs, field.NotSupported(pp.Child(name), v, valid))
			}
		}
	}
	if s.Ordinals != nil {
		errs = append(errs, nonNegative(int64(s.Ordinals.Start), gSpec.Child("ordinals", "start"))...)
	}
	errs = append(errs, nonNegative(int64(int32Val(s.Replicas, 0)), gSpec.Child("replicas"))...)
	errs = append(errs, nonNegative(int64(s.MinReadySeconds), gSpec.Child("minReadySeconds"))...)
	errs = append(errs, nonNegativePtr(s.RevisionHistoryLimit, gSpec.Child("revisionHistoryLimit"))...)
	errs = append(errs, validateWorkloadSelector(s.Selector, &s.Template, "statefulset", gSpec)...)
	// Upstream checks only the template's labels and annotations here: its
	// volume mounts may name volumeClaimTemplates, which are not volumes.
	tp := gSpec.Child("template")
	errs = append(errs, validateObjectMetaLabels(s.Template.Labels, tp.Child("labels"))...)
	errs = append(errs, validateAnnotations(s.Template.Annotations, tp.Child("annotations"))...)
	errs = append(errs, validateDisconnectPolicy(s.Template.Annotations, tp.Child("metadata", "annotations"))...)
	errs = append(errs, validateAlwaysRestart(&s.Template, "StatefulSet", tp)...)
	return errs
}

// ---- DaemonSet ----

// daemonSetTemplateGenerationKey is the annotation in which apps/v1 keeps a
// DaemonSet's template generation, bumped on every template change.
const daemonSetTemplateGenerationKey = "deprecated.daemonset.template.generation"

var daemonSetKind = &Kind{
	GVK:        appsv1.SchemeGroupVersion.WithKind("DaemonSet"),
	Resource:   "daemonsets",
	Singular:   "daemonset",
	Namespaced: true,
	ShortNames: []string{"ds"},
	Categories: []string{"all"},
	HasStatus:  true,
	HasSpec:    true,
	Default: func(obj runtime.Object) {
		d := obj.(*appsv1.DaemonSet)
		us := &d.Spec.UpdateStrategy
		if us.Type == "" {
			us.Type = appsv1.RollingUpdateDaemonSetStrategyType
		}
		if us.Type == appsv1.RollingUpdateDaemonSetStrategyType {
			if us.RollingUpdate == nil {
				us.RollingUpdate = &appsv1.RollingUpdateDaemonSet{}
			}
			if us.RollingUpdate.MaxUnavailable == nil {
				us.RollingUpdate.MaxUnavailable = ptrTo(intstr.FromInt32(1))
			}
			if us.RollingUpdate.MaxSurge == nil {
				us.RollingUpdate.MaxSurge = ptrTo(intstr.FromInt32(0))
			}
		}
		if d.Spec.RevisionHistoryLimit == nil {
			d.Spec.RevisionHistoryLimit = ptrTo[int32](10)
		}
		defaultPodSpec(&d.Spec.Template.Spec)
	},
	PrepareForCreate: func(obj runtime.Object) {
		d := obj.(*appsv1.DaemonSet)
		if d.Annotations == nil {
			d.Annotations = map[string]string{}
		}
		d.Annotations[daemonSetTemplateGenerationKey] = "1"
	},
	PrepareForUpdate: func(obj, old runtime.Object) {
		d, o := obj.(*appsv1.DaemonSet), old.(*appsv1.DaemonSet)
		gen, _ := strconv.ParseInt(o.Annotations[daemonSetTemplateGenerationKey], 10, 64)
		if !apiequality.Semantic.DeepEqual(d.Spec.Template, o.Spec.Template) {
			gen++
		}
		if gen == 0 {
			return
		}
		if d.Annotations == nil {
			d.Annotations = map[string]string{}
		}
		d.Annotations[daemonSetTemplateGenerationKey] = strconv.FormatInt(gen, 10)
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validateDaemonSetSpec(&obj.(*appsv1.DaemonSet).Spec) },
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		d, o := obj.(*appsv1.DaemonSet), old.(*appsv1.DaemonSet)
		errs := validateDaemonSetSpec(&d.Spec)
		return append(errs, apivalidation.ValidateImmutableField(d.Spec.Selector, o.Spec.Selector, gSpec.Child("selector"))...)
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		s := obj.(*appsv1.DaemonSet).Status
		p := field.NewPath("status")
		errs := collisionCountDecremented(s.CollisionCount, old.(*appsv1.DaemonSet).Status.CollisionCount)
		errs = append(errs, nonNegative(int64(s.CurrentNumberScheduled), p.Child("currentNumberScheduled"))...)
		errs = append(errs, nonNegative(int64(s.NumberMisscheduled), p.Child("numberMisscheduled"))...)
		errs = append(errs, nonNegative(int64(s.DesiredNumberScheduled), p.Child("desiredNumberScheduled"))...)
		errs = append(errs, nonNegative(int64(s.NumberReady), p.Child("numberReady"))...)
		errs = append(errs, nonNegative(s.ObservedGeneration, p.Child("observedGeneration"))...)
		errs = append(errs, nonNegative(int64(s.UpdatedNumberScheduled), p.Child("updatedNumberScheduled"))...)
		errs = append(errs, nonNegative(int64(s.NumberAvailable), p.Child("numberAvailable"))...)
		errs = append(errs, nonNegative(int64(s.NumberUnavailable), p.Child("numberUnavailable"))...)
		errs = append(errs, nonNegativePtr(s.CollisionCount, p.Child("collisionCount"))...)
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Desired", "integer", 0, "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod)."),
		column("Current", "integer", 0, "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod."),
		column("Ready", "integer", 0, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready."),
		column("Up-to-date", "integer", 0, "The total number of nodes that are running updated daemon pod"),
		column("Available", "integer", 0, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)"),
		column("Node Selector", "string", 0, "NodeSelector is a selector which must be true for the pod to fit on a node."),
		ageColumn,
		containersColumn, imagesColumn, selectorColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		d := obj.(*appsv1.DaemonSet)
		c, i := podContainersCells(&d.Spec.Template.Spec)
		return []any{d.Name, int64(d.Status.DesiredNumberScheduled), int64(d.Status.CurrentNumberScheduled), int64(d.Status.NumberReady),
			int64(d.Status.UpdatedNumberScheduled), int64(d.Status.NumberAvailable), labels.FormatLabels(d.Spec.Template.Spec.NodeSelector),
			age(d.CreationTimestamp, now), c, i, metav1.FormatLabelSelector(d.Spec.Selector)}
	},
}

func validateDaemonSetSpec(s *appsv1.DaemonSetSpec) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateWorkloadSelector(s.Selector, &s.Template, "daemonset", gSpec)...)
	errs = append(errs, validateWorkloadTemplate(&s.Template, "DaemonSet", gSpec.Child("template"))...)
	errs = append(errs, nonNegative(int64(s.MinReadySeconds), gSpec.Child("minReadySeconds"))...)
	errs = append(errs, nonNegativePtr(s.RevisionHistoryLimit, gSpec.Child("revisionHistoryLimit"))...)
	up := gSpec.Child("updateStrategy")
	switch s.UpdateStrategy.Type {
	case appsv1.OnDeleteDaemonSetStrategyType:
	case appsv1.RollingUpdateDaemonSetStrategyType:
		ru := s.UpdateStrategy.RollingUpdate
		rp := up.Child("rollingUpdate")
		if ru == nil {
			errs = append(errs, field.Required(rp, ""))
			break
		}
		errs = append(errs, validateIntOrPercent(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
		errs = append(errs, notMoreThan100Percent(ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
		errs = append(errs, validateIntOrPercent(ru.MaxSurge, rp.Child("maxSurge"))...)
		errs = append(errs, notMoreThan100Percent(ru.MaxSurge, rp.Child("maxSurge"))...)
		mu, _ := intOrPercentValue(ru.MaxUnavailable)
		ms, _ := intOrPercentValue(ru.MaxSurge)
		switch {
		case mu == 0 && ms == 0:
			errs = append(errs, field.Required(rp.Child("maxUnavailable"), "cannot be 0 when maxSurge is 0"))
		case mu != 0 && ms != 0:
			errs = append(errs, field.Invalid(rp.Child("maxSurge"), ru.MaxSurge, "may not be set when maxUnavailable is non-zero"))
		}
	default:
		errs = append(errs, field.NotSupported(up, s.UpdateStrategy,
			[]string{string(appsv1.RollingUpdateDaemonSetStrategyType), string(appsv1.OnDeleteDaemonSetStrategyType)}))
	}
	return errs
}

// ---- ControllerRevision ----

var controllerRevisionKind = &Kind{
	GVK:        appsv1.SchemeGroupVersion.WithKind("ControllerRevision"),
	Resource:   "controllerrevisions",
	Singular:   "controllerrevision",
	Namespaced: true,
	Validate: func(obj runtime.Object) field.ErrorList {
		r := obj.(*appsv1.ControllerRevision)
		var errs field.ErrorList
		if r.Data.Raw == nil && r.Data.Object == nil {
			errs = append(errs, field.Required(field.NewPath("data"), "data is mandatory"))
		}
		return append(errs, nonNegative(r.Revision, field.NewPath("revision"))...)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		r, o := obj.(*appsv1.ControllerRevision), old.(*appsv1.ControllerRevision)
		errs := nonNegative(r.Revision, field.NewPath("revision"))
		if !bytes.Equal(r.Data.Raw, o.Data.Raw) {
			errs = append(errs, field.Invalid(field.NewPath("data"), "", apivalidation.FieldImmutableErrorMsg))
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Controller", "string", 0, "Controller of the object"),
		column("Revision", "string", 0, "Revision indicates the revision of the state represented by Data."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		r := obj.(*appsv1.ControllerRevision)
		controller := "<none>"
		if ref := metav1.GetControllerOf(r); ref != nil {
			gv, err := schema.ParseGroupVersion(ref.APIVersion)
			if err == nil {
				controller = strings.ToLower(gv.WithKind(ref.Kind).GroupKind().String()) + "/" + ref.Name
			}
		}
		return []any{r.Name, controller, r.Revision, age(r.CreationTimestamp, now)}
	},
}
