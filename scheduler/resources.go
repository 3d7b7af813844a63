package scheduler

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Requests that stand in for a container that sets none, when scoring: a
// node full of best-effort pods should not look empty. The values are
// upstream's.
const (
	defaultMilliCPURequest = 100
	defaultMemoryRequest   = 200 * 1024 * 1024
)

// Resources is an amount of every schedulable resource.
type Resources struct {
	MilliCPU         int64
	Memory           int64
	EphemeralStorage int64
	// Pods is the number of pods a node accepts; unused in pod requests.
	Pods int64
	// Scalar holds extended resources and hugepages; nil when there are
	// none, which is the common case and keeps the hot path free of maps.
	Scalar map[corev1.ResourceName]int64
}

// add adds r2 to r.
func (r *Resources) add(r2 *Resources) {
	r.MilliCPU += r2.MilliCPU
	r.Memory += r2.Memory
	r.EphemeralStorage += r2.EphemeralStorage
	for k, v := range r2.Scalar {
		if r.Scalar == nil {
			r.Scalar = make(map[corev1.ResourceName]int64, len(r2.Scalar))
		}
		r.Scalar[k] += v
	}
}

// sub takes r2 away from r.
func (r *Resources) sub(r2 *Resources) {
	r.MilliCPU -= r2.MilliCPU
	r.Memory -= r2.Memory
	r.EphemeralStorage -= r2.EphemeralStorage
	for k, v := range r2.Scalar {
		if r.Scalar == nil {
			r.Scalar = make(map[corev1.ResourceName]int64)
		}
		r.Scalar[k] -= v
	}
}

// setMax raises every amount of r to at least the one in r2.
func (r *Resources) setMax(r2 *Resources) {
	r.MilliCPU = max(r.MilliCPU, r2.MilliCPU)
	r.Memory = max(r.Memory, r2.Memory)
	r.EphemeralStorage = max(r.EphemeralStorage, r2.EphemeralStorage)
	for k, v := range r2.Scalar {
		if r.Scalar == nil {
			r.Scalar = make(map[corev1.ResourceName]int64, len(r2.Scalar))
		}
		if v > r.Scalar[k] {
			r.Scalar[k] = v
		}
	}
}

func (r *Resources) clone() Resources {
	c := *r
	if r.Scalar != nil {
		c.Scalar = make(map[corev1.ResourceName]int64, len(r.Scalar))
		for k, v := range r.Scalar {
			c.Scalar[k] = v
		}
	}
	return c
}

// isScalar tells whether the scheduler tracks name as a scalar resource:
// hugepages and every domain-prefixed name (extended resources, and the
// kubernetes.io-prefixed native ones such as attachable volumes).
func isScalar(name corev1.ResourceName) bool {
	return strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix) || strings.Contains(string(name), "/")
}

// fromList converts a ResourceList.
func fromList(l corev1.ResourceList) Resources {
	var r Resources
	for name, q := range l {
		switch name {
		case corev1.ResourceCPU:
			r.MilliCPU = q.MilliValue()
		case corev1.ResourceMemory:
			r.Memory = q.Value()
		case corev1.ResourceEphemeralStorage:
			r.EphemeralStorage = q.Value()
		case corev1.ResourcePods:
			r.Pods = q.Value()
		default:
			if isScalar(name) {
				if r.Scalar == nil {
					r.Scalar = make(map[corev1.ResourceName]int64)
				}
				r.Scalar[name] = q.Value()
			}
		}
	}
	return r
}

// containerRequests is what one container asks for. A resource with a limit
// but no request is requested at its limit, as API defaulting does. With
// nonZero, cpu and memory that are not requested at all count as the
// scoring defaults.
func containerRequests(c *corev1.Container, nonZero bool) Resources {
	r := fromList(c.Resources.Requests)
	for name, q := range c.Resources.Limits {
		if _, ok := c.Resources.Requests[name]; ok {
			continue
		}
		switch name {
		case corev1.ResourceCPU:
			r.MilliCPU = q.MilliValue()
		case corev1.ResourceMemory:
			r.Memory = q.Value()
		case corev1.ResourceEphemeralStorage:
			r.EphemeralStorage = q.Value()
		default:
			if isScalar(name) {
				if r.Scalar == nil {
					r.Scalar = make(map[corev1.ResourceName]int64)
				}
				r.Scalar[name] = q.Value()
			}
		}
	}
	if nonZero {
		if !hasResource(c, corev1.ResourceCPU) {
			r.MilliCPU = defaultMilliCPURequest
		}
		if !hasResource(c, corev1.ResourceMemory) {
			r.Memory = defaultMemoryRequest
		}
	}
	return r
}

func hasResource(c *corev1.Container, name corev1.ResourceName) bool {
	if _, ok := c.Resources.Requests[name]; ok {
		return true
	}
	_, ok := c.Resources.Limits[name]
	return ok
}

// podRequests is the effective request of a pod: app containers and
// restartable (sidecar) init containers run together, each ordinary init
// container runs alone next to the sidecars started before it, the pod needs
// the larger of the two phases, and the runtime's overhead comes on top.
func podRequests(pod *corev1.Pod, nonZero bool) Resources {
	var reqs Resources
	for i := range pod.Spec.Containers {
		c := containerRequests(&pod.Spec.Containers[i], nonZero)
		reqs.add(&c)
	}
	var sidecars, initPeak Resources
	for i := range pod.Spec.InitContainers {
		ic := &pod.Spec.InitContainers[i]
		c := containerRequests(ic, nonZero)
		if ic.RestartPolicy != nil && *ic.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			reqs.add(&c)
			sidecars.add(&c)
			c = sidecars.clone()
		} else {
			c.add(&sidecars)
		}
		initPeak.setMax(&c)
	}
	reqs.setMax(&initPeak)
	if pod.Spec.Overhead != nil {
		o := fromList(pod.Spec.Overhead)
		o.Pods = 0
		reqs.add(&o)
	}
	return reqs
}
