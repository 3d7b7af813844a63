package containerd

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge/restarts"
)

// advance carries out what edge/restarts decides for the pod's init and
// regular containers: it starts the next init container or the regular
// ones, restarts exited ones as the restart policy and back-off allow,
// leaves the others waiting in CrashLoopBackOff with a timer that wakes the
// pod, and stops the sidecars of a pod whose regular containers are done.
func (r *Runtime) advance(ctx context.Context, p *pod, spec *corev1.Pod) error {
	specs := make([]*corev1.Container, 0, len(spec.Spec.InitContainers)+len(spec.Spec.Containers))
	for i := range spec.Spec.InitContainers {
		specs = append(specs, &spec.Spec.InitContainers[i])
	}
	for i := range spec.Spec.Containers {
		specs = append(specs, &spec.Spec.Containers[i])
	}
	nInit := len(spec.Spec.InitContainers)
	p.mu.Lock()
	// Containers are recorded once they are first started: the status
	// lists only those.
	cs := make([]*ctr, len(specs))
	in := make([]restarts.Container, len(specs))
	for i, c := range specs {
		role := restarts.Regular
		if i < nInit {
			role = restarts.InitRole(c)
		}
		in[i] = restarts.Container{Name: c.Name, Role: role}
		if cs[i] = p.existing(c.Name, i < nInit); cs[i] != nil {
			cs[i].sidecar = role == restarts.Sidecar
			in[i] = cs[i].observed(role)
		}
	}
	plan := restarts.Decide(restarts.Policy(&spec.Spec), in, time.Now())
	for i, step := range plan.Steps {
		if cs[i] == nil && step.Action == restarts.Start {
			cs[i] = p.container(specs[i].Name, i < nInit, r.cfg.BackoffBase, r.cfg.BackoffMax)
			cs[i].sidecar = in[i].Role == restarts.Sidecar
		}
	}
	p.mu.Unlock()

	var errs []error
	for i, step := range plan.Steps {
		c, cs := specs[i], cs[i]
		if cs == nil {
			continue
		}
		p.mu.Lock()
		cur := cs.cur
		p.mu.Unlock()
		var err error
		switch step.Action {
		case restarts.Start:
			attempt := int32(0)
			if cur != nil {
				// A new sandbox: run it again now, with no back-off,
				// as the kubelet does.
				attempt = cur.attempt + 1
			}
			err = r.start(ctx, p, cs, c, spec, attempt)
		case restarts.Restart:
			err = r.start(ctx, p, cs, c, spec, cur.attempt+1)
		case restarts.BackOff:
			r.backOff(p, cs, step)
		case restarts.Stop:
			r.stopSidecar(p, cs, spec)
		case restarts.Keep:
			if cur != nil && cur.running {
				r.ensureProbes(p, cs, c)
			}
			p.mu.Lock()
			if cur != nil && !cur.running && cs.waitReason == restarts.ReasonCrashLoopBackOff {
				// Not restarted any more (a sidecar of a pod that is
				// done): it shows how it ended.
				cs.waitReason, cs.waitMessage = "", ""
			}
			p.mu.Unlock()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// observed is what edge/restarts needs to know of cs, a container of the
// given role. p.mu is held.
func (cs *ctr) observed(role restarts.Role) restarts.Container {
	out := restarts.Container{Name: cs.name, Role: role, Backoff: &cs.backoff, Rerun: cs.stale}
	i := cs.cur
	if i == nil {
		return out
	}
	out.Created, out.Running = true, i.running
	if i.running && !i.hooking && i.startupDone {
		cs.sidecarStarted = true
	}
	out.Started = cs.sidecarStarted
	if !i.running {
		out.ExitCode, out.FinishedAt = i.exitCode, i.finished
	}
	return out
}

// wakeAt makes the pod's worker look at the pod again at t (when a back-off
// ends). A pod has one timer; an earlier pending wake-up is kept. p.mu must
// be held.
func (r *Runtime) wakeAt(p *pod, t time.Time) {
	if p.timer != nil && !p.wakeAt.IsZero() && p.wakeAt.After(time.Now()) && !p.wakeAt.After(t) {
		return
	}
	if p.timer != nil {
		p.timer.Stop()
	}
	uid := p.uid
	p.wakeAt = t
	p.timer = time.AfterFunc(time.Until(t), func() { r.changed(uid) })
}

// backOff leaves an exited container waiting in CrashLoopBackOff until
// its back-off ends, with a timer that wakes the pod then.
func (r *Runtime) backOff(p *pod, cs *ctr, step restarts.Step) {
	p.mu.Lock()
	cs.waitReason = restarts.ReasonCrashLoopBackOff
	cs.waitMessage = restarts.BackOffMessage(step.Wait, cs.name, p.name, p.namespace, string(p.uid))
	r.wakeAt(p, step.Until)
	p.mu.Unlock()
	r.event(p, cs, true, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", cs.name, p.name, p.namespace, p.uid)
}

// stopSidecar stops a running sidecar, once, in the background: the pod's
// regular containers are done (or its initialization failed), and it is
// not restarted. Its exit wakes the pod.
func (r *Runtime) stopSidecar(p *pod, cs *ctr, spec *corev1.Pod) {
	p.mu.Lock()
	inst := cs.cur
	if inst == nil || !inst.running || inst.stopping {
		p.mu.Unlock()
		return
	}
	inst.stopping = true
	p.mu.Unlock()
	go r.stopInstance(context.Background(), p, spec, cs, gracePeriodOf(spec))
}
