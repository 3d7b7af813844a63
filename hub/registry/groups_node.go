package registry

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ---- RuntimeClass ----

// runtimeClassesResource is the group-qualified resource pods' admission
// lists to resolve spec.runtimeClassName.
const runtimeClassesResource = "runtimeclasses.node.k8s.io"

var runtimeClassKind = &Kind{
	GVK:      nodev1.SchemeGroupVersion.WithKind("RuntimeClass"),
	Resource: "runtimeclasses",
	Singular: "runtimeclass",
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateRuntimeClass(obj.(*nodev1.RuntimeClass))
	},
	// As upstream, an update checks only that the handler is unchanged:
	// overhead and scheduling were checked when the class was created.
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		rc, o := obj.(*nodev1.RuntimeClass), old.(*nodev1.RuntimeClass)
		return apivalidation.ValidateImmutableField(rc.Handler, o.Handler, field.NewPath("handler"))
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Handler", "string", 0, "Handler specifies the underlying runtime and configuration that the CRI implementation will use to handle pods of this class."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		rc := obj.(*nodev1.RuntimeClass)
		return []any{rc.Name, rc.Handler, age(rc.CreationTimestamp, now)}
	},
}

// validateRuntimeClass checks a RuntimeClass as upstream does: the handler
// is a DNS label, the fixed overhead is a valid resource list, and the
// scheduling constraints are valid labels and unique valid tolerations.
func validateRuntimeClass(rc *nodev1.RuntimeClass) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range apivalidation.NameIsDNSLabel(rc.Handler, false) {
		errs = append(errs, field.Invalid(field.NewPath("handler"), rc.Handler, msg))
	}
	if rc.Overhead != nil {
		errs = append(errs, validateResources(&corev1.ResourceRequirements{Limits: rc.Overhead.PodFixed}, field.NewPath("overhead"))...)
	}
	if s := rc.Scheduling; s != nil {
		path := field.NewPath("scheduling")
		errs = append(errs, metav1validation.ValidateLabels(s.NodeSelector, path.Child("nodeSelector"))...)
		tpath := path.Child("tolerations")
		errs = append(errs, validateTolerations(s.Tolerations, tpath)...)
		seen := map[corev1.Toleration]bool{}
		for i, t := range s.Tolerations {
			key := corev1.Toleration{Key: t.Key, Operator: t.Operator, Value: t.Value, Effect: t.Effect}
			if seen[key] {
				errs = append(errs, field.Duplicate(tpath.Index(i), t))
			}
			seen[key] = true
		}
	}
	return errs
}

// admitRuntimeClass applies a new pod's RuntimeClass as upstream's
// RuntimeClass admission plugin does: the class must exist; its fixed
// overhead becomes the pod's spec.overhead (a pod may only repeat it);
// its node selector is merged into the pod's, a key with another value
// being a conflict; its tolerations are added to the pod's. A pod with
// an overhead and no class that defines one is refused.
func admitRuntimeClass(ctx context.Context, l Lister, pod *corev1.Pod) error {
	forbid := func(format string, args ...any) error {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, pod.Name, fmt.Errorf(format, args...))
	}
	var rc *nodev1.RuntimeClass
	if name := pod.Spec.RuntimeClassName; name != nil && l != nil {
		classes, err := l.List(ctx, runtimeClassesResource, "")
		if err != nil {
			return fmt.Errorf("list runtime classes: %w", err)
		}
		for _, o := range classes {
			if c, ok := o.(*nodev1.RuntimeClass); ok && c.Name == *name {
				rc = c
				break
			}
		}
		if rc == nil {
			return forbid("pod rejected: RuntimeClass %q not found", *name)
		}
	}
	if rc != nil && rc.Overhead != nil {
		if len(pod.Spec.Overhead) > 0 && !apiequality.Semantic.DeepEqual(rc.Overhead.PodFixed, pod.Spec.Overhead) {
			return forbid("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead")
		}
		pod.Spec.Overhead = rc.Overhead.PodFixed.DeepCopy()
	} else if len(pod.Spec.Overhead) > 0 {
		return forbid("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead")
	}
	if rc == nil || rc.Scheduling == nil {
		return nil
	}
	if len(rc.Scheduling.NodeSelector) > 0 && pod.Spec.NodeSelector == nil {
		pod.Spec.NodeSelector = map[string]string{}
	}
	for key, want := range rc.Scheduling.NodeSelector {
		if have, ok := pod.Spec.NodeSelector[key]; ok && have != want {
			return forbid("conflict: runtimeClass.scheduling.nodeSelector[%s] = %s; pod.spec.nodeSelector[%s] = %s", key, want, key, have)
		}
		pod.Spec.NodeSelector[key] = want
	}
	pod.Spec.Tolerations = mergeTolerations(pod.Spec.Tolerations, rc.Scheduling.Tolerations)
	return nil
}

// mergeTolerations appends to have the tolerations of extra it does not
// already hold.
func mergeTolerations(have, extra []corev1.Toleration) []corev1.Toleration {
	for _, t := range extra {
		found := false
		for _, h := range have {
			if apiequality.Semantic.DeepEqual(h, t) {
				found = true
				break
			}
		}
		if !found {
			have = append(have, t)
		}
	}
	return have
}
