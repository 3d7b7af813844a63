package registry

import (
	"fmt"
	"strings"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// autoscalingKinds returns the autoscaling group's kinds:
// HorizontalPodAutoscaler in autoscaling/v2, the stored version, and in
// autoscaling/v1, a view of the same objects converted as kube-apiserver
// converts them. served returns the kinds the hub serves now (custom
// resources included), against which scaleTargetRef is checked.
func autoscalingKinds(served func() []*Kind) []*Kind {
	v2 := hpaV2Kind(served)
	return []*Kind{v2, hpaV1Kind(v2)}
}

// hpaColumns are the columns of kube-apiserver's autoscaler table.
var hpaColumns = []metav1.TableColumnDefinition{
	nameColumn,
	column("Reference", "string", 0, autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()["scaleTargetRef"]),
	column("Targets", "string", 0, autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()["metrics"]),
	column("MinPods", "string", 0, autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()["minReplicas"]),
	column("MaxPods", "integer", 0, autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()["maxReplicas"]),
	column("Replicas", "integer", 0, autoscalingv2.HorizontalPodAutoscalerStatus{}.SwaggerDoc()["currentReplicas"]),
	ageColumn,
}

func hpaV2Kind(served func() []*Kind) *Kind {
	validate := func(h *autoscalingv2.HorizontalPodAutoscaler, old *autoscalingv2.HorizontalPodAutoscaler) field.ErrorList {
		minZero := old != nil && old.Spec.MinReplicas != nil && *old.Spec.MinReplicas == 0
		errs := validateHPASpec(&h.Spec, minZero)
		if served != nil {
			errs = append(errs, validateScaleTarget(h.Spec.ScaleTargetRef, served())...)
		}
		return errs
	}
	return &Kind{
		GVK:        autoscalingv2.SchemeGroupVersion.WithKind("HorizontalPodAutoscaler"),
		Resource:   "horizontalpodautoscalers",
		Singular:   "horizontalpodautoscaler",
		Namespaced: true,
		ShortNames: []string{"hpa"},
		Categories: []string{"all"},
		HasStatus:  true,
		HasSpec:    true,
		Default:    func(obj runtime.Object) { defaultHPA(obj.(*autoscalingv2.HorizontalPodAutoscaler)) },
		Validate: func(obj runtime.Object) field.ErrorList {
			return validate(obj.(*autoscalingv2.HorizontalPodAutoscaler), nil)
		},
		ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
			return validate(obj.(*autoscalingv2.HorizontalPodAutoscaler), old.(*autoscalingv2.HorizontalPodAutoscaler))
		},
		ValidateStatusUpdate: func(obj, _ runtime.Object) field.ErrorList {
			return validateHPAStatus(&obj.(*autoscalingv2.HorizontalPodAutoscaler).Status)
		},
		Columns: hpaColumns,
		Cells: func(obj runtime.Object, now time.Time) []any {
			return hpaCells(obj.(*autoscalingv2.HorizontalPodAutoscaler), now)
		},
	}
}

// hpaV1Kind serves autoscaling/v1 autoscalers as a view of v2's objects:
// its hooks convert to v2 and run v2's, so defaults, validation (with v2's
// field paths, as kube-apiserver validates its internal form) and the
// table are the same in both versions.
func hpaV1Kind(v2 *Kind) *Kind {
	return &Kind{
		GVK:        autoscalingv1.SchemeGroupVersion.WithKind("HorizontalPodAutoscaler"),
		Resource:   "horizontalpodautoscalers",
		Singular:   "horizontalpodautoscaler",
		Namespaced: true,
		ShortNames: []string{"hpa"},
		Categories: []string{"all"},
		HasStatus:  true,
		HasSpec:    true,
		StoredAs:   v2.GVK,
		ToStorage: func(obj runtime.Object) (runtime.Object, error) {
			switch h := obj.(type) {
			case *autoscalingv1.HorizontalPodAutoscaler:
				out, err := hpaV1ToV2(h)
				if err != nil {
					return nil, fmt.Errorf("convert %s to autoscaling/v2: %w", h.Name, err)
				}
				defaultHPA(out)
				return out, nil
			case *autoscalingv2.HorizontalPodAutoscaler:
				return h, nil
			}
			return nil, fmt.Errorf("convert %T to an autoscaling/v2 HorizontalPodAutoscaler: unexpected type", obj)
		},
		FromStorage: func(obj runtime.Object) (runtime.Object, error) {
			switch h := obj.(type) {
			case *autoscalingv2.HorizontalPodAutoscaler:
				out, err := hpaV2ToV1(h)
				if err != nil {
					return nil, fmt.Errorf("convert %s to autoscaling/v1: %w", h.Name, err)
				}
				return out, nil
			case *autoscalingv1.HorizontalPodAutoscaler:
				return h, nil
			}
			return nil, fmt.Errorf("convert %T to an autoscaling/v1 HorizontalPodAutoscaler: unexpected type", obj)
		},
		Default: func(obj runtime.Object) {
			h := obj.(*autoscalingv1.HorizontalPodAutoscaler)
			if h.Spec.MinReplicas == nil {
				h.Spec.MinReplicas = ptrTo[int32](1)
			}
		},
		// Status lives in annotations too in v1: a create keeps none, a
		// write of the main resource keeps the stored one, a write of
		// status keeps the stored spec's.
		PrepareForCreate: func(obj runtime.Object) {
			h := obj.(*autoscalingv1.HorizontalPodAutoscaler)
			h.Annotations = dropHPAAnnotations(h.Annotations, hpaStatusAnnotations)
		},
		PrepareForUpdate: func(obj, old runtime.Object) {
			keepAnnotations(&obj.(*autoscalingv1.HorizontalPodAutoscaler).ObjectMeta, &old.(*autoscalingv1.HorizontalPodAutoscaler).ObjectMeta, hpaStatusAnnotations)
		},
		PrepareForStatusUpdate: func(obj, old runtime.Object) {
			spec := []string{hpaMetricSpecsAnnotation, hpaBehaviorAnnotation, hpaScaleUpTolAnnotation, hpaScaleDownTolAnnotation}
			keepAnnotations(&obj.(*autoscalingv1.HorizontalPodAutoscaler).ObjectMeta, &old.(*autoscalingv1.HorizontalPodAutoscaler).ObjectMeta, spec)
		},
		GenerationChanged: func(obj, old runtime.Object) bool {
			a, b := asHPAv2(obj), asHPAv2(old)
			return a == nil || b == nil || !apiequality.Semantic.DeepEqual(a.Spec, b.Spec)
		},
		Validate: func(obj runtime.Object) field.ErrorList {
			h := asHPAv2(obj)
			if h == nil {
				return field.ErrorList{field.InternalError(gSpec, fmt.Errorf("convert to autoscaling/v2"))}
			}
			return v2.Validate(h)
		},
		ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
			h, o := asHPAv2(obj), asHPAv2(old)
			if h == nil || o == nil {
				return field.ErrorList{field.InternalError(gSpec, fmt.Errorf("convert to autoscaling/v2"))}
			}
			return v2.ValidateUpdate(h, o)
		},
		ValidateStatusUpdate: func(obj, _ runtime.Object) field.ErrorList {
			s := obj.(*autoscalingv1.HorizontalPodAutoscaler).Status
			return validateHPAStatus(&autoscalingv2.HorizontalPodAutoscalerStatus{CurrentReplicas: s.CurrentReplicas, DesiredReplicas: s.DesiredReplicas})
		},
		Columns: hpaColumns,
		Cells: func(obj runtime.Object, now time.Time) []any {
			h := asHPAv2(obj)
			if h == nil {
				return []any{"", "", "", "", int64(0), int64(0), ""}
			}
			return hpaCells(h, now)
		},
	}
}

// asHPAv2 returns obj, an autoscaler of either version, as a defaulted
// autoscaling/v2 object; nil if it cannot be converted.
func asHPAv2(obj runtime.Object) *autoscalingv2.HorizontalPodAutoscaler {
	switch h := obj.(type) {
	case *autoscalingv2.HorizontalPodAutoscaler:
		return h
	case *autoscalingv1.HorizontalPodAutoscaler:
		out, err := hpaV1ToV2(h)
		if err != nil {
			return nil
		}
		defaultHPA(out)
		return out
	}
	return nil
}

// keepAnnotations sets the keys of obj's annotations to old's values,
// removing those old has not.
func keepAnnotations(obj, old *metav1.ObjectMeta, keys []string) {
	obj.Annotations = dropHPAAnnotations(obj.Annotations, keys)
	copied := false
	for _, k := range keys {
		if v, ok := old.Annotations[k]; ok {
			setHPAAnnotation(&obj.Annotations, &copied, k, v)
		}
	}
}

// defaultHPA sets kube-apiserver's autoscaling/v2 defaults: one replica at
// least, a CPU utilization target of 80% when no metric is named, and,
// when a behavior is given, every rule it leaves out.
func defaultHPA(h *autoscalingv2.HorizontalPodAutoscaler) {
	if h.Spec.MinReplicas == nil {
		h.Spec.MinReplicas = ptrTo[int32](1)
	}
	if len(h.Spec.Metrics) == 0 {
		h.Spec.Metrics = []autoscalingv2.MetricSpec{cpuUtilizationMetric(defaultCPUUtilization)}
	}
	if b := h.Spec.Behavior; b != nil {
		b.ScaleUp = defaultScalingRules(b.ScaleUp, true)
		b.ScaleDown = defaultScalingRules(b.ScaleDown, false)
	}
}

// defaultScalingRules fills what r leaves out. Scaling up is immediate and
// adds at most 4 pods or doubles every 15s, whichever is more; scaling
// down may remove every pod every 15s, and its stabilization window is
// left unset, for the controller's own default (300s) to apply.
func defaultScalingRules(r *autoscalingv2.HPAScalingRules, up bool) *autoscalingv2.HPAScalingRules {
	out := &autoscalingv2.HPAScalingRules{SelectPolicy: ptrTo(autoscalingv2.MaxChangePolicySelect)}
	if up {
		out.StabilizationWindowSeconds = ptrTo[int32](0)
		out.Policies = []autoscalingv2.HPAScalingPolicy{
			{Type: autoscalingv2.PodsScalingPolicy, Value: 4, PeriodSeconds: 15},
			{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15},
		}
	} else {
		out.Policies = []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15}}
	}
	if r == nil {
		return out
	}
	if r.SelectPolicy != nil {
		out.SelectPolicy = r.SelectPolicy
	}
	if r.StabilizationWindowSeconds != nil {
		out.StabilizationWindowSeconds = r.StabilizationWindowSeconds
	}
	if r.Policies != nil {
		out.Policies = r.Policies
	}
	out.Tolerance = r.Tolerance
	return out
}

// hpaCells is one row of the autoscaler table.
func hpaCells(h *autoscalingv2.HorizontalPodAutoscaler, now time.Time) []any {
	minPods := "<unset>"
	if h.Spec.MinReplicas != nil {
		minPods = itoa32(*h.Spec.MinReplicas)
	}
	ref := h.Spec.ScaleTargetRef.Kind + "/" + h.Spec.ScaleTargetRef.Name
	return []any{h.Name, ref, hpaTargets(h.Spec.Metrics, h.Status.CurrentMetrics), minPods,
		int64(h.Spec.MaxReplicas), int64(h.Status.CurrentReplicas), age(h.CreationTimestamp, now)}
}

// hpaTargets renders the Targets cell as kube-apiserver does: each metric's
// current and target value ("cpu: 40%/50%"), the current one "<unknown>"
// until measured, at most two metrics and a count of the rest.
func hpaTargets(specs []autoscalingv2.MetricSpec, statuses []autoscalingv2.MetricStatus) string {
	if len(specs) == 0 {
		return "<none>"
	}
	const shown = 2
	var list []string
	for i, s := range specs {
		var st *autoscalingv2.MetricStatus
		if i < len(statuses) {
			st = &statuses[i]
		}
		list = append(list, hpaTarget(&s, st))
	}
	if len(list) > shown {
		return fmt.Sprintf("%s + %d more...", strings.Join(list[:shown], ", "), len(list)-shown)
	}
	return strings.Join(list, ", ")
}

// valueTarget renders an Object or External metric's cell: its average
// value against the target's, marked "(avg)", or else its value.
func valueTarget(t autoscalingv2.MetricTarget, current *autoscalingv2.MetricValueStatus) string {
	cur := "<unknown>"
	if t.AverageValue != nil {
		if current != nil && current.AverageValue != nil {
			cur = current.AverageValue.String()
		}
		return fmt.Sprintf("%s/%s (avg)", cur, t.AverageValue.String())
	}
	if current != nil {
		cur = current.Value.String()
	}
	return fmt.Sprintf("%s/%s", cur, t.Value.String())
}

// hpaTarget renders one metric of the Targets cell; st is the status at
// the same index, if any.
func hpaTarget(s *autoscalingv2.MetricSpec, st *autoscalingv2.MetricStatus) string {
	const unknown = "<unknown>"
	cur := unknown
	switch s.Type {
	case autoscalingv2.ExternalMetricSourceType:
		if s.External == nil {
			break
		}
		var current *autoscalingv2.MetricValueStatus
		if st != nil && st.External != nil {
			current = &st.External.Current
		}
		return valueTarget(s.External.Target, current)
	case autoscalingv2.PodsMetricSourceType:
		if s.Pods == nil {
			break
		}
		if st != nil && st.Pods != nil {
			cur = st.Pods.Current.AverageValue.String()
		}
		return fmt.Sprintf("%s/%s", cur, s.Pods.Target.AverageValue.String())
	case autoscalingv2.ObjectMetricSourceType:
		if s.Object == nil {
			break
		}
		var current *autoscalingv2.MetricValueStatus
		if st != nil && st.Object != nil {
			current = &st.Object.Current
		}
		return valueTarget(s.Object.Target, current)
	case autoscalingv2.ResourceMetricSourceType:
		if s.Resource == nil {
			break
		}
		var current *autoscalingv2.MetricValueStatus
		if st != nil && st.Resource != nil {
			current = &st.Resource.Current
		}
		return resourceTarget(string(s.Resource.Name), s.Resource.Target, current)
	case autoscalingv2.ContainerResourceMetricSourceType:
		if s.ContainerResource == nil {
			break
		}
		var current *autoscalingv2.MetricValueStatus
		if st != nil && st.ContainerResource != nil {
			current = &st.ContainerResource.Current
		}
		return resourceTarget(string(s.ContainerResource.Name), s.ContainerResource.Target, current)
	}
	return "<unknown type>"
}

// resourceTarget renders a (container) resource metric: "cpu: 40%/50%" or
// "memory: 100Mi/200Mi".
func resourceTarget(name string, t autoscalingv2.MetricTarget, cur *autoscalingv2.MetricValueStatus) string {
	c := "<unknown>"
	if t.AverageValue != nil {
		if cur != nil {
			c = cur.AverageValue.String()
		}
		return fmt.Sprintf("%s: %s/%s", name, c, t.AverageValue.String())
	}
	if cur != nil && cur.AverageUtilization != nil {
		c = fmt.Sprintf("%d%%", *cur.AverageUtilization)
	}
	target := "<auto>"
	if t.AverageUtilization != nil {
		target = fmt.Sprintf("%d%%", *t.AverageUtilization)
	}
	return fmt.Sprintf("%s: %s/%s", name, c, target)
}
