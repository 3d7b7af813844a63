package autoscaling

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"
)

// PodMetric is one pod's usage of a resource in a sample.
type PodMetric struct {
	// Timestamp is when the sample was taken and Window the time it
	// covers, ending at Timestamp.
	Timestamp time.Time
	Window    time.Duration
	// Value is the usage in thousandths of the resource's unit
	// (millicores, or milli-bytes of memory).
	Value int64
}

// PodMetrics are the samples of a set of pods, by pod name.
type PodMetrics map[string]PodMetric

// MetricsSource measures pods' resource usage.
type MetricsSource interface {
	// ResourceMetric returns, for the pods of namespace that selector
	// matches and that have a sample, their usage of resource: summed
	// over their containers, or of the named container alone when
	// container is not empty. The time returned is that of the samples.
	ResourceMetric(ctx context.Context, resource corev1.ResourceName, namespace string, selector labels.Selector, container string) (PodMetrics, time.Time, error)
}

// APIMetrics is a MetricsSource reading the metrics.k8s.io/v1beta1 API,
// as kube-controller-manager's resource metrics client does.
type APIMetrics struct {
	Client metricsclient.Interface
}

// ResourceMetric lists the PodMetrics of the matching pods.
func (m APIMetrics) ResourceMetric(ctx context.Context, resource corev1.ResourceName, namespace string, selector labels.Selector, container string) (PodMetrics, time.Time, error) {
	list, err := m.Client.MetricsV1beta1().PodMetricses(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("unable to fetch metrics from resource metrics API: %w", err)
	}
	if len(list.Items) == 0 {
		return nil, time.Time{}, errors.New("no metrics returned from resource metrics API")
	}
	var res PodMetrics
	if container != "" {
		res, err = containerMetrics(list.Items, resource, container)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("failed to get container metrics: %w", err)
		}
	} else {
		res = podMetrics(list.Items, resource)
	}
	return res, list.Items[0].Timestamp.Time, nil
}

// podMetrics sums each pod's containers; a pod with a container lacking
// the resource, or with no containers, has no sample.
func podMetrics(items []metricsv1beta1.PodMetrics, resource corev1.ResourceName) PodMetrics {
	res := make(PodMetrics, len(items))
	for _, m := range items {
		sum, missing := int64(0), len(m.Containers) == 0
		for _, c := range m.Containers {
			v, ok := c.Usage[resource]
			if !ok {
				missing = true
				break
			}
			sum += v.MilliValue()
		}
		if !missing {
			res[m.Name] = PodMetric{Timestamp: m.Timestamp.Time, Window: m.Window.Duration, Value: sum}
		}
	}
	return res
}

// containerMetrics takes the named container of each pod; a pod without
// that container fails the whole sample.
func containerMetrics(items []metricsv1beta1.PodMetrics, resource corev1.ResourceName, container string) (PodMetrics, error) {
	res := make(PodMetrics, len(items))
	for _, m := range items {
		found := false
		for _, c := range m.Containers {
			if c.Name != container {
				continue
			}
			found = true
			if v, ok := c.Usage[resource]; ok {
				res[m.Name] = PodMetric{Timestamp: m.Timestamp.Time, Window: m.Window.Duration, Value: v.MilliValue()}
			}
			break
		}
		if !found {
			return nil, fmt.Errorf("container %s not present in metrics for pod %s/%s", container, m.Namespace, m.Name)
		}
	}
	return res, nil
}
