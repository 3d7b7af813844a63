package containerd

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
)

// labelEphemeral marks the containerd containers of ephemeral containers,
// so that a restarted agent neither restarts them nor reports them as app
// containers.
const labelEphemeral = "io.tether.container.ephemeral"

// syncEphemeral starts the ephemeral containers of spec that never ran.
// An ephemeral container starts once, whatever the state of the pod's
// other containers, and is never restarted: once it has an instance,
// running or exited, it is left alone. One whose image could not be
// pulled or whose target is not running is tried again at a later sync.
func (r *Runtime) syncEphemeral(ctx context.Context, p *pod, spec *corev1.Pod) error {
	var errs []error
	for i := range spec.Spec.EphemeralContainers {
		ec := &spec.Spec.EphemeralContainers[i]
		p.mu.Lock()
		cs := p.container(ec.Name, false, r.cfg.BackoffBase, r.cfg.BackoffMax)
		cs.ephemeral = true
		ran := cs.cur != nil
		p.mu.Unlock()
		if ran {
			continue
		}
		c := corev1.Container(ec.EphemeralContainerCommon)
		if err := r.start(ctx, p, cs, &c, spec, 0); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ephemeralOpts adds to opts, the spec of an instance of cs, what makes an
// ephemeral container with a targetContainerName share the target's
// process, IPC and UTS namespaces, so that it sees the target's
// processes as the kubelet's runtimes arrange it. The network namespace
// is the pod's, as for every container. Other containers get opts back.
func (r *Runtime) ephemeralOpts(p *pod, cs *ctr, spec *corev1.Pod, opts []oci.SpecOpts) ([]oci.SpecOpts, error) {
	if !cs.ephemeral {
		return opts, nil
	}
	var target string
	for _, ec := range spec.Spec.EphemeralContainers {
		if ec.Name == cs.name {
			target = ec.TargetContainerName
		}
	}
	if target == "" {
		return opts, nil
	}
	p.mu.Lock()
	var pid uint32
	if t := p.find(target); t != nil && !t.ephemeral && t.cur != nil && t.cur.running && t.cur.task != nil {
		pid = t.cur.task.Pid()
	}
	p.mu.Unlock()
	if pid == 0 {
		return nil, fmt.Errorf("target container %q is not running", target)
	}
	join := func(typ specs.LinuxNamespaceType, name string) oci.SpecOpts {
		return oci.WithLinuxNamespace(specs.LinuxNamespace{Type: typ, Path: fmt.Sprintf("/proc/%d/ns/%s", pid, name)})
	}
	if !spec.Spec.HostPID {
		opts = append(opts, join(specs.PIDNamespace, "pid"))
	}
	if !spec.Spec.HostIPC {
		opts = append(opts, join(specs.IPCNamespace, "ipc"))
	}
	// A container that joins a UTS namespace may not set its hostname:
	// it has the target's.
	opts = append(opts, join(specs.UTSNamespace, "uts"), func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Hostname = ""
		return nil
	})
	return opts, nil
}
