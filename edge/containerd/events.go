package containerd

import (
	"fmt"

	"github.com/tether-edge/tether/edge"
)

// ReportEvents implements edge.EventReporter: fn receives the kubelet's
// events for the pods of this runtime (Pulling, Pulled, Created, Started,
// Killing, Unhealthy, BackOff, Failed, ...).
func (r *Runtime) ReportEvents(fn func(edge.PodEvent)) { r.events.Store(&fn) }

// event reports an event about container cs of pod p (or about the pod
// when cs is nil). It takes no lock and never blocks.
func (r *Runtime) event(p *pod, cs *ctr, warning bool, reason, format string, args ...any) {
	fn := r.events.Load()
	if fn == nil {
		return
	}
	ev := edge.PodEvent{UID: p.uid, Namespace: p.namespace, Name: p.name, Warning: warning,
		Reason: reason, Message: fmt.Sprintf(format, args...)}
	if cs != nil {
		ev.Container = cs.name
		ev.FieldPath = "spec.containers{" + cs.name + "}"
		switch {
		case cs.isInit:
			ev.FieldPath = "spec.initContainers{" + cs.name + "}"
		case cs.ephemeral:
			ev.FieldPath = "spec.ephemeralContainers{" + cs.name + "}"
		}
	}
	(*fn)(ev)
}
