package registry

import (
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ---- ReplicationController ----

// replicationControllerKind is core/v1 ReplicationController, the
// predecessor of apps/v1 ReplicaSet: an equality-only selector map, a
// template that may be omitted in the type (but not in a valid object),
// and, as upstream serves the v1 API, orphaning dependents when a delete
// names no propagation policy.
var replicationControllerKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("ReplicationController"),
	Resource:   "replicationcontrollers",
	Singular:   "replicationcontroller",
	Namespaced: true,
	ShortNames: []string{"rc"},
	Categories: []string{"all"},
	HasStatus:  true,
	HasSpec:    true,
	DefaultGC:  metav1.DeletePropagationOrphan,
	Scale: &ScaleAccess{
		Get: func(obj runtime.Object) (int32, int32, string) {
			rc := obj.(*corev1.ReplicationController)
			return int32Val(rc.Spec.Replicas, 1), rc.Status.Replicas, labels.SelectorFromSet(rc.Spec.Selector).String()
		},
		Set: func(obj runtime.Object, n int32) { obj.(*corev1.ReplicationController).Spec.Replicas = &n },
	},
	Default: func(obj runtime.Object) { defaultReplicationController(obj.(*corev1.ReplicationController)) },
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateReplicationControllerSpec(&obj.(*corev1.ReplicationController).Spec)
	},
	ValidateStatusUpdate: func(obj, _ runtime.Object) field.ErrorList {
		s := obj.(*corev1.ReplicationController).Status
		return validateReplicaCounts(s.Replicas, s.FullyLabeledReplicas, s.ReadyReplicas, s.AvailableReplicas, s.ObservedGeneration)
	},
	Fields: func(obj runtime.Object) fields.Set {
		return fields.Set{"status.replicas": itoa32(obj.(*corev1.ReplicationController).Status.Replicas)}
	},
	FieldLabels: []string{"status.replicas"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Desired", "integer", 0, corev1.ReplicationControllerSpec{}.SwaggerDoc()["replicas"]),
		column("Current", "integer", 0, corev1.ReplicationControllerStatus{}.SwaggerDoc()["replicas"]),
		column("Ready", "integer", 0, corev1.ReplicationControllerStatus{}.SwaggerDoc()["readyReplicas"]),
		ageColumn,
		containersColumn, imagesColumn,
		column("Selector", "string", 1, corev1.ReplicationControllerSpec{}.SwaggerDoc()["selector"]),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		rc := obj.(*corev1.ReplicationController)
		var c, i string
		if rc.Spec.Template != nil {
			c, i = podContainersCells(&rc.Spec.Template.Spec)
		}
		return []any{rc.Name, int64(int32Val(rc.Spec.Replicas, 0)), int64(rc.Status.Replicas), int64(rc.Status.ReadyReplicas),
			age(rc.CreationTimestamp, now), c, i, labels.FormatLabels(rc.Spec.Selector)}
	},
}

// defaultReplicationController fills what upstream's v1 defaulting does:
// the selector and the object's own labels from the template's labels when
// they are empty, one replica, and the template's pod spec defaults.
func defaultReplicationController(rc *corev1.ReplicationController) {
	if t := rc.Spec.Template; t != nil && t.Labels != nil {
		if len(rc.Spec.Selector) == 0 {
			rc.Spec.Selector = maps.Clone(t.Labels)
		}
		if len(rc.Labels) == 0 {
			rc.Labels = maps.Clone(t.Labels)
		}
	}
	if rc.Spec.Replicas == nil {
		rc.Spec.Replicas = ptrTo[int32](1)
	}
	if rc.Spec.Template != nil {
		defaultPodSpec(&rc.Spec.Template.Spec)
	}
}

func validateReplicationControllerSpec(s *corev1.ReplicationControllerSpec) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, nonNegative(int64(s.MinReadySeconds), gSpec.Child("minReadySeconds"))...)
	sel := labels.SelectorFromSet(s.Selector)
	if sel.Empty() {
		errs = append(errs, field.Required(gSpec.Child("selector"), ""))
	}
	errs = append(errs, nonNegative(int64(int32Val(s.Replicas, 0)), gSpec.Child("replicas"))...)
	tp := gSpec.Child("template")
	if s.Template == nil {
		return append(errs, field.Required(tp, ""))
	}
	if !sel.Empty() && !sel.Matches(labels.Set(s.Template.Labels)) {
		errs = append(errs, field.Invalid(tp.Child("metadata", "labels"), s.Template.Labels, "`selector` does not match template `labels`"))
	}
	return append(errs, validateWorkloadTemplate(s.Template, "ReplicationController", tp)...)
}

// validateReplicaCounts checks the counts a ReplicaSet or a
// ReplicationController reports in its status.
func validateReplicaCounts(replicas, fullyLabeled, ready, available int32, observedGeneration int64) field.ErrorList {
	p := field.NewPath("status")
	var errs field.ErrorList
	errs = append(errs, nonNegative(int64(replicas), p.Child("replicas"))...)
	errs = append(errs, nonNegative(int64(fullyLabeled), p.Child("fullyLabeledReplicas"))...)
	errs = append(errs, nonNegative(int64(ready), p.Child("readyReplicas"))...)
	errs = append(errs, nonNegative(int64(available), p.Child("availableReplicas"))...)
	errs = append(errs, nonNegative(observedGeneration, p.Child("observedGeneration"))...)
	if fullyLabeled > replicas {
		errs = append(errs, field.Invalid(p.Child("fullyLabeledReplicas"), fullyLabeled, "cannot be greater than status.replicas"))
	}
	if ready > replicas {
		errs = append(errs, field.Invalid(p.Child("readyReplicas"), ready, "cannot be greater than status.replicas"))
	}
	if available > replicas {
		errs = append(errs, field.Invalid(p.Child("availableReplicas"), available, "cannot be greater than status.replicas"))
	}
	if available > ready {
		errs = append(errs, field.Invalid(p.Child("availableReplicas"), available, "cannot be greater than readyReplicas"))
	}
	return errs
}

// ---- PodTemplate ----

var podTemplateKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("PodTemplate"),
	Resource:   "podtemplates",
	Singular:   "podtemplate",
	Namespaced: true,
	// PodTemplate has no spec; its generation counts template changes.
	HasSpec: true,
	GenerationChanged: func(obj, old runtime.Object) bool {
		return !apiequality.Semantic.DeepEqual(obj.(*corev1.PodTemplate).Template, old.(*corev1.PodTemplate).Template)
	},
	Default: func(obj runtime.Object) { defaultPodSpec(&obj.(*corev1.PodTemplate).Template.Spec) },
	Validate: func(obj runtime.Object) field.ErrorList {
		return validatePodTemplateSpec(&obj.(*corev1.PodTemplate).Template, field.NewPath("template"))
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Containers", "string", 0, "Names of each container in the template."),
		column("Images", "string", 0, "Images referenced by each container in the template."),
		column("Pod Labels", "string", 0, "The labels for the pod template."),
	},
	Cells: func(obj runtime.Object, _ time.Time) []any {
		pt := obj.(*corev1.PodTemplate)
		c, i := podContainersCells(&pt.Template.Spec)
		return []any{pt.Name, c, i, labels.FormatLabels(pt.Template.Labels)}
	},
}
