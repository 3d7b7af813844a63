package registry

import (
	"fmt"
	"sort"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Bounds of the scaling behavior, as kube-apiserver enforces them.
const (
	hpaMaxPeriodSeconds              int32 = 1800
	hpaMaxStabilizationWindowSeconds int32 = 3600
)

var (
	hpaMetricSourceTypes = sortedStrings(string(autoscalingv2.ContainerResourceMetricSourceType), string(autoscalingv2.ExternalMetricSourceType),
		string(autoscalingv2.ObjectMetricSourceType), string(autoscalingv2.PodsMetricSourceType), string(autoscalingv2.ResourceMetricSourceType))
	hpaSelectPolicies = sortedStrings(string(autoscalingv2.DisabledPolicySelect), string(autoscalingv2.MaxChangePolicySelect),
		string(autoscalingv2.MinChangePolicySelect))
	hpaPolicyTypes = sortedStrings(string(autoscalingv2.PercentScalingPolicy), string(autoscalingv2.PodsScalingPolicy))
)

func sortedStrings(s ...string) []string {
	sort.Strings(s)
	return s
}

// validateHPASpec checks an autoscaler's spec as kube-apiserver does.
// minReplicas may be 0 only when minZero (the stored object already had
// 0: the HPAScaleToZero gate is off in tether).
func validateHPASpec(s *autoscalingv2.HorizontalPodAutoscalerSpec, minZero bool) field.ErrorList {
	var errs field.ErrorList
	lower := int32(1)
	if minZero {
		lower = 0
	}
	if s.MinReplicas != nil && *s.MinReplicas < lower {
		errs = append(errs, field.Invalid(gSpec.Child("minReplicas"), *s.MinReplicas, fmt.Sprintf("must be greater than or equal to %d", lower)))
	}
	if s.MaxReplicas < 1 {
		errs = append(errs, field.Invalid(gSpec.Child("maxReplicas"), s.MaxReplicas, "must be greater than 0"))
	}
	if s.MinReplicas != nil && s.MaxReplicas < *s.MinReplicas {
		errs = append(errs, field.Invalid(gSpec.Child("maxReplicas"), s.MaxReplicas, "must be greater than or equal to `minReplicas`"))
	}
	errs = append(errs, validateCrossVersionRef(s.ScaleTargetRef, gSpec.Child("scaleTargetRef"))...)
	errs = append(errs, validateHPAMetrics(s.Metrics, gSpec.Child("metrics"), s.MinReplicas)...)
	if b := s.Behavior; b != nil {
		errs = append(errs, validateScalingRules(b.ScaleUp, gSpec.Child("behavior", "scaleUp"))...)
		errs = append(errs, validateScalingRules(b.ScaleDown, gSpec.Child("behavior", "scaleDown"))...)
	}
	return errs
}

func validateCrossVersionRef(ref autoscalingv2.CrossVersionObjectReference, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct{ name, v string }{{"kind", ref.Kind}, {"name", ref.Name}} {
		if f.v == "" {
			errs = append(errs, field.Required(path.Child(f.name), ""))
			continue
		}
		for _, msg := range content.IsPathSegmentName(f.v) {
			errs = append(errs, field.Invalid(path.Child(f.name), f.v, msg))
		}
	}
	return errs
}

func validateHPAMetrics(metrics []autoscalingv2.MetricSpec, path *field.Path, minReplicas *int32) field.ErrorList {
	var errs field.ErrorList
	objectOrExternal := false
	for i := range metrics {
		errs = append(errs, validateMetricSpec(&metrics[i], path.Index(i))...)
		if t := metrics[i].Type; t == autoscalingv2.ObjectMetricSourceType || t == autoscalingv2.ExternalMetricSourceType {
			objectOrExternal = true
		}
	}
	if minReplicas != nil && *minReplicas == 0 && !objectOrExternal {
		errs = append(errs, field.Forbidden(path, "must specify at least one Object or External metric to support scaling to zero replicas"))
	}
	return errs
}

func validateMetricSpec(m *autoscalingv2.MetricSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if m.Type == "" {
		errs = append(errs, field.Required(path.Child("type"), "must specify a metric source type"))
	}
	// Each source present is named; the first one is checked.
	var present []string
	if m.Object != nil {
		present = append(present, "object")
		errs = append(errs, validateObjectSource(m.Object, path.Child("object"))...)
	}
	if m.External != nil {
		present = append(present, "external")
		if len(present) == 1 {
			errs = append(errs, validateExternalSource(m.External, path.Child("external"))...)
		}
	}
	if m.Pods != nil {
		present = append(present, "pods")
		if len(present) == 1 {
			errs = append(errs, validatePodsSource(m.Pods, path.Child("pods"))...)
		}
	}
	if m.Resource != nil {
		present = append(present, "resource")
		if len(present) == 1 {
			errs = append(errs, validateResourceTarget(m.Resource.Name == "", m.Resource.Target, path.Child("resource"))...)
		}
	}
	if m.ContainerResource != nil {
		present = append(present, "containerResource")
		if len(present) == 1 {
			errs = append(errs, validateContainerResourceSource(m.ContainerResource, path.Child("containerResource"))...)
		}
	}
	expected := ""
	missing := false
	switch m.Type {
	case autoscalingv2.ObjectMetricSourceType:
		expected, missing = "object", m.Object == nil
	case autoscalingv2.PodsMetricSourceType:
		expected, missing = "pods", m.Pods == nil
	case autoscalingv2.ResourceMetricSourceType:
		expected, missing = "resource", m.Resource == nil
	case autoscalingv2.ExternalMetricSourceType:
		expected, missing = "external", m.External == nil
	case autoscalingv2.ContainerResourceMetricSourceType:
		expected, missing = "containerResource", m.ContainerResource == nil
	default:
		errs = append(errs, field.NotSupported(path.Child("type"), m.Type, hpaMetricSourceTypes))
	}
	if missing {
		errs = append(errs, field.Required(path.Child(expected), "must populate information for the given metric source"))
	}
	if len(present) > 1 {
		for _, p := range present {
			if p != expected {
				errs = append(errs, field.Forbidden(path.Child(p), "must populate the given metric source only"))
			}
		}
	}
	return errs
}

func validateObjectSource(s *autoscalingv2.ObjectMetricSource, path *field.Path) field.ErrorList {
	errs := validateCrossVersionRef(s.DescribedObject, path.Child("describedObject"))
	errs = append(errs, validateMetricIdentifier(s.Metric, path.Child("metric"))...)
	errs = append(errs, validateMetricTarget(s.Target, path.Child("target"))...)
	if s.Target.Value == nil && s.Target.AverageValue == nil {
		errs = append(errs, field.Required(path.Child("target", "averageValue"), "must set either a target value or averageValue"))
	}
	return errs
}

func validateExternalSource(s *autoscalingv2.ExternalMetricSource, path *field.Path) field.ErrorList {
	errs := validateMetricIdentifier(s.Metric, path.Child("metric"))
	errs = append(errs, validateMetricTarget(s.Target, path.Child("target"))...)
	if s.Target.Value == nil && s.Target.AverageValue == nil {
		errs = append(errs, field.Required(path.Child("target", "averageValue"), "must set either a target value for metric or a per-pod target"))
	}
	if s.Target.Value != nil && s.Target.AverageValue != nil {
		errs = append(errs, field.Forbidden(path.Child("target", "value"), "may not set both a target value for metric and a per-pod target"))
	}
	return errs
}

func validatePodsSource(s *autoscalingv2.PodsMetricSource, path *field.Path) field.ErrorList {
	errs := validateMetricIdentifier(s.Metric, path.Child("metric"))
	errs = append(errs, validateMetricTarget(s.Target, path.Child("target"))...)
	if s.Target.AverageValue == nil {
		errs = append(errs, field.Required(path.Child("target", "averageValue"), "must specify a positive target averageValue"))
	}
	return errs
}

// validateResourceTarget checks a resource metric (noName: its name is
// empty) and its target.
func validateResourceTarget(noName bool, t autoscalingv2.MetricTarget, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if noName {
		errs = append(errs, field.Required(path.Child("name"), "must specify a resource name"))
	}
	errs = append(errs, validateMetricTarget(t, path.Child("target"))...)
	if t.AverageUtilization == nil && t.AverageValue == nil {
		errs = append(errs, field.Required(path.Child("target", "averageUtilization"), "must set either a target raw value or a target utilization"))
	}
	if t.AverageUtilization != nil && t.AverageValue != nil {
		errs = append(errs, field.Forbidden(path.Child("target", "averageValue"), "may not set both a target raw value and a target utilization"))
	}
	return errs
}

func validateContainerResourceSource(s *autoscalingv2.ContainerResourceMetricSource, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if s.Name == "" {
		errs = append(errs, field.Required(path.Child("name"), "must specify a resource name"))
	} else {
		errs = append(errs, validateContainerResourceName(string(s.Name), path.Child("name"))...)
	}
	if s.Container == "" {
		errs = append(errs, field.Required(path.Child("container"), "must specify a container"))
	} else {
		for _, msg := range validation.IsDNS1123Label(s.Container) {
			errs = append(errs, field.Invalid(path.Child("container"), s.Container, msg))
		}
	}
	t := s.Target
	errs = append(errs, validateMetricTarget(t, path.Child("target"))...)
	if t.AverageUtilization == nil && t.AverageValue == nil {
		errs = append(errs, field.Required(path.Child("target", "averageUtilization"), "must set either a target raw value or a target utilization"))
	}
	if t.AverageUtilization != nil && t.AverageValue != nil {
		errs = append(errs, field.Forbidden(path.Child("target", "averageValue"), "may not set both a target raw value and a target utilization"))
	}
	return errs
}

// validateContainerResourceName checks a container resource name: a
// qualified name that, without a domain, is one of the standard ones.
func validateContainerResourceName(name string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsQualifiedName(name) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	if len(errs) == 0 && !hasDomain(name) && !standardContainerResources[name] {
		errs = append(errs, field.Invalid(path, name, "must be a standard resource for containers"))
	}
	return errs
}

var standardContainerResources = map[string]bool{"cpu": true, "memory": true, "ephemeral-storage": true}

func hasDomain(name string) bool {
	for _, c := range name {
		if c == '/' {
			return true
		}
	}
	return false
}

func validateMetricTarget(t autoscalingv2.MetricTarget, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if t.Type == "" {
		errs = append(errs, field.Required(path.Child("type"), "must specify a metric target type"))
	}
	if t.Type != autoscalingv2.UtilizationMetricType && t.Type != autoscalingv2.ValueMetricType && t.Type != autoscalingv2.AverageValueMetricType {
		errs = append(errs, field.Invalid(path.Child("type"), t.Type, "must be either Utilization, Value, or AverageValue"))
	}
	if t.Value != nil && t.Value.Sign() != 1 {
		errs = append(errs, field.Invalid(path.Child("value"), t.Value, "must be positive"))
	}
	if t.AverageValue != nil && t.AverageValue.Sign() != 1 {
		errs = append(errs, field.Invalid(path.Child("averageValue"), t.AverageValue, "must be positive"))
	}
	if t.AverageUtilization != nil && *t.AverageUtilization < 1 {
		errs = append(errs, field.Invalid(path.Child("averageUtilization"), t.AverageUtilization, "must be greater than 0"))
	}
	return errs
}

func validateMetricIdentifier(id autoscalingv2.MetricIdentifier, path *field.Path) field.ErrorList {
	if id.Name == "" {
		return field.ErrorList{field.Required(path.Child("name"), "must specify a metric name")}
	}
	var errs field.ErrorList
	for _, msg := range content.IsPathSegmentName(id.Name) {
		errs = append(errs, field.Invalid(path.Child("name"), id.Name, msg))
	}
	return errs
}

func validateScalingRules(r *autoscalingv2.HPAScalingRules, path *field.Path) field.ErrorList {
	if r == nil {
		return nil
	}
	var errs field.ErrorList
	if w := r.StabilizationWindowSeconds; w != nil {
		if *w < 0 {
			errs = append(errs, field.Invalid(path.Child("stabilizationWindowSeconds"), w, "must be greater than or equal to zero"))
		}
		if *w > hpaMaxStabilizationWindowSeconds {
			errs = append(errs, field.Invalid(path.Child("stabilizationWindowSeconds"), w,
				fmt.Sprintf("must be less than or equal to %v", hpaMaxStabilizationWindowSeconds)))
		}
	}
	if p := r.SelectPolicy; p != nil && *p != autoscalingv2.MaxChangePolicySelect && *p != autoscalingv2.MinChangePolicySelect &&
		*p != autoscalingv2.DisabledPolicySelect {
		errs = append(errs, field.NotSupported(path.Child("selectPolicy"), p, hpaSelectPolicies))
	}
	if r.Tolerance != nil && r.Tolerance.Sign() < 0 {
		errs = append(errs, field.Invalid(path.Child("tolerance"), r.Tolerance.String(), "must be greater than or equal to 0"))
	}
	pp := path.Child("policies")
	if len(r.Policies) == 0 {
		errs = append(errs, field.Required(pp, "must specify at least one Policy"))
	}
	for i, p := range r.Policies {
		ip := pp.Index(i)
		if p.Type != autoscalingv2.PodsScalingPolicy && p.Type != autoscalingv2.PercentScalingPolicy {
			errs = append(errs, field.NotSupported(ip.Child("type"), p.Type, hpaPolicyTypes))
		}
		if p.Value <= 0 {
			errs = append(errs, field.Invalid(ip.Child("value"), p.Value, "must be greater than zero"))
		}
		if p.PeriodSeconds <= 0 {
			errs = append(errs, field.Invalid(ip.Child("periodSeconds"), p.PeriodSeconds, "must be greater than zero"))
		}
		if p.PeriodSeconds > hpaMaxPeriodSeconds {
			errs = append(errs, field.Invalid(ip.Child("periodSeconds"), p.PeriodSeconds,
				fmt.Sprintf("must be less than or equal to %v", hpaMaxPeriodSeconds)))
		}
	}
	return errs
}

// validateHPAStatus checks a write to an autoscaler's status.
func validateHPAStatus(s *autoscalingv2.HorizontalPodAutoscalerStatus) field.ErrorList {
	p := field.NewPath("status")
	errs := nonNegative(int64(s.CurrentReplicas), p.Child("currentReplicas"))
	return append(errs, nonNegative(int64(s.DesiredReplicas), p.Child("desiredReplicas"))...)
}

// validateScaleTarget refuses a scaleTargetRef naming a kind the hub
// serves without a /scale subresource: an autoscaler could never scale
// it. Kinds the hub does not serve (yet) pass, since a
// CustomResourceDefinition may come later. kube-apiserver accepts such an
// autoscaler and lets the controller report it; tether tells the writer.
func validateScaleTarget(ref autoscalingv2.CrossVersionObjectReference, kinds []*Kind) field.ErrorList {
	if ref.Kind == "" {
		return nil
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil
	}
	found, scalable := false, false
	for _, k := range kinds {
		if k.NotServed || k.GVK.Group != gv.Group || k.GVK.Kind != ref.Kind {
			continue
		}
		found = true
		if k.Scale != nil {
			scalable = true
		}
	}
	if found && !scalable {
		gk := schema.GroupKind{Group: gv.Group, Kind: ref.Kind}
		return field.ErrorList{field.Invalid(gSpec.Child("scaleTargetRef", "kind"), ref.Kind,
			fmt.Sprintf("%s has no scale subresource and cannot be autoscaled", gk))}
	}
	return nil
}
