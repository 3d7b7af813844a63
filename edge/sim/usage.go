package sim

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/metrics"
	"github.com/tether-edge/tether/edge/restarts"
)

// Annotations that give simulated containers a resource usage, reported
// as measured (kubectl top, the metrics API, the node's /metrics/resource).
// The pod-wide form applies to each regular container; the per-container
// form ("<annotation>.<container name>") overrides it and also applies to
// init and ephemeral containers. Changes on a running pod take effect at
// once. A value that is not a quantity counts as no usage.
const (
	// CPUUsage (a quantity of cores, e.g. "250m") is the CPU rate.
	CPUUsage = "sim.tether.dev/cpu-usage"
	// MemoryUsage (a quantity of bytes, e.g. "64Mi") is the memory
	// working set.
	MemoryUsage = "sim.tether.dev/memory-usage"
)

// What a simulated node uses besides its pods: the node's usage is the sum
// of its running containers' plus this base. Sim nodes never report the
// host's own usage, which hundreds of them share.
const (
	baseCPUNanoCores = 50_000_000 // 50m
	baseMemoryBytes  = 128 << 20
)

var _ edge.StatsProvider = (*Runtime)(nil)

// usage is a container's synthetic usage and its CPU counter.
type usage struct {
	cpuNanoCores uint64
	memory       uint64
}

// setUsage reads the usage annotations of spec for every container of p,
// bringing the running instances' CPU counters up to now at the old rate
// first. r.mu is held.
func (r *Runtime) setUsage(p *pod, spec *corev1.Pod) {
	now := time.Now()
	for _, c := range p.all() {
		podWide := c.role == restarts.Regular && !slices.Contains(p.eph, c)
		u := usage{
			cpuNanoCores: quantityAnnotation(spec.Annotations, CPUUsage, c.name, podWide, 1e9),
			memory:       quantityAnnotation(spec.Annotations, MemoryUsage, c.name, podWide, 1),
		}
		if u == c.usage {
			continue
		}
		if inst := c.cur; inst != nil && inst.end.IsZero() {
			inst.cpu = inst.cpuAt(c.usage.cpuNanoCores, now)
			inst.cpuSince = now
		}
		c.usage = u
	}
}

// quantityAnnotation is the per-container or else (when podWide) pod-wide
// value of annotation key, times scale; 0 when absent or not a quantity.
func quantityAnnotation(ann map[string]string, key, container string, podWide bool, scale float64) uint64 {
	v, ok := ann[key+"."+container]
	if !ok && podWide {
		v, ok = ann[key]
	}
	if !ok {
		return 0
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() < 0 {
		return 0
	}
	return uint64(q.AsApproximateFloat64() * scale)
}

// cpuAt is the instance's CPU counter at t when it uses nanocores since
// cpuSince.
func (i *instance) cpuAt(nanocores uint64, t time.Time) time.Duration {
	d := t.Sub(i.cpuSince)
	if d < 0 {
		d = 0
	}
	return i.cpu + time.Duration(float64(d)*float64(nanocores)/1e9)
}

// Stats implements edge.StatsProvider with the annotated usage of the
// running containers; the node's CPU counter advances at the sum of their
// rates plus the base between two calls.
func (r *Runtime) Stats(context.Context) (metrics.Snapshot, error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := metrics.Snapshot{Time: now}
	rate := uint64(baseCPUNanoCores)
	s.Node.Memory = metrics.Memory{Usage: baseMemoryBytes, WorkingSet: baseMemoryBytes, RSS: baseMemoryBytes}
	for _, p := range r.pods {
		mp := metrics.Pod{Namespace: p.namespace, Name: p.name, UID: string(p.uid)}
		for _, c := range p.all() {
			inst := c.cur
			if c.state != edge.ContainerRunning || inst == nil || !inst.end.IsZero() {
				continue
			}
			cpu, mem := c.usage.cpuNanoCores, c.usage.memory
			if j := r.cfg.UsageJitter; j > 0 {
				// The counter moves at a rate drawn for the time since
				// the last reading, then starts afresh from now.
				cpu = uint64(float64(cpu) * max(0, 1+j*(2*r.jitter.Float64()-1)))
				mem = uint64(float64(mem) * max(0, 1+j/15*(2*r.jitter.Float64()-1)))
				inst.cpu, inst.cpuSince = inst.cpuAt(cpu, now), now
			}
			mp.Containers = append(mp.Containers, metrics.Container{
				Name: c.name, ID: Name + "://" + inst.id, Image: c.image, StartTime: inst.start,
				Stats: metrics.Cgroup{
					CPU:    inst.cpuAt(cpu, now),
					Memory: metrics.Memory{Usage: mem, WorkingSet: mem, RSS: mem},
				},
			})
			rate += cpu
			s.Node.Usage += mem
			s.Node.WorkingSet += mem
			s.Node.RSS += mem
		}
		if len(mp.Containers) > 0 {
			s.Pods = append(s.Pods, mp)
		}
	}
	if r.nodeCPUAt.IsZero() {
		r.nodeCPUAt = now
	}
	if now.After(r.nodeCPUAt) {
		r.nodeCPU += time.Duration(float64(now.Sub(r.nodeCPUAt)) * float64(rate) / 1e9)
		r.nodeCPUAt = now
	}
	s.Node.CPU = r.nodeCPU
	return s, nil
}
