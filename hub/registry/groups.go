package registry

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// groupKinds returns the served kinds of the named API groups, in discovery
// order: apps, autoscaling, batch, certificates.k8s.io, discovery.k8s.io, coordination.k8s.io, events.k8s.io,
// policy, networking.k8s.io, rbac.authorization.k8s.io, scheduling.k8s.io,
// storage.k8s.io, node.k8s.io. served returns the kinds the registry serves now, for
// hooks that look at other kinds (see autoscalingKinds).
func groupKinds(served func() []*Kind) []*Kind {
	kinds := []*Kind{deploymentKind, replicaSetKind, statefulSetKind, daemonSetKind, controllerRevisionKind}
	kinds = append(kinds, autoscalingKinds(served)...)
	return append(kinds,
		jobKind, cronJobKind,
		csrKind,
		endpointSliceKind,
		leaseKind,
		eventsV1Kind,
		podDisruptionBudgetKind,
		ingressClassKind, ingressKind, networkPolicyKind,
		roleKind, roleBindingKind, clusterRoleKind, clusterRoleBindingKind,
		priorityClassKind,
		storageClassKind,
		runtimeClassKind,
	)
}

func ptrTo[T any](v T) *T { return &v }

// nonNegative reports a negative value with the upstream message.
func nonNegative(v int64, path *field.Path) field.ErrorList {
	return apivalidation.ValidateNonnegativeField(v, path)
}

// nonNegativePtr is nonNegative for an optional value.
func nonNegativePtr(v *int32, path *field.Path) field.ErrorList {
	if v == nil {
		return nil
	}
	return nonNegative(int64(*v), path)
}

// selectorString renders a label selector as the Scale subresource and the
// wide table columns do; a nil selector renders as "".
func selectorString(s *metav1.LabelSelector) string {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return "<error>"
	}
	return sel.String()
}

// validateWorkloadSelector checks a workload's required selector and that it
// selects the template's labels. kind names the resource in the
// empty-selector message ("deployment", "statefulset"); "" skips that check,
// as upstream does for Jobs.
func validateWorkloadSelector(sel *metav1.LabelSelector, tmpl *corev1.PodTemplateSpec, kind string, spec *field.Path) field.ErrorList {
	var errs field.ErrorList
	if sel == nil {
		errs = append(errs, field.Required(spec.Child("selector"), ""))
	} else {
		errs = append(errs, metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, spec.Child("selector"))...)
		if kind != "" && len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
			errs = append(errs, field.Invalid(spec.Child("selector"), sel, "empty selector is invalid for "+kind))
		}
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return append(errs, field.Invalid(spec.Child("selector"), sel, "invalid label selector"))
	}
	if !s.Empty() && !s.Matches(labels.Set(tmpl.Labels)) {
		errs = append(errs, field.Invalid(spec.Child("template", "metadata", "labels"), tmpl.Labels, "`selector` does not match template `labels`"))
	}
	return errs
}

// validateAlwaysRestart checks what every long-running workload's template
// must satisfy: restartPolicy Always and no activeDeadlineSeconds. kind
// names the workload in the message, as upstream words it.
func validateAlwaysRestart(t *corev1.PodTemplateSpec, kind string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if t.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(path.Child("spec", "restartPolicy"), t.Spec.RestartPolicy, []string{string(corev1.RestartPolicyAlways)}))
	}
	if t.Spec.ActiveDeadlineSeconds != nil {
		errs = append(errs, field.Forbidden(path.Child("spec", "activeDeadlineSeconds"), "activeDeadlineSeconds in "+kind+" is not Supported"))
	}
	return errs
}

// validateWorkloadTemplate checks a pod template of a long-running workload:
// the pod template rules plus validateAlwaysRestart.
func validateWorkloadTemplate(t *corev1.PodTemplateSpec, kind string, path *field.Path) field.ErrorList {
	errs := validatePodTemplateSpec(t, path)
	return append(errs, validateAlwaysRestart(t, kind, path)...)
}

// collisionCountDecremented reports a status.collisionCount that went down.
func collisionCountDecremented(cur, old *int32) field.ErrorList {
	if old == nil || (cur != nil && *cur >= *old) {
		return nil
	}
	return field.ErrorList{field.Invalid(field.NewPath("status", "collisionCount"), int32Val(cur, 0), "cannot be decremented")}
}

// validateIntOrPercent checks a non-negative integer or a percentage.
func validateIntOrPercent(v *intstr.IntOrString, path *field.Path) field.ErrorList {
	if v == nil {
		return nil
	}
	if v.Type == intstr.String {
		var errs field.ErrorList
		for _, msg := range validation.IsValidPercent(v.StrVal) {
			errs = append(errs, field.Invalid(path, v, msg))
		}
		return errs
	}
	return nonNegative(int64(v.IntVal), path)
}

// intOrPercentValue returns the number in an int or percent value and
// whether it is a percentage.
func intOrPercentValue(v *intstr.IntOrString) (int, bool) {
	if v == nil {
		return 0, false
	}
	if v.Type == intstr.String {
		if len(validation.IsValidPercent(v.StrVal)) != 0 {
			return 0, false
		}
		n, _ := strconv.Atoi(strings.TrimSuffix(v.StrVal, "%"))
		return n, true
	}
	return int(v.IntVal), false
}

// notMoreThan100Percent rejects a percentage above 100%.
func notMoreThan100Percent(v *intstr.IntOrString, path *field.Path) field.ErrorList {
	n, pct := intOrPercentValue(v)
	if pct && n > 100 {
		return field.ErrorList{field.Invalid(path, v, "must not be greater than 100%")}
	}
	return nil
}

// podContainersCells returns the containers and images cells of the wide
// workload tables.
func podContainersCells(spec *corev1.PodSpec) (string, string) {
	names := make([]string, 0, len(spec.Containers))
	images := make([]string, 0, len(spec.Containers))
	for _, c := range spec.Containers {
		names = append(names, c.Name)
		images = append(images, c.Image)
	}
	return strings.Join(names, ","), strings.Join(images, ",")
}

// int32Val returns *p, or def when p is nil.
func int32Val(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// ratio renders "a/b".
func ratio(a, b int32) string { return fmt.Sprintf("%d/%d", a, b) }

var (
	containersColumn = column("Containers", "string", 1, "Names of each container in the template.")
	imagesColumn     = column("Images", "string", 1, "Images referenced by each container in the template.")
	selectorColumn   = column("Selector", "string", 1, "Label selector for the objects this controller manages.")
)

var gSpec = field.NewPath("spec")

func itoa32(n int32) string { return strconv.FormatInt(int64(n), 10) }

func dnsSubdomainMsgs(name string) []string { return apivalidation.NameIsDNSSubdomain(name, false) }
