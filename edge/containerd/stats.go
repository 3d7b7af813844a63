package containerd

import (
	"context"
	"fmt"
	"path"
	"time"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/metrics"
)

// Where the node's counters are read.
const (
	cgroupRoot = "/sys/fs/cgroup"
	procRoot   = "/proc"
)

var _ edge.StatsProvider = (*Runtime)(nil)

// cgroupOf is the cgroup of a container instance: containerd places
// each task at /<namespace>/<container id> of the hierarchy (the OCI
// spec's default cgroupsPath), on cgroup v1 and v2 alike.
func cgroupOf(id string) string { return path.Join("/", Namespace, id) }

// Stats implements edge.StatsProvider: the host's /proc and root cgroup
// for the node, with the file systems of the runtime's data and of the
// image store, and the cgroup of every running container instance.
// Containers have no pod-level cgroup of their own; a pod's usage is the
// sum of its containers'.
func (r *Runtime) Stats(ctx context.Context) (metrics.Snapshot, error) {
	h := metrics.OpenHierarchy(cgroupRoot)
	s := metrics.Snapshot{Time: time.Now()}
	node, err := metrics.ReadNode(procRoot, h)
	if err != nil {
		return s, fmt.Errorf("read node usage: %w", err)
	}
	for _, fs := range []struct{ name, path string }{{"runtime", r.cfg.DataDir}, {"images", r.cfg.ImageGCPath}} {
		if f, err := metrics.ReadFilesystem(fs.name, fs.path); err == nil {
			node.Filesystems = append(node.Filesystems, f)
		}
	}
	s.Node = node
	r.mu.Lock()
	pods := make([]*pod, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	r.mu.Unlock()
	for _, p := range pods {
		if err := ctx.Err(); err != nil {
			return s, fmt.Errorf("read pod usage: %w", err)
		}
		mp := metrics.Pod{Namespace: p.namespace, Name: p.name, UID: string(p.uid)}
		p.mu.Lock()
		var running []metrics.Container
		for _, list := range [][]*ctr{p.init, p.app} {
			for _, c := range list {
				if inst := c.cur; inst != nil && inst.running && inst.task != nil {
					running = append(running, metrics.Container{Name: c.name, ID: Name + "://" + inst.id,
						Image: inst.image, Cgroup: cgroupOf(inst.id), StartTime: inst.started})
				}
			}
		}
		p.mu.Unlock()
		for _, c := range running {
			// A container that stopped since has no cgroup left.
			if c.Stats, err = h.Read(c.Cgroup); err == nil {
				mp.Containers = append(mp.Containers, c)
			}
		}
		if len(mp.Containers) > 0 {
			s.Pods = append(s.Pods, mp)
		}
	}
	s.Time = time.Now()
	return s, nil
}
