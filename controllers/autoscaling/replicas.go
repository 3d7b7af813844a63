package autoscaling

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/utils/clock"
)

// calculator turns pod samples into replica counts, as upstream's replica
// calculator does.
type calculator struct {
	metrics MetricsSource
	pods    corelisters.PodLister
	clock   clock.PassiveClock
	// tolerance is how far from 1 the usage ratio must be to act.
	tolerance float64
	// cpuInitialization is how long after a pod starts its CPU samples
	// may still include start-up work.
	cpuInitialization time.Duration
	// readinessDelay is how long after a pod starts it may turn unready
	// without having been ready.
	readinessDelay time.Duration
}

// resourceUtilization is the outcome of a utilization target.
type resourceUtilization struct {
	replicas    int32
	utilization int32 // percent of request
	raw         int64 // average milli-usage
	timestamp   time.Time
}

// resourceReplicas proposes a replica count for a target utilization (a
// percentage of the pods' requests) of resource.
func (c *calculator) resourceReplicas(ctx context.Context, current, target int32, resource corev1.ResourceName, namespace string, selector labels.Selector, container string) (resourceUtilization, error) {
	metrics, ts, err := c.metrics.ResourceMetric(ctx, resource, namespace, selector, container)
	if err != nil {
		return resourceUtilization{}, fmt.Errorf("unable to get metrics for resource %s: %w", resource, err)
	}
	pods, err := c.pods.Pods(namespace).List(selector)
	if err != nil {
		return resourceUtilization{}, fmt.Errorf("unable to get pods while calculating replica count: %w", err)
	}
	if len(pods) == 0 {
		return resourceUtilization{}, errors.New("no pods returned by selector while calculating replica count")
	}
	metrics = clonePodMetrics(metrics)
	ready, unready, missing, ignored := c.groupPods(pods, metrics, resource)
	removePods(metrics, ignored)
	removePods(metrics, unready)
	if len(metrics) == 0 {
		return resourceUtilization{}, errors.New("did not receive metrics for targeted pods (pods might be unready)")
	}
	requests, err := podRequests(pods, container, resource)
	if err != nil {
		return resourceUtilization{}, err
	}
	ratio, utilization, raw, err := utilizationRatio(metrics, requests, target)
	if err != nil {
		return resourceUtilization{}, err
	}
	res := resourceUtilization{replicas: current, utilization: utilization, raw: raw, timestamp: ts}

	withUnready := unready.Len() > 0 && ratio > 1.0
	if !withUnready && missing.Len() == 0 {
		if math.Abs(1.0-ratio) > c.tolerance {
			res.replicas = int32(math.Ceil(ratio * float64(ready)))
		}
		return res, nil
	}
	if missing.Len() > 0 {
		switch {
		case ratio < 1.0:
			// Scaling down: a pod without a sample counts as using
			// its whole request (or the target, if above 100%).
			fallback := int64(max(100, target))
			for name := range missing {
				metrics[name] = PodMetric{Value: requests[name] * fallback / 100}
			}
		case ratio > 1.0:
			// Scaling up: as using nothing.
			for name := range missing {
				metrics[name] = PodMetric{Value: 0}
			}
		}
	}
	if withUnready {
		for name := range unready {
			metrics[name] = PodMetric{Value: 0}
		}
	}
	newRatio, _, _, err := utilizationRatio(metrics, requests, target)
	if err != nil {
		return resourceUtilization{}, err
	}
	res.replicas = c.rebalanced(current, ratio, newRatio, len(metrics))
	return res, nil
}

// rawResourceReplicas proposes a replica count for a target average usage
// (milli-units per pod) of resource.
func (c *calculator) rawResourceReplicas(ctx context.Context, current int32, target int64, resource corev1.ResourceName, namespace string, selector labels.Selector, container string) (int32, int64, time.Time, error) {
	metrics, ts, err := c.metrics.ResourceMetric(ctx, resource, namespace, selector, container)
	if err != nil {
		return 0, 0, time.Time{}, fmt.Errorf("unable to get metrics for resource %s: %w", resource, err)
	}
	replicas, usage, err := c.plainReplicas(clonePodMetrics(metrics), current, target, namespace, selector, resource)
	return replicas, usage, ts, err
}

// plainReplicas proposes a replica count for a target average value.
func (c *calculator) plainReplicas(metrics PodMetrics, current int32, target int64, namespace string, selector labels.Selector, resource corev1.ResourceName) (int32, int64, error) {
	pods, err := c.pods.Pods(namespace).List(selector)
	if err != nil {
		return 0, 0, fmt.Errorf("unable to get pods while calculating replica count: %w", err)
	}
	if len(pods) == 0 {
		return 0, 0, errors.New("no pods returned by selector while calculating replica count")
	}
	ready, unready, missing, ignored := c.groupPods(pods, metrics, resource)
	removePods(metrics, ignored)
	removePods(metrics, unready)
	if len(metrics) == 0 {
		return 0, 0, errors.New("did not receive metrics for targeted pods (pods might be unready)")
	}
	ratio, usage := usageRatio(metrics, target)

	withUnready := unready.Len() > 0 && ratio > 1.0
	if !withUnready && missing.Len() == 0 {
		if math.Abs(1.0-ratio) <= c.tolerance {
			return current, usage, nil
		}
		return int32(math.Ceil(ratio * float64(ready))), usage, nil
	}
	if missing.Len() > 0 {
		switch {
		case ratio < 1.0:
			for name := range missing {
				metrics[name] = PodMetric{Value: target}
			}
		case ratio > 1.0:
			for name := range missing {
				metrics[name] = PodMetric{Value: 0}
			}
		}
	}
	if withUnready {
		for name := range unready {
			metrics[name] = PodMetric{Value: 0}
		}
	}
	newRatio, _ := usageRatio(metrics, target)
	return c.rebalanced(current, ratio, newRatio, len(metrics)), usage, nil
}

// rebalanced is the proposal once missing and unready pods were given
// assumed samples: no change if that brings the ratio within tolerance or
// turns the direction of scaling around.
func (c *calculator) rebalanced(current int32, ratio, newRatio float64, samples int) int32 {
	if math.Abs(1.0-newRatio) <= c.tolerance || (ratio < 1.0 && newRatio > 1.0) || (ratio > 1.0 && newRatio < 1.0) {
		return current
	}
	replicas := int32(math.Ceil(newRatio * float64(samples)))
	if (newRatio < 1.0 && replicas > current) || (newRatio > 1.0 && replicas < current) {
		return current
	}
	return replicas
}

// groupPods sorts pods into those counted (ready), those left out while
// they start (unready: pending, or for CPU not ready or sampled too close
// to becoming ready), those without a sample (missing) and those going
// away (ignored: deleted or failed).
func (c *calculator) groupPods(pods []*corev1.Pod, metrics PodMetrics, resource corev1.ResourceName) (ready int, unready, missing, ignored sets.Set[string]) {
	unready, missing, ignored = sets.New[string](), sets.New[string](), sets.New[string]()
	now := c.clock.Now()
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed {
			ignored.Insert(p.Name)
			continue
		}
		if p.Status.Phase == corev1.PodPending {
			unready.Insert(p.Name)
			continue
		}
		m, ok := metrics[p.Name]
		if !ok {
			missing.Insert(p.Name)
			continue
		}
		if resource == corev1.ResourceCPU && c.cpuUnready(p, m, now) {
			unready.Insert(p.Name)
			continue
		}
		ready++
	}
	return ready, unready, missing, ignored
}

// cpuUnready reports whether a pod's CPU sample is to be left out: within
// the initialization period, while it is unready or if the sample does not
// cover a whole window since it became ready; after it, only if it has
// never been ready.
func (c *calculator) cpuUnready(p *corev1.Pod, m PodMetric, now time.Time) bool {
	var cond *corev1.PodCondition
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			cond = &p.Status.Conditions[i]
		}
	}
	if cond == nil || p.Status.StartTime == nil {
		return true
	}
	start := p.Status.StartTime.Time
	if start.Add(c.cpuInitialization).After(now) {
		return cond.Status == corev1.ConditionFalse || m.Timestamp.Before(cond.LastTransitionTime.Add(m.Window))
	}
	return cond.Status == corev1.ConditionFalse && start.Add(c.readinessDelay).After(cond.LastTransitionTime.Time)
}

// podRequests sums the requests of resource of each pod's containers (and
// sidecar init containers), or of the named container alone.
func podRequests(pods []*corev1.Pod, container string, resource corev1.ResourceName) (map[string]int64, error) {
	requests := make(map[string]int64, len(pods))
	for _, p := range pods {
		containers := append([]corev1.Container{}, p.Spec.Containers...)
		for _, c := range p.Spec.InitContainers {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				containers = append(containers, c)
			}
		}
		sum := int64(0)
		for _, c := range containers {
			if container != "" && container != c.Name {
				continue
			}
			q, ok := c.Resources.Requests[resource]
			if !ok {
				return nil, fmt.Errorf("missing request for %s in container %s of Pod %s", resource, c.Name, p.Name)
			}
			sum += q.MilliValue()
		}
		requests[p.Name] = sum
	}
	return requests, nil
}

// utilizationRatio returns usage over requests as a ratio to the target
// percentage, the utilization in percent and the average milli-usage.
func utilizationRatio(metrics PodMetrics, requests map[string]int64, target int32) (float64, int32, int64, error) {
	var usage, requested int64
	n := 0
	for name, m := range metrics {
		r, ok := requests[name]
		if !ok {
			continue // a sample of a pod no longer listed
		}
		usage += m.Value
		requested += r
		n++
	}
	if requested == 0 {
		return 0, 0, 0, errors.New("no metrics returned matched known pods")
	}
	utilization := int32(usage * 100 / requested)
	return float64(utilization) / float64(target), utilization, usage / int64(n), nil
}

// usageRatio returns the average usage as a ratio to the target and the
// average itself.
func usageRatio(metrics PodMetrics, target int64) (float64, int64) {
	var total int64
	for _, m := range metrics {
		total += m.Value
	}
	avg := total / int64(len(metrics))
	return float64(avg) / float64(target), avg
}

func removePods(metrics PodMetrics, names sets.Set[string]) {
	for name := range names {
		delete(metrics, name)
	}
}

func clonePodMetrics(m PodMetrics) PodMetrics {
	out := make(PodMetrics, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
