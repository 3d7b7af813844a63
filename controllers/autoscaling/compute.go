package autoscaling

import (
	"context"
	"errors"
	"fmt"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// ReasonNodesUnreachable is the ScalingActive reason, and the event
// reason, of an autoscaler holding its scale because some of its target's
// pods run on nodes the hub cannot reach.
const ReasonNodesUnreachable = "NodesUnreachable"

// parseSelector reads the target's pod selector from its scale.
func (c *Controller) parseSelector(hpa *autoscalingv2.HorizontalPodAutoscaler, selector string) (labels.Selector, error) {
	if selector == "" {
		msg := "selector is required"
		c.events.Eventf(hpa, corev1.EventTypeWarning, "SelectorRequired", "%s", msg)
		setCondition(hpa, autoscalingv2.ScalingActive, corev1.ConditionFalse, "InvalidSelector", "the HPA target's scale is missing a selector")
		return nil, errors.New(msg)
	}
	parsed, err := labels.Parse(selector)
	if err != nil {
		msg := fmt.Sprintf("couldn't convert selector into a corresponding internal selector object: %v", err)
		c.events.Eventf(hpa, corev1.EventTypeWarning, "InvalidSelector", "%s", msg)
		setCondition(hpa, autoscalingv2.ScalingActive, corev1.ConditionFalse, "InvalidSelector", "%s", msg)
		return nil, errors.New(msg)
	}
	return parsed, nil
}

// computeReplicasForMetrics returns the largest replica count the metrics
// propose, the metric that proposed it and every metric's status. When
// no metric can be computed, or some cannot and the others would scale
// down, it returns -1 and the first failure, and ScalingActive says so;
// when some fail and the others scale up or hold, it returns their
// proposal with the error.
func (c *Controller) computeReplicasForMetrics(ctx context.Context, hpa *autoscalingv2.HorizontalPodAutoscaler, sc *autoscalingv1.Scale, selector labels.Selector) (int32, string, []autoscalingv2.MetricStatus, error) {
	specs := hpa.Spec.Metrics
	statuses := make([]autoscalingv2.MetricStatus, len(specs))
	var (
		replicas     int32
		metric       string
		invalid      int
		firstErr     error
		firstFailure autoscalingv2.HorizontalPodAutoscalerCondition
	)
	for i, spec := range specs {
		proposal, name, cond, err := c.computeReplicasForMetric(ctx, hpa, spec, sc.Spec.Replicas, selector, &statuses[i])
		if err != nil {
			if invalid == 0 {
				firstFailure, firstErr = cond, err
			}
			invalid++
			continue
		}
		if replicas == 0 || proposal > replicas {
			replicas, metric = proposal, name
		}
	}
	if firstErr != nil {
		firstErr = fmt.Errorf("invalid metrics (%v invalid out of %v), first error is: %w", invalid, len(specs), firstErr)
	}
	if invalid >= len(specs) || (invalid > 0 && replicas < sc.Spec.Replicas) {
		setCondition(hpa, firstFailure.Type, firstFailure.Status, firstFailure.Reason, "%s", firstFailure.Message)
		return -1, "", statuses, firstErr
	}
	setCondition(hpa, autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound", "the HPA was able to successfully calculate a replica count from %s", metric)
	return replicas, metric, statuses, firstErr
}

// computeReplicasForMetric computes one metric's proposal and status; on
// failure it returns the ScalingActive condition to report.
func (c *Controller) computeReplicasForMetric(ctx context.Context, hpa *autoscalingv2.HorizontalPodAutoscaler, spec autoscalingv2.MetricSpec, current int32, selector labels.Selector, status *autoscalingv2.MetricStatus) (int32, string, autoscalingv2.HorizontalPodAutoscalerCondition, error) {
	switch spec.Type {
	case autoscalingv2.ResourceMetricSourceType:
		if spec.Resource == nil {
			break
		}
		replicas, value, name, err := c.resourceMetric(ctx, current, spec.Resource.Target, spec.Resource.Name, hpa.Namespace, "", selector, spec.Type)
		if err != nil {
			return 0, "", c.unableToCompute(hpa, "FailedGetResourceMetric", err), fmt.Errorf("failed to get %s resource metric value: %w", spec.Resource.Name, err)
		}
		*status = autoscalingv2.MetricStatus{Type: spec.Type, Resource: &autoscalingv2.ResourceMetricStatus{Name: spec.Resource.Name, Current: value}}
		return replicas, name, autoscalingv2.HorizontalPodAutoscalerCondition{}, nil
	case autoscalingv2.ContainerResourceMetricSourceType:
		if spec.ContainerResource == nil {
			break
		}
		cr := spec.ContainerResource
		replicas, value, name, err := c.resourceMetric(ctx, current, cr.Target, cr.Name, hpa.Namespace, cr.Container, selector, spec.Type)
		if err != nil {
			return 0, "", c.unableToCompute(hpa, "FailedGetContainerResourceMetric", err), fmt.Errorf("failed to get %s container metric value: %w", cr.Container, err)
		}
		*status = autoscalingv2.MetricStatus{Type: spec.Type, ContainerResource: &autoscalingv2.ContainerResourceMetricStatus{Name: cr.Name, Container: cr.Container, Current: value}}
		return replicas, name, autoscalingv2.HorizontalPodAutoscalerCondition{}, nil
	case autoscalingv2.PodsMetricSourceType, autoscalingv2.ObjectMetricSourceType:
		// The hub serves no custom.metrics.k8s.io API, so these fail as
		// they do upstream when no adapter is installed.
		err := errors.New("unable to fetch metrics from custom metrics API: the server could not find the requested resource")
		return 0, "", c.unableToCompute(hpa, "FailedGet"+string(spec.Type)+"Metric", err), err
	case autoscalingv2.ExternalMetricSourceType:
		err := errors.New("unable to fetch metrics from external metrics API: the server could not find the requested resource")
		return 0, "", c.unableToCompute(hpa, "FailedGetExternalMetric", err), err
	}
	err := fmt.Errorf("unknown metric source type %q", string(spec.Type))
	return 0, "", c.unableToCompute(hpa, "InvalidMetricSourceType", err), err
}

// resourceMetric computes a Resource or ContainerResource metric.
func (c *Controller) resourceMetric(ctx context.Context, current int32, target autoscalingv2.MetricTarget, res corev1.ResourceName, namespace, container string, selector labels.Selector, kind autoscalingv2.MetricSourceType) (int32, autoscalingv2.MetricValueStatus, string, error) {
	if target.AverageValue != nil {
		replicas, raw, _, err := c.calc.rawResourceReplicas(ctx, current, target.AverageValue.MilliValue(), res, namespace, selector, container)
		if err != nil {
			return 0, autoscalingv2.MetricValueStatus{}, "", fmt.Errorf("failed to get %s usage: %w", res, err)
		}
		return replicas, autoscalingv2.MetricValueStatus{AverageValue: resource.NewMilliQuantity(raw, resource.DecimalSI)}, fmt.Sprintf("%s resource", res), nil
	}
	if target.AverageUtilization == nil {
		return 0, autoscalingv2.MetricValueStatus{}, "", errors.New("invalid resource metric source: neither an average utilization target nor an average value (usage) target was set")
	}
	u, err := c.calc.resourceReplicas(ctx, current, *target.AverageUtilization, res, namespace, selector, container)
	if err != nil {
		return 0, autoscalingv2.MetricValueStatus{}, "", fmt.Errorf("failed to get %s utilization: %w", res, err)
	}
	name := fmt.Sprintf("%s resource utilization (percentage of request)", res)
	if kind == autoscalingv2.ContainerResourceMetricSourceType {
		name = fmt.Sprintf("%s container resource utilization (percentage of request)", res)
	}
	utilization := u.utilization
	return u.replicas, autoscalingv2.MetricValueStatus{
		AverageUtilization: &utilization,
		AverageValue:       resource.NewMilliQuantity(u.raw, resource.DecimalSI),
	}, name, nil
}

// unableToCompute records a metric's failure as an event and returns the
// ScalingActive condition for it.
func (c *Controller) unableToCompute(hpa *autoscalingv2.HorizontalPodAutoscaler, reason string, err error) autoscalingv2.HorizontalPodAutoscalerCondition {
	c.events.Eventf(hpa, corev1.EventTypeWarning, reason, "%s", err.Error())
	return autoscalingv2.HorizontalPodAutoscalerCondition{
		Type:    autoscalingv2.ScalingActive,
		Status:  corev1.ConditionFalse,
		Reason:  reason,
		Message: fmt.Sprintf("the HPA was unable to compute the replica count: %v", err),
	}
}

// normalize stabilizes and limits a proposal and sets AbleToScale and
// ScalingLimited to say how.
func (c *Controller) normalize(hpa *autoscalingv2.HorizontalPodAutoscaler, key string, current, proposed, minReplicas int32, now time.Time) int32 {
	if hpa.Spec.Behavior == nil {
		stable := c.history.stabilize(key, proposed, c.cfg.DownscaleStabilization, now)
		if stable != proposed {
			setCondition(hpa, autoscalingv2.AbleToScale, corev1.ConditionTrue, "ScaleDownStabilized", "recent recommendations were higher than current one, applying the highest recent recommendation")
		} else {
			setCondition(hpa, autoscalingv2.AbleToScale, corev1.ConditionTrue, "ReadyForNewScale", "recommended size matches current size")
		}
		desired, reason, msg := limitWithRules(current, stable, minReplicas, hpa.Spec.MaxReplicas)
		setLimited(hpa, desired != stable, reason, msg)
		return desired
	}
	b := withDefaults(hpa.Spec.Behavior, c.cfg.DownscaleStabilization)
	stable, reason, msg := c.history.stabilizeWithBehavior(key, current, proposed, b.ScaleUp, b.ScaleDown, now)
	if stable != proposed {
		setCondition(hpa, autoscalingv2.AbleToScale, corev1.ConditionTrue, reason, "%s", msg)
	} else {
		setCondition(hpa, autoscalingv2.AbleToScale, corev1.ConditionTrue, "ReadyForNewScale", "recommended size matches current size")
	}
	desired, reason, msg := c.history.rateLimited(key, current, stable, minReplicas, hpa.Spec.MaxReplicas, b.ScaleUp, b.ScaleDown, now)
	setLimited(hpa, desired != stable, reason, msg)
	return desired
}

func setLimited(hpa *autoscalingv2.HorizontalPodAutoscaler, limited bool, reason, msg string) {
	status := corev1.ConditionFalse
	if limited {
		status = corev1.ConditionTrue
	}
	setCondition(hpa, autoscalingv2.ScalingLimited, status, reason, "%s", msg)
}

// setCondition sets a condition of hpa, adding it if absent; its
// transition time changes only with its status.
func setCondition(hpa *autoscalingv2.HorizontalPodAutoscaler, t autoscalingv2.HorizontalPodAutoscalerConditionType, status corev1.ConditionStatus, reason, format string, args ...any) {
	conds := hpa.Status.Conditions
	i := 0
	for ; i < len(conds) && conds[i].Type != t; i++ {
	}
	if i == len(conds) {
		conds = append(conds, autoscalingv2.HorizontalPodAutoscalerCondition{Type: t})
	}
	if conds[i].Status != status {
		conds[i].LastTransitionTime = metav1.Now()
	}
	conds[i].Status, conds[i].Reason, conds[i].Message = status, reason, fmt.Sprintf(format, args...)
	hpa.Status.Conditions = conds
}
