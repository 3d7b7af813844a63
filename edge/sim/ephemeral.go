package sim

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge/restarts"
)

// all returns every container of the pod: init, app and ephemeral.
func (p *pod) all() []*container {
	out := make([]*container, 0, len(p.init)+len(p.app)+len(p.eph))
	return append(append(append(out, p.init...), p.app...), p.eph...)
}

// syncEphemeral schedules the start of the ephemeral containers of spec
// that the pod has not seen yet. They start after the runtime's start
// delay whatever the state of the other containers, run until the pod
// is killed and are never restarted. r.mu is held.
func (r *Runtime) syncEphemeral(p *pod, spec *corev1.Pod) {
	if p.killing || !p.sandboxReady {
		return
	}
	for _, ec := range spec.Spec.EphemeralContainers {
		known := false
		for _, c := range p.eph {
			known = known || c.name == ec.Name
		}
		if known {
			continue
		}
		b := behaviour{startDelay: r.cfg.StartDelay, logInterval: r.logInterval()}
		c := r.newContainer(corev1.Container(ec.EphemeralContainerCommon), b, restarts.Regular)
		p.eph = append(p.eph, c)
		r.scheduleStart(p, c, b.startDelay)
	}
}
