package metrics

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"github.com/tether-edge/tether/hub/registry"
)

// Group and version of the resource metrics API.
var groupVersion = metricsv1beta1.SchemeGroupVersion

// Resources of the metrics API.
var (
	nodeMetricsResource = groupVersion.WithResource("nodes")
	podMetricsResource  = groupVersion.WithResource("pods")
)

// The group-resources metrics-server names in its NotFound errors.
var (
	nodeMetricsGR = schema.GroupResource{Group: groupVersion.Group, Resource: "nodemetrics"}
	podMetricsGR  = schema.GroupResource{Group: groupVersion.Group, Resource: "podmetrics"}
)

// Kinds returns the kinds of metrics.k8s.io/v1beta1, NodeMetrics and
// PodMetrics, for registry.Config.Extra: get and list only, with the
// tables metrics-server prints (name, cpu, memory, window). Their objects
// come from a Store's Serve; nothing stores them.
func Kinds() []*registry.Kind {
	read := []string{"get", "list"}
	return []*registry.Kind{
		{GVK: groupVersion.WithKind("NodeMetrics"), Resource: nodeMetricsResource.Resource, Singular: "",
			Verbs: slices.Clone(read), Columns: columns(), Cells: nodeCells},
		{GVK: groupVersion.WithKind("PodMetrics"), Resource: podMetricsResource.Resource, Singular: "", Namespaced: true,
			Verbs: slices.Clone(read), Columns: columns(), Cells: podCells},
	}
}

func columns() []metav1.TableColumnDefinition {
	return []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name", Description: "Name of the resource"},
		{Name: "cpu", Type: "string", Format: "quantity"},
		{Name: "memory", Type: "string", Format: "quantity"},
		{Name: "Window", Type: "string", Format: "duration"},
	}
}

func nodeCells(obj runtime.Object, _ time.Time) []any {
	m, ok := obj.(*metricsv1beta1.NodeMetrics)
	if !ok {
		return []any{"", "", "", ""}
	}
	return []any{m.Name, quantityCell(m.Usage, corev1.ResourceCPU), quantityCell(m.Usage, corev1.ResourceMemory), m.Window.Duration.String()}
}

func podCells(obj runtime.Object, _ time.Time) []any {
	m, ok := obj.(*metricsv1beta1.PodMetrics)
	if !ok {
		return []any{"", "", "", ""}
	}
	sum := corev1.ResourceList{}
	for _, c := range m.Containers {
		for name, q := range c.Usage {
			s := sum[name]
			s.Add(q)
			sum[name] = s
		}
	}
	return []any{m.Name, quantityCell(sum, corev1.ResourceCPU), quantityCell(sum, corev1.ResourceMemory), m.Window.Duration.String()}
}

func quantityCell(l corev1.ResourceList, name corev1.ResourceName) string {
	q := l[name]
	return q.String()
}

// cpuQuantity is CPU usage as metrics-server writes it: nanocores.
func cpuQuantity(nanocores uint64) resource.Quantity {
	return *resource.NewScaledQuantity(int64(min(nanocores, 1<<62)), resource.Nano)
}

// memoryQuantity is memory usage as metrics-server writes it: binary SI
// bytes, KiB for the kilobyte-resolution samples edges send.
func memoryQuantity(bytes uint64) resource.Quantity {
	return *resource.NewQuantity(int64(min(bytes, 1<<62)), resource.BinarySI)
}

// resources is u as a ResourceList.
func resources(cpu, memory uint64) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: cpuQuantity(cpu), corev1.ResourceMemory: memoryQuantity(memory)}
}
