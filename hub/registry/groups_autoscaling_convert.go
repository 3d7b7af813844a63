package registry

import (
	"encoding/json"
	"fmt"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
)

// The annotations in which an autoscaling/v1 HorizontalPodAutoscaler
// carries what only autoscaling/v2 can say, as kube-apiserver names and
// fills them: the metrics other than a CPU utilization target, the
// current metrics, the conditions and the scaling behavior, plus the
// scaling tolerances.
const (
	hpaMetricSpecsAnnotation    = "autoscaling.alpha.kubernetes.io/metrics"
	hpaMetricStatusesAnnotation = "autoscaling.alpha.kubernetes.io/current-metrics"
	hpaConditionsAnnotation     = "autoscaling.alpha.kubernetes.io/conditions"
	hpaBehaviorAnnotation       = "autoscaling.alpha.kubernetes.io/behavior"
	hpaScaleDownTolAnnotation   = "autoscaling.alpha.kubernetes.io/scale-down-tolerance"
	hpaScaleUpTolAnnotation     = "autoscaling.alpha.kubernetes.io/scale-up-tolerance"
)

// hpaRoundTripAnnotations are the annotations conversion owns: dropped
// from an object before conversion fills them, and after it read them.
var hpaRoundTripAnnotations = []string{hpaMetricSpecsAnnotation, hpaBehaviorAnnotation,
	hpaScaleDownTolAnnotation, hpaScaleUpTolAnnotation, hpaMetricStatusesAnnotation, hpaConditionsAnnotation}

// hpaStatusAnnotations are the round-trip annotations that hold status.
var hpaStatusAnnotations = []string{hpaMetricStatusesAnnotation, hpaConditionsAnnotation}

// defaultCPUUtilization is the CPU target of an autoscaler that names no
// metric.
const defaultCPUUtilization = 80

// AddHPAConversions registers the conversions between autoscaling/v1 and
// autoscaling/v2 HorizontalPodAutoscalers in s, so that field managers and
// other scheme users can move objects between the two served versions.
func AddHPAConversions(s *runtime.Scheme) error {
	if err := s.AddConversionFunc((*autoscalingv1.HorizontalPodAutoscaler)(nil), (*autoscalingv2.HorizontalPodAutoscaler)(nil),
		func(a, b any, _ conversion.Scope) error {
			out, err := hpaV1ToV2(a.(*autoscalingv1.HorizontalPodAutoscaler))
			if err != nil {
				return err
			}
			*b.(*autoscalingv2.HorizontalPodAutoscaler) = *out
			return nil
		}); err != nil {
		return fmt.Errorf("add conversion: %w", err)
	}
	if err := s.AddConversionFunc((*autoscalingv2.HorizontalPodAutoscaler)(nil), (*autoscalingv1.HorizontalPodAutoscaler)(nil),
		func(a, b any, _ conversion.Scope) error {
			out, err := hpaV2ToV1(a.(*autoscalingv2.HorizontalPodAutoscaler))
			if err != nil {
				return err
			}
			*b.(*autoscalingv1.HorizontalPodAutoscaler) = *out
			return nil
		}); err != nil {
		return fmt.Errorf("add conversion: %w", err)
	}
	return nil
}

// dropHPAAnnotations returns annotations without the keys in drop, copied
// if it held any of them.
func dropHPAAnnotations(annotations map[string]string, drop []string) map[string]string {
	has := false
	for _, k := range drop {
		if _, ok := annotations[k]; ok {
			has = true
		}
	}
	if !has {
		return annotations
	}
	out := make(map[string]string, len(annotations))
	for k, v := range annotations {
		out[k] = v
	}
	for _, k := range drop {
		delete(out, k)
	}
	return out
}

// setHPAAnnotation sets key in m (a copy when m is shared), making m if nil.
func setHPAAnnotation(m *map[string]string, copied *bool, key, value string) {
	if !*copied {
		out := make(map[string]string, len(*m)+1)
		for k, v := range *m {
			out[k] = v
		}
		*m, *copied = out, true
	}
	(*m)[key] = value
}

// isCPUUtilization reports whether m is a CPU utilization target, the one
// metric autoscaling/v1 has a field for.
func isCPUUtilization(m *autoscalingv2.MetricSpec) bool {
	return m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource != nil &&
		m.Resource.Name == corev1.ResourceCPU && m.Resource.Target.AverageUtilization != nil
}

// behaviorAnnotation is the behavior annotation's form: field names
// without JSON tags, as kube-apiserver writes it.
type behaviorAnnotation struct {
	ScaleUp   *rulesAnnotation
	ScaleDown *rulesAnnotation
}

type rulesAnnotation struct {
	StabilizationWindowSeconds *int32
	SelectPolicy               *autoscalingv2.ScalingPolicySelect
	Policies                   []policyAnnotation
}

type policyAnnotation struct {
	Type          autoscalingv2.HPAScalingPolicyType
	Value         int32
	PeriodSeconds int32
}

func rulesToAnnotation(r *autoscalingv2.HPAScalingRules) *rulesAnnotation {
	if r == nil {
		return nil
	}
	out := &rulesAnnotation{StabilizationWindowSeconds: r.StabilizationWindowSeconds, SelectPolicy: r.SelectPolicy}
	for _, p := range r.Policies {
		out.Policies = append(out.Policies, policyAnnotation(p))
	}
	return out
}

func rulesFromAnnotation(r *rulesAnnotation) *autoscalingv2.HPAScalingRules {
	if r == nil {
		return nil
	}
	out := &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: r.StabilizationWindowSeconds, SelectPolicy: r.SelectPolicy}
	for _, p := range r.Policies {
		out.Policies = append(out.Policies, autoscalingv2.HPAScalingPolicy(p))
	}
	return out
}

// hpaV2ToV1 converts a stored autoscaling/v2 autoscaler to autoscaling/v1,
// keeping what v1 has no field for in the round-trip annotations.
func hpaV2ToV1(in *autoscalingv2.HorizontalPodAutoscaler) (*autoscalingv1.HorizontalPodAutoscaler, error) {
	out := &autoscalingv1.HorizontalPodAutoscaler{
		TypeMeta:   in.TypeMeta,
		ObjectMeta: *in.ObjectMeta.DeepCopy(),
		Spec: autoscalingv1.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv1.CrossVersionObjectReference(in.Spec.ScaleTargetRef),
			MinReplicas:    in.Spec.MinReplicas,
			MaxReplicas:    in.Spec.MaxReplicas,
		},
		Status: autoscalingv1.HorizontalPodAutoscalerStatus{
			ObservedGeneration: in.Status.ObservedGeneration,
			LastScaleTime:      in.Status.LastScaleTime,
			CurrentReplicas:    in.Status.CurrentReplicas,
			DesiredReplicas:    in.Status.DesiredReplicas,
		},
	}
	out.APIVersion, out.Kind = autoscalingv1.SchemeGroupVersion.String(), "HorizontalPodAutoscaler"
	out.Annotations = dropHPAAnnotations(out.Annotations, hpaRoundTripAnnotations)
	copied := false
	var other []autoscalingv1.MetricSpec
	for i := range in.Spec.Metrics {
		m := &in.Spec.Metrics[i]
		if isCPUUtilization(m) {
			if out.Spec.TargetCPUUtilizationPercentage == nil {
				out.Spec.TargetCPUUtilizationPercentage = ptrTo(*m.Resource.Target.AverageUtilization)
			}
			continue
		}
		other = append(other, metricSpecToV1(m))
	}
	if len(other) > 0 {
		b, err := json.Marshal(other)
		if err != nil {
			return nil, fmt.Errorf("encode metrics: %w", err)
		}
		setHPAAnnotation(&out.Annotations, &copied, hpaMetricSpecsAnnotation, string(b))
	}
	if len(in.Status.CurrentMetrics) > 0 {
		cur := make([]autoscalingv1.MetricStatus, 0, len(in.Status.CurrentMetrics))
		for i := range in.Status.CurrentMetrics {
			s := &in.Status.CurrentMetrics[i]
			if s.Type == autoscalingv2.ResourceMetricSourceType && s.Resource != nil && s.Resource.Name == corev1.ResourceCPU &&
				s.Resource.Current.AverageUtilization != nil {
				out.Status.CurrentCPUUtilizationPercentage = ptrTo(*s.Resource.Current.AverageUtilization)
			}
			cur = append(cur, metricStatusToV1(s))
		}
		b, err := json.Marshal(cur)
		if err != nil {
			return nil, fmt.Errorf("encode current metrics: %w", err)
		}
		setHPAAnnotation(&out.Annotations, &copied, hpaMetricStatusesAnnotation, string(b))
	}
	if len(in.Status.Conditions) > 0 {
		conds := make([]autoscalingv1.HorizontalPodAutoscalerCondition, 0, len(in.Status.Conditions))
		for _, c := range in.Status.Conditions {
			conds = append(conds, autoscalingv1.HorizontalPodAutoscalerCondition{
				Type: autoscalingv1.HorizontalPodAutoscalerConditionType(c.Type), Status: c.Status,
				LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message, ObservedGeneration: c.ObservedGeneration,
			})
		}
		b, err := json.Marshal(conds)
		if err != nil {
			return nil, fmt.Errorf("encode conditions: %w", err)
		}
		setHPAAnnotation(&out.Annotations, &copied, hpaConditionsAnnotation, string(b))
	}
	if bh := in.Spec.Behavior; bh != nil {
		b, err := json.Marshal(behaviorAnnotation{ScaleUp: rulesToAnnotation(bh.ScaleUp), ScaleDown: rulesToAnnotation(bh.ScaleDown)})
		if err != nil {
			return nil, fmt.Errorf("encode behavior: %w", err)
		}
		setHPAAnnotation(&out.Annotations, &copied, hpaBehaviorAnnotation, string(b))
		if bh.ScaleUp != nil && bh.ScaleUp.Tolerance != nil {
			setHPAAnnotation(&out.Annotations, &copied, hpaScaleUpTolAnnotation, bh.ScaleUp.Tolerance.String())
		}
		if bh.ScaleDown != nil && bh.ScaleDown.Tolerance != nil {
			setHPAAnnotation(&out.Annotations, &copied, hpaScaleDownTolAnnotation, bh.ScaleDown.Tolerance.String())
		}
	}
	return out, nil
}

// hpaV1ToV2 converts an autoscaling/v1 autoscaler to the stored
// autoscaling/v2 form, reading back the round-trip annotations (those not
// well formed are ignored) and dropping them.
func hpaV1ToV2(in *autoscalingv1.HorizontalPodAutoscaler) (*autoscalingv2.HorizontalPodAutoscaler, error) {
	out := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: *in.ObjectMeta.DeepCopy(),
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference(in.Spec.ScaleTargetRef),
			MinReplicas:    in.Spec.MinReplicas,
			MaxReplicas:    in.Spec.MaxReplicas,
		},
		Status: autoscalingv2.HorizontalPodAutoscalerStatus{
			ObservedGeneration: in.Status.ObservedGeneration,
			LastScaleTime:      in.Status.LastScaleTime,
			CurrentReplicas:    in.Status.CurrentReplicas,
			DesiredReplicas:    in.Status.DesiredReplicas,
		},
	}
	out.APIVersion, out.Kind = autoscalingv2.SchemeGroupVersion.String(), "HorizontalPodAutoscaler"
	ann := in.Annotations
	if enc, ok := ann[hpaMetricSpecsAnnotation]; ok {
		var other []autoscalingv1.MetricSpec
		if json.Unmarshal([]byte(enc), &other) == nil {
			for i := range other {
				out.Spec.Metrics = append(out.Spec.Metrics, metricSpecFromV1(&other[i]))
			}
		}
	}
	if p := in.Spec.TargetCPUUtilizationPercentage; p != nil {
		out.Spec.Metrics = append(out.Spec.Metrics, cpuUtilizationMetric(*p))
	}
	if len(out.Spec.Metrics) == 0 {
		out.Spec.Metrics = []autoscalingv2.MetricSpec{cpuUtilizationMetric(defaultCPUUtilization)}
	}
	if p := in.Status.CurrentCPUUtilizationPercentage; p != nil {
		out.Status.CurrentMetrics = []autoscalingv2.MetricStatus{{
			Type:     autoscalingv2.ResourceMetricSourceType,
			Resource: &autoscalingv2.ResourceMetricStatus{Name: corev1.ResourceCPU, Current: autoscalingv2.MetricValueStatus{AverageUtilization: ptrTo(*p)}},
		}}
	}
	if enc, ok := ann[hpaMetricStatusesAnnotation]; ok {
		var cur []autoscalingv1.MetricStatus
		if json.Unmarshal([]byte(enc), &cur) == nil {
			out.Status.CurrentMetrics = nil
			for i := range cur {
				out.Status.CurrentMetrics = append(out.Status.CurrentMetrics, metricStatusFromV1(&cur[i]))
			}
		}
	}
	if enc, ok := ann[hpaConditionsAnnotation]; ok {
		var conds []autoscalingv1.HorizontalPodAutoscalerCondition
		if json.Unmarshal([]byte(enc), &conds) == nil {
			for _, c := range conds {
				out.Status.Conditions = append(out.Status.Conditions, autoscalingv2.HorizontalPodAutoscalerCondition{
					Type: autoscalingv2.HorizontalPodAutoscalerConditionType(c.Type), Status: c.Status,
					LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message, ObservedGeneration: c.ObservedGeneration,
				})
			}
		}
	}
	if enc, ok := ann[hpaBehaviorAnnotation]; ok {
		var b behaviorAnnotation
		if json.Unmarshal([]byte(enc), &b) == nil && (b.ScaleUp != nil || b.ScaleDown != nil) {
			out.Spec.Behavior = &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: rulesFromAnnotation(b.ScaleUp), ScaleDown: rulesFromAnnotation(b.ScaleDown)}
			setTolerance(ann[hpaScaleUpTolAnnotation], out.Spec.Behavior.ScaleUp)
			setTolerance(ann[hpaScaleDownTolAnnotation], out.Spec.Behavior.ScaleDown)
		}
	}
	out.Annotations = dropHPAAnnotations(out.Annotations, hpaRoundTripAnnotations)
	return out, nil
}

// setTolerance sets r's tolerance from an annotation value, if both are
// there and the value parses.
func setTolerance(v string, r *autoscalingv2.HPAScalingRules) {
	if v == "" || r == nil {
		return
	}
	if q, err := resource.ParseQuantity(v); err == nil {
		r.Tolerance = &q
	}
}

func cpuUtilizationMetric(pct int32) autoscalingv2.MetricSpec {
	return autoscalingv2.MetricSpec{
		Type: autoscalingv2.ResourceMetricSourceType,
		Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceCPU,
			Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptrTo(pct)}},
	}
}

// quantityOrZero returns *q, or a zero quantity.
func quantityOrZero(q *resource.Quantity) resource.Quantity {
	if q == nil {
		return resource.Quantity{}
	}
	return q.DeepCopy()
}

func metricSpecToV1(m *autoscalingv2.MetricSpec) autoscalingv1.MetricSpec {
	out := autoscalingv1.MetricSpec{Type: autoscalingv1.MetricSourceType(m.Type)}
	if o := m.Object; o != nil {
		out.Object = &autoscalingv1.ObjectMetricSource{
			Target:     autoscalingv1.CrossVersionObjectReference(o.DescribedObject),
			MetricName: o.Metric.Name, Selector: o.Metric.Selector,
			TargetValue: quantityOrZero(o.Target.Value), AverageValue: o.Target.AverageValue,
		}
	}
	if p := m.Pods; p != nil {
		out.Pods = &autoscalingv1.PodsMetricSource{MetricName: p.Metric.Name, Selector: p.Metric.Selector,
			TargetAverageValue: quantityOrZero(p.Target.AverageValue)}
	}
	if r := m.Resource; r != nil {
		out.Resource = &autoscalingv1.ResourceMetricSource{Name: r.Name,
			TargetAverageUtilization: r.Target.AverageUtilization, TargetAverageValue: r.Target.AverageValue}
	}
	if r := m.ContainerResource; r != nil {
		out.ContainerResource = &autoscalingv1.ContainerResourceMetricSource{Name: r.Name, Container: r.Container,
			TargetAverageUtilization: r.Target.AverageUtilization, TargetAverageValue: r.Target.AverageValue}
	}
	if e := m.External; e != nil {
		out.External = &autoscalingv1.ExternalMetricSource{MetricName: e.Metric.Name, MetricSelector: e.Metric.Selector,
			TargetValue: e.Target.Value, TargetAverageValue: e.Target.AverageValue}
	}
	return out
}

// utilizationOrValue is the target type of a v1 resource target: a
// utilization when one is set, else an average value.
func utilizationOrValue(util *int32) autoscalingv2.MetricTargetType {
	if util != nil {
		return autoscalingv2.UtilizationMetricType
	}
	return autoscalingv2.AverageValueMetricType
}

func metricSpecFromV1(m *autoscalingv1.MetricSpec) autoscalingv2.MetricSpec {
	out := autoscalingv2.MetricSpec{Type: autoscalingv2.MetricSourceType(m.Type)}
	if o := m.Object; o != nil {
		t := autoscalingv2.MetricTarget{Type: autoscalingv2.ValueMetricType, Value: ptrTo(o.TargetValue.DeepCopy())}
		if o.AverageValue != nil {
			t = autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: o.AverageValue}
		}
		out.Object = &autoscalingv2.ObjectMetricSource{DescribedObject: autoscalingv2.CrossVersionObjectReference(o.Target),
			Metric: autoscalingv2.MetricIdentifier{Name: o.MetricName, Selector: o.Selector}, Target: t}
	}
	if p := m.Pods; p != nil {
		out.Pods = &autoscalingv2.PodsMetricSource{Metric: autoscalingv2.MetricIdentifier{Name: p.MetricName, Selector: p.Selector},
			Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptrTo(p.TargetAverageValue.DeepCopy())}}
	}
	if r := m.Resource; r != nil {
		out.Resource = &autoscalingv2.ResourceMetricSource{Name: r.Name, Target: autoscalingv2.MetricTarget{
			Type: utilizationOrValue(r.TargetAverageUtilization), AverageUtilization: r.TargetAverageUtilization, AverageValue: r.TargetAverageValue}}
	}
	if r := m.ContainerResource; r != nil {
		out.ContainerResource = &autoscalingv2.ContainerResourceMetricSource{Name: r.Name, Container: r.Container, Target: autoscalingv2.MetricTarget{
			Type: utilizationOrValue(r.TargetAverageUtilization), AverageUtilization: r.TargetAverageUtilization, AverageValue: r.TargetAverageValue}}
	}
	if e := m.External; e != nil {
		t := autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: e.TargetAverageValue}
		if e.TargetValue != nil {
			t = autoscalingv2.MetricTarget{Type: autoscalingv2.ValueMetricType, Value: e.TargetValue}
		}
		out.External = &autoscalingv2.ExternalMetricSource{Metric: autoscalingv2.MetricIdentifier{Name: e.MetricName, Selector: e.MetricSelector}, Target: t}
	}
	return out
}

func metricStatusToV1(m *autoscalingv2.MetricStatus) autoscalingv1.MetricStatus {
	out := autoscalingv1.MetricStatus{Type: autoscalingv1.MetricSourceType(m.Type)}
	if o := m.Object; o != nil {
		out.Object = &autoscalingv1.ObjectMetricStatus{Target: autoscalingv1.CrossVersionObjectReference(o.DescribedObject),
			MetricName: o.Metric.Name, Selector: o.Metric.Selector, CurrentValue: quantityOrZero(o.Current.Value), AverageValue: o.Current.AverageValue}
	}
	if p := m.Pods; p != nil {
		out.Pods = &autoscalingv1.PodsMetricStatus{MetricName: p.Metric.Name, Selector: p.Metric.Selector,
			CurrentAverageValue: quantityOrZero(p.Current.AverageValue)}
	}
	if r := m.Resource; r != nil {
		out.Resource = &autoscalingv1.ResourceMetricStatus{Name: r.Name, CurrentAverageUtilization: r.Current.AverageUtilization,
			CurrentAverageValue: quantityOrZero(r.Current.AverageValue)}
	}
	if r := m.ContainerResource; r != nil {
		out.ContainerResource = &autoscalingv1.ContainerResourceMetricStatus{Name: r.Name, Container: r.Container,
			CurrentAverageUtilization: r.Current.AverageUtilization, CurrentAverageValue: quantityOrZero(r.Current.AverageValue)}
	}
	if e := m.External; e != nil {
		out.External = &autoscalingv1.ExternalMetricStatus{MetricName: e.Metric.Name, MetricSelector: e.Metric.Selector,
			CurrentValue: quantityOrZero(e.Current.Value), CurrentAverageValue: e.Current.AverageValue}
	}
	return out
}

func metricStatusFromV1(m *autoscalingv1.MetricStatus) autoscalingv2.MetricStatus {
	out := autoscalingv2.MetricStatus{Type: autoscalingv2.MetricSourceType(m.Type)}
	if o := m.Object; o != nil {
		out.Object = &autoscalingv2.ObjectMetricStatus{DescribedObject: autoscalingv2.CrossVersionObjectReference(o.Target),
			Metric:  autoscalingv2.MetricIdentifier{Name: o.MetricName, Selector: o.Selector},
			Current: autoscalingv2.MetricValueStatus{Value: ptrTo(o.CurrentValue.DeepCopy()), AverageValue: o.AverageValue}}
	}
	if p := m.Pods; p != nil {
		out.Pods = &autoscalingv2.PodsMetricStatus{Metric: autoscalingv2.MetricIdentifier{Name: p.MetricName, Selector: p.Selector},
			Current: autoscalingv2.MetricValueStatus{AverageValue: ptrTo(p.CurrentAverageValue.DeepCopy())}}
	}
	if r := m.Resource; r != nil {
		out.Resource = &autoscalingv2.ResourceMetricStatus{Name: r.Name,
			Current: autoscalingv2.MetricValueStatus{AverageUtilization: r.CurrentAverageUtilization, AverageValue: ptrTo(r.CurrentAverageValue.DeepCopy())}}
	}
	if r := m.ContainerResource; r != nil {
		out.ContainerResource = &autoscalingv2.ContainerResourceMetricStatus{Name: r.Name, Container: r.Container,
			Current: autoscalingv2.MetricValueStatus{AverageUtilization: r.CurrentAverageUtilization, AverageValue: ptrTo(r.CurrentAverageValue.DeepCopy())}}
	}
	if e := m.External; e != nil {
		out.External = &autoscalingv2.ExternalMetricStatus{Metric: autoscalingv2.MetricIdentifier{Name: e.MetricName, Selector: e.MetricSelector},
			Current: autoscalingv2.MetricValueStatus{Value: ptrTo(e.CurrentValue.DeepCopy()), AverageValue: e.CurrentAverageValue}}
	}
	return out
}
