package registry

import (
	"reflect"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func hpaQ(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

// hpaEveryMetric is an autoscaler using every metric source, a behavior
// with tolerances, current metrics and conditions.
func hpaEveryMetric() *autoscalingv2.HorizontalPodAutoscaler {
	ref := autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"q": "x"}}
	return &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Annotations: map[string]string{"keep": "me"}},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: ref, MinReplicas: ptrTo[int32](2), MaxReplicas: 9,
			Metrics: []autoscalingv2.MetricSpec{
				{Type: "Object", Object: &autoscalingv2.ObjectMetricSource{DescribedObject: ref, Metric: autoscalingv2.MetricIdentifier{Name: "rps", Selector: sel},
					Target: autoscalingv2.MetricTarget{Type: "Value", Value: hpaQ("10")}}},
				{Type: "Pods", Pods: &autoscalingv2.PodsMetricSource{Metric: autoscalingv2.MetricIdentifier{Name: "qps"},
					Target: autoscalingv2.MetricTarget{Type: "AverageValue", AverageValue: hpaQ("2")}}},
				{Type: "Resource", Resource: &autoscalingv2.ResourceMetricSource{Name: "memory",
					Target: autoscalingv2.MetricTarget{Type: "AverageValue", AverageValue: hpaQ("100Mi")}}},
				{Type: "ContainerResource", ContainerResource: &autoscalingv2.ContainerResourceMetricSource{Name: "cpu", Container: "app",
					Target: autoscalingv2.MetricTarget{Type: "Utilization", AverageUtilization: ptrTo[int32](70)}}},
				{Type: "External", External: &autoscalingv2.ExternalMetricSource{Metric: autoscalingv2.MetricIdentifier{Name: "queue", Selector: sel},
					Target: autoscalingv2.MetricTarget{Type: "AverageValue", AverageValue: hpaQ("30")}}},
				cpuUtilizationMetric(50),
			},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
				ScaleUp: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptrTo[int32](0), SelectPolicy: ptrTo(autoscalingv2.MaxChangePolicySelect),
					Policies: []autoscalingv2.HPAScalingPolicy{{Type: "Pods", Value: 4, PeriodSeconds: 15}}, Tolerance: hpaQ("50m")},
				ScaleDown: &autoscalingv2.HPAScalingRules{SelectPolicy: ptrTo(autoscalingv2.DisabledPolicySelect),
					Policies: []autoscalingv2.HPAScalingPolicy{{Type: "Percent", Value: 10, PeriodSeconds: 60}}},
			},
		},
		Status: autoscalingv2.HorizontalPodAutoscalerStatus{
			ObservedGeneration: ptrTo[int64](3), CurrentReplicas: 4, DesiredReplicas: 5,
			CurrentMetrics: []autoscalingv2.MetricStatus{
				{Type: "Pods", Pods: &autoscalingv2.PodsMetricStatus{Metric: autoscalingv2.MetricIdentifier{Name: "qps"},
					Current: autoscalingv2.MetricValueStatus{AverageValue: hpaQ("1500m")}}},
				{Type: "Resource", Resource: &autoscalingv2.ResourceMetricStatus{Name: "cpu",
					Current: autoscalingv2.MetricValueStatus{AverageUtilization: ptrTo[int32](42), AverageValue: hpaQ("210m")}}},
			},
			Conditions: []autoscalingv2.HorizontalPodAutoscalerCondition{{Type: "AbleToScale", Status: "True", Reason: "ReadyForNewScale",
				LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}},
		},
	}
}

func TestHPAConversionRoundTrip(t *testing.T) {
	in := hpaEveryMetric()
	v1, err := hpaV2ToV1(in.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if p := v1.Spec.TargetCPUUtilizationPercentage; p == nil || *p != 50 {
		t.Errorf("targetCPUUtilizationPercentage %v", p)
	}
	if p := v1.Status.CurrentCPUUtilizationPercentage; p == nil || *p != 42 {
		t.Errorf("currentCPUUtilizationPercentage %v", p)
	}
	for _, a := range hpaRoundTripAnnotations {
		if a != hpaScaleDownTolAnnotation && v1.Annotations[a] == "" {
			t.Errorf("annotation %s missing", a)
		}
	}
	back, err := hpaV1ToV2(v1)
	if err != nil {
		t.Fatal(err)
	}
	back.TypeMeta = in.TypeMeta
	if !reflect.DeepEqual(back.Annotations, in.Annotations) {
		t.Errorf("annotations %v", back.Annotations)
	}
	// The CPU utilization target comes back last, as kube-apiserver
	// orders it; everything else is as it was.
	if !apiequality.Semantic.DeepEqual(back.Spec.Metrics, in.Spec.Metrics) {
		t.Errorf("metrics\n%+v\nwant\n%+v", back.Spec.Metrics, in.Spec.Metrics)
	}
	if !apiequality.Semantic.DeepEqual(back.Spec.Behavior, in.Spec.Behavior) {
		t.Errorf("behavior %+v", back.Spec.Behavior)
	}
	if !apiequality.Semantic.DeepEqual(back.Status, in.Status) {
		t.Errorf("status\n%+v\nwant\n%+v", back.Status, in.Status)
	}
	// The scheme converts as well, for the field managers.
	s, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	var viaScheme autoscalingv1.HorizontalPodAutoscaler
	if err := s.Convert(in.DeepCopy(), &viaScheme, nil); err != nil || !apiequality.Semantic.DeepEqual(viaScheme.Spec, v1.Spec) {
		t.Errorf("scheme conversion: %v %+v", err, viaScheme.Spec)
	}
}

func TestHPAV1WithoutTargetDefaultsToCPU80(t *testing.T) {
	out, err := hpaV1ToV2(&autoscalingv1.HorizontalPodAutoscaler{Spec: autoscalingv1.HorizontalPodAutoscalerSpec{MaxReplicas: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defaultHPA(out)
	if !reflect.DeepEqual(out.Spec.Metrics, []autoscalingv2.MetricSpec{cpuUtilizationMetric(80)}) || *out.Spec.MinReplicas != 1 {
		t.Errorf("spec %+v", out.Spec)
	}
	// A malformed annotation is ignored, not an error.
	out, err = hpaV1ToV2(&autoscalingv1.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		hpaMetricSpecsAnnotation: "{", hpaBehaviorAnnotation: "[]"}}})
	if err != nil || out.Spec.Behavior != nil || len(out.Spec.Metrics) != 1 || len(out.Annotations) != 0 {
		t.Errorf("malformed annotations: %v %+v", err, out)
	}
}

func TestHPATargetsCell(t *testing.T) {
	h := hpaEveryMetric()
	h.Status.CurrentMetrics = nil
	cells := hpaCells(h, time.Now())
	want := []any{"web", "Deployment/web", "<unknown>/10, <unknown>/2 + 4 more...", "2", int64(9), int64(4)}
	if !reflect.DeepEqual(cells[:6], want) {
		t.Errorf("cells %q, want %q", cells[:6], want)
	}
	for _, c := range []struct {
		spec autoscalingv2.MetricSpec
		st   *autoscalingv2.MetricStatus
		want string
	}{
		{cpuUtilizationMetric(50), nil, "cpu: <unknown>/50%"},
		{cpuUtilizationMetric(50), &autoscalingv2.MetricStatus{Resource: &autoscalingv2.ResourceMetricStatus{Current: autoscalingv2.MetricValueStatus{AverageUtilization: ptrTo[int32](40)}}}, "cpu: 40%/50%"},
		{h.Spec.Metrics[2], &autoscalingv2.MetricStatus{Resource: &autoscalingv2.ResourceMetricStatus{Current: autoscalingv2.MetricValueStatus{AverageValue: hpaQ("50Mi")}}}, "memory: 50Mi/100Mi"},
		{h.Spec.Metrics[3], nil, "cpu: <unknown>/70%"},
		{h.Spec.Metrics[4], nil, "<unknown>/30 (avg)"},
		{h.Spec.Metrics[0], &autoscalingv2.MetricStatus{Object: &autoscalingv2.ObjectMetricStatus{Current: autoscalingv2.MetricValueStatus{Value: hpaQ("7")}}}, "7/10"},
		{h.Spec.Metrics[4], &autoscalingv2.MetricStatus{External: &autoscalingv2.ExternalMetricStatus{Current: autoscalingv2.MetricValueStatus{AverageValue: hpaQ("12")}}}, "12/30 (avg)"},
		{autoscalingv2.MetricSpec{Type: "Bogus"}, nil, "<unknown type>"},
	} {
		if got := hpaTarget(&c.spec, c.st); got != c.want {
			t.Errorf("%s: got %q, want %q", c.want, got, c.want)
		}
	}
	if got := hpaTargets(nil, nil); got != "<none>" {
		t.Errorf("no metrics: %q", got)
	}
}
