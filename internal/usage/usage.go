// Package usage is the resource usage an edge agent reports to the hub:
// the CPU rate and memory working set of its node and of every container
// of its pods, measured over one window, and the compact encoding that
// carries a stream of such samples over the tunnel.
//
// Samples go over thin uplinks every period (15s by default), so the
// encoding is a small binary one of its own, built for a stream on one
// ordered, reliable connection: the first sample an [Encoder] writes
// carries the table of pods and containers and every value; the next ones
// carry only the changes of the values, as zig-zag varints, and the table
// again only when the set of pods or containers changed. Payloads with a
// table are deflated when that makes them smaller. An [Encoder] and its
// [Decoder] must see the same payloads in the same order; a new
// connection starts a new pair (the encoder is [Encoder.Reset]). The
// bytes come from an edge, so decoding validates everything: a bad
// payload is an error and leaves the decoder unchanged.
package usage

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Resources is what is measured of one container, pod or node.
type Resources struct {
	// CPUNanoCores is the CPU rate over the sample's window, in
	// billionths of a core. It travels with a resolution of 1000
	// nanocores (a microcore).
	CPUNanoCores uint64
	// MemoryWorkingSetBytes is the working set when the sample was taken,
	// as the kubelet computes it: usage minus inactive file pages. It
	// travels with a resolution of 1 KiB.
	MemoryWorkingSetBytes uint64
}

// Container is the usage of one container of a pod.
type Container struct {
	Name  string
	Usage Resources
}

// Pod is the usage of the running containers of one pod.
type Pod struct {
	Namespace, Name string
	Containers      []Container
}

// Sample is one node's usage, measured over the Window that ends at Time.
// Time and Window travel with a resolution of a millisecond.
type Sample struct {
	Time   time.Time
	Window time.Duration
	Node   Resources
	Pods   []Pod
}

// Limits on what a payload may describe; a decoder refuses more.
const (
	MaxPods       = 4096
	MaxContainers = 64 // per pod
	maxName       = 253
	// MaxPayload is the largest payload a decoder takes, compressed or not.
	MaxPayload = 60 << 10
)

const (
	version = 1

	flagTable    = 1 << 0 // the payload carries the pod and container table
	flagDeflated = 1 << 1 // what follows the header is deflated
	flagsKnown   = flagTable | flagDeflated

	cpuUnit = 1000 // nanocores per unit on the wire
	memUnit = 1024 // bytes per unit on the wire
)

// ErrNoBase is returned when a payload carries only changes but the
// decoder has seen no sample to apply them to.
var ErrNoBase = errors.New("usage: changes before any full sample")

// table names the rows a payload's values belong to: the pods, in order,
// and the containers of each.
type table struct {
	pods []tablePod
}

type tablePod struct {
	namespace, name string
	containers      []string
}

func tableOf(s *Sample) table {
	t := table{pods: make([]tablePod, len(s.Pods))}
	for i, p := range s.Pods {
		tp := tablePod{namespace: p.Namespace, name: p.Name, containers: make([]string, len(p.Containers))}
		for j, c := range p.Containers {
			tp.containers[j] = c.Name
		}
		t.pods[i] = tp
	}
	return t
}

func (t table) equal(o table) bool {
	return slices.EqualFunc(t.pods, o.pods, func(a, b tablePod) bool {
		return a.namespace == b.namespace && a.name == b.name && slices.Equal(a.containers, b.containers)
	})
}

// values are the wire values of a sample in table order: the node's CPU
// and memory, then each container's.
func valuesOf(s *Sample) []uint64 {
	v := make([]uint64, 0, 2+2*len(s.Pods))
	v = append(v, s.Node.CPUNanoCores/cpuUnit, s.Node.MemoryWorkingSetBytes/memUnit)
	for _, p := range s.Pods {
		for _, c := range p.Containers {
			v = append(v, c.Usage.CPUNanoCores/cpuUnit, c.Usage.MemoryWorkingSetBytes/memUnit)
		}
	}
	return v
}

// validate checks what a decoder would refuse, so that an encoder never
// writes a payload its peer cannot read.
func (s *Sample) validate() error {
	if len(s.Pods) > MaxPods {
		return fmt.Errorf("usage: %d pods, at most %d", len(s.Pods), MaxPods)
	}
	if s.Window < 0 || s.Window > time.Hour {
		return fmt.Errorf("usage: window %v out of range", s.Window)
	}
	seen := make(map[string]bool, len(s.Pods))
	for _, p := range s.Pods {
		if err := checkName(p.Namespace); err != nil {
			return fmt.Errorf("usage: pod namespace: %w", err)
		}
		if err := checkName(p.Name); err != nil {
			return fmt.Errorf("usage: pod name: %w", err)
		}
		k := p.Namespace + "/" + p.Name
		if seen[k] {
			return fmt.Errorf("usage: pod %s twice", k)
		}
		seen[k] = true
		if len(p.Containers) > MaxContainers {
			return fmt.Errorf("usage: pod %s: %d containers, at most %d", k, len(p.Containers), MaxContainers)
		}
		names := make(map[string]bool, len(p.Containers))
		for _, c := range p.Containers {
			if err := checkName(c.Name); err != nil {
				return fmt.Errorf("usage: pod %s: container name: %w", k, err)
			}
			if names[c.Name] {
				return fmt.Errorf("usage: pod %s: container %s twice", k, c.Name)
			}
			names[c.Name] = true
		}
	}
	return nil
}

func checkName(s string) error {
	if s == "" || len(s) > maxName || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("%q is not a valid name", s)
	}
	return nil
}
