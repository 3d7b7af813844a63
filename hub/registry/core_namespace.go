package registry

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var namespaceKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("Namespace"),
	Resource:   "namespaces",
	Singular:   "namespace",
	ShortNames: []string{"ns"},
	HasStatus:  true,
	Verbs:      []string{"create", "delete", "get", "list", "patch", "update", "watch"},
	Default: func(obj runtime.Object) {
		ns := obj.(*corev1.Namespace)
		if ns.Name != "" {
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			ns.Labels[corev1.LabelMetadataName] = ns.Name
		}
		if ns.Status.Phase == "" {
			ns.Status.Phase = corev1.NamespaceActive
		}
	},
	PrepareForCreate: func(obj runtime.Object) {
		ns := obj.(*corev1.Namespace)
		ns.Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive}
		if !containsFinalizer(ns.Spec.Finalizers, corev1.FinalizerKubernetes) {
			ns.Spec.Finalizers = append(ns.Spec.Finalizers, corev1.FinalizerKubernetes)
		}
		if ns.Name != "" {
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			ns.Labels[corev1.LabelMetadataName] = ns.Name
		}
	},
	PrepareForUpdate: func(obj, old runtime.Object) {
		// Finalizers change only through the finalize subresource.
		obj.(*corev1.Namespace).Spec.Finalizers = old.(*corev1.Namespace).Spec.Finalizers
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateNamespaceFinalizers(obj.(*corev1.Namespace).Spec.Finalizers, field.NewPath("spec", "finalizers"))
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		ns := obj.(*corev1.Namespace)
		p := field.NewPath("status", "phase")
		if ns.DeletionTimestamp.IsZero() {
			if ns.Status.Phase != corev1.NamespaceActive {
				return field.ErrorList{field.Invalid(p, ns.Status.Phase, "A namespace may only be in active status if it does not have a deletion timestamp.")}
			}
		} else if ns.Status.Phase != corev1.NamespaceTerminating {
			return field.ErrorList{field.Invalid(p, ns.Status.Phase, "A namespace may only be in terminating status if it has a deletion timestamp.")}
		}
		return nil
	},
	NameRule: func(name string, prefix bool) []string {
		if prefix {
			name = maskTrailingDash(name)
		}
		return validation.IsDNS1123Label(name)
	},
	Fields: func(obj runtime.Object) fields.Set {
		ns := obj.(*corev1.Namespace)
		return fields.Set{"status.phase": string(ns.Status.Phase), "name": ns.Name}
	},
	FieldLabels: []string{"status.phase", "name"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Status", "string", 0, "The status of the namespace"),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		ns := obj.(*corev1.Namespace)
		return []any{ns.Name, string(ns.Status.Phase), age(ns.CreationTimestamp, now)}
	},
}

func containsFinalizer(list []corev1.FinalizerName, f corev1.FinalizerName) bool {
	for _, x := range list {
		if x == f {
			return true
		}
	}
	return false
}

func validateNamespaceFinalizers(fs []corev1.FinalizerName, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range fs {
		name := string(f)
		for _, msg := range validation.IsQualifiedName(name) {
			errs = append(errs, field.Invalid(path, name, msg))
		}
		if !strings.Contains(name, "/") && f != corev1.FinalizerKubernetes {
			errs = append(errs, field.Invalid(path, name, "name is neither a standard finalizer name nor is it fully qualified"))
		}
	}
	return errs
}
