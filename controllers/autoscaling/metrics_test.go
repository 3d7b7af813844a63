package autoscaling

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	metricsfake "k8s.io/metrics/pkg/client/clientset/versioned/fake"
)

func podMetricsObj(name string, containers map[string]string) *metricsv1beta1.PodMetrics {
	m := &metricsv1beta1.PodMetrics{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "web"}},
		Timestamp:  metav1.Time{Time: t0},
		Window:     metav1.Duration{Duration: 15 * time.Second},
	}
	for c, cpu := range containers {
		usage := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("10Mi")}
		if cpu != "" {
			usage[corev1.ResourceCPU] = resource.MustParse(cpu)
		}
		m.Containers = append(m.Containers, metricsv1beta1.ContainerMetrics{Name: c, Usage: usage})
	}
	return m
}

// TestAPIMetrics checks the metrics.k8s.io source: containers summed per
// pod, a pod with a container lacking the resource left without a
// sample, one container picked out, and upstream's errors.
func TestAPIMetrics(t *testing.T) {
	ctx := context.Background()
	sel := labels.SelectorFromSet(labels.Set{"app": "web"})
	items := []metricsv1beta1.PodMetrics{
		*podMetricsObj("web-0", map[string]string{"app": "250m", "sidecar": "50m"}),
		*podMetricsObj("web-1", map[string]string{"app": "100m", "sidecar": ""}),
	}
	// The fake's tracker files PodMetrics under another resource name
	// than the client lists ("pods"): answer the list here.
	client := metricsfake.NewSimpleClientset()
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		list := &metricsv1beta1.PodMetricsList{}
		for _, m := range items {
			if m.Namespace == a.GetNamespace() {
				list.Items = append(list.Items, m)
			}
		}
		return true, list, nil
	})
	src := APIMetrics{Client: client}
	got, ts, err := src.ResourceMetric(ctx, corev1.ResourceCPU, "default", sel, "")
	if err != nil {
		t.Fatal(err)
	}
	if !ts.Equal(t0) || len(got) != 1 || got["web-0"].Value != 300 || got["web-0"].Window != 15*time.Second {
		t.Errorf("pod sums = %+v at %v", got, ts)
	}
	got, _, err = src.ResourceMetric(ctx, corev1.ResourceCPU, "default", sel, "app")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["web-0"].Value != 250 || got["web-1"].Value != 100 {
		t.Errorf("container app = %+v", got)
	}
	if _, _, err := src.ResourceMetric(ctx, corev1.ResourceCPU, "default", sel, "missing"); err == nil ||
		!strings.Contains(err.Error(), "failed to get container metrics: container missing not present in metrics for pod default/web-") {
		t.Errorf("absent container: %v", err)
	}
	if _, _, err := src.ResourceMetric(ctx, corev1.ResourceCPU, "other", sel, ""); err == nil || err.Error() != "no metrics returned from resource metrics API" {
		t.Errorf("no pods: %v", err)
	}
}
