package containerd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
)

// Lifecycle hooks. A postStart hook runs right after the container
// started, before anything else is done for the pod (the kubelet runs it
// inside its pod sync): the container is not reported Running until the
// hook returned, and its probes start only then. A failing postStart hook
// gets a FailedPostStartHook event and the container is killed (its
// preStop hook runs first, as for any kill); the pod's restart policy
// then decides, with the crash-loop back-off. A preStop hook runs before
// the stop signal, within the grace period; its failure is reported with
// a FailedPreStopHook event and the container is stopped anyway. HTTP
// hooks fail only when no response comes: unlike probes, the status code
// does not matter.

// reasonPostStartHookError is the waiting reason of a container whose
// postStart hook failed, until its restart is due.
const reasonPostStartHookError = "PostStartHookError"

// runHook runs a lifecycle hook of container c in or against the
// instance. On failure it returns the kubelet's message for the event.
func (r *Runtime) runHook(ctx context.Context, p *pod, inst *instance, c *corev1.Container, h *corev1.LifecycleHandler) (string, error) {
	switch {
	case h.Exec != nil:
		stdout := &cappedBuffer{max: maxProbeOutput}
		stderr := &cappedBuffer{max: maxProbeOutput}
		code, err := r.execInstance(ctx, inst, h.Exec.Command, edge.Streams{Stdout: stdout, Stderr: stderr})
		if err == nil && code != 0 {
			err = fmt.Errorf("command '%s' exited with %d: %s", strings.Join(h.Exec.Command, " "), code, stderr.String())
		}
		if err != nil {
			return fmt.Sprintf("Exec lifecycle hook (%v) for Container %q in Pod %q failed - error: %v, message: %q",
				h.Exec.Command, c.Name, podFormat(p), err, stdout.String()+stderr.String()), err
		}
		return "", nil
	case h.HTTPGet != nil:
		if err := r.httpHook(ctx, p, h.HTTPGet); err != nil {
			return fmt.Sprintf("HTTP lifecycle hook (%s) for Container %q in Pod %q failed - error: %v",
				h.HTTPGet.Path, c.Name, podFormat(p), err), err
		}
		return "", nil
	case h.Sleep != nil:
		if !sleepCtx(ctx, time.Duration(h.Sleep.Seconds)*time.Second) {
			err := fmt.Errorf("container terminated before sleep hook finished")
			return fmt.Sprintf("Sleep lifecycle hook (%d) for Container %q in Pod %q failed - error: %v",
				h.Sleep.Seconds, c.Name, podFormat(p), err), err
		}
		return "", nil
	}
	err := fmt.Errorf("invalid handler: %v", h)
	return fmt.Sprintf("Cannot run handler: %v", err), err
}

// podFormat names a pod as the kubelet's messages do: name_namespace(uid).
func podFormat(p *pod) string {
	return fmt.Sprintf("%s_%s(%s)", p.name, p.namespace, p.uid)
}

// httpHook sends a hook's GET. Any response passes.
func (r *Runtime) httpHook(ctx context.Context, p *pod, g *corev1.HTTPGetAction) error {
	err := r.httpRequest(ctx, p, g, "lifecycle")
	if _, answered := errors.AsType[httpStatusError](err); answered {
		return nil
	}
	return err
}

// postStart runs the postStart hook of a started instance. When the hook
// fails it kills the instance and returns an error; the caller then
// treats the container as exited.
func (r *Runtime) postStart(ctx context.Context, p *pod, cs *ctr, inst *instance, c *corev1.Container, spec *corev1.Pod) error {
	if c.Lifecycle == nil || c.Lifecycle.PostStart == nil {
		return nil
	}
	// The hook ends with the container: a kill of the pod (or an exit)
	// must not wait for it.
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-inst.exited:
			cancel()
		case <-hctx.Done():
		}
	}()
	msg, err := r.runHook(hctx, p, inst, c, c.Lifecycle.PostStart)
	p.mu.Lock()
	inst.hooking = false
	p.mu.Unlock()
	if err == nil {
		return nil
	}
	r.log.Info("postStart hook failed; killing the container", "pod", p.key(), "container", c.Name, "err", err)
	r.event(p, cs, true, "FailedPostStartHook", "%s", msg)
	p.mu.Lock()
	inst.killNoted = true
	p.mu.Unlock()
	r.event(p, cs, false, "Killing", "FailedPostStartHook")
	r.stopInstance(context.WithoutCancel(ctx), p, spec, cs, gracePeriodOf(spec))
	if spec.Spec.RestartPolicy != corev1.RestartPolicyNever || cs.sidecar {
		// Waiting for its restart, as the kubelet reports it until the
		// next sync.
		p.mu.Lock()
		cs.waitReason, cs.waitMessage = reasonPostStartHookError, msg
		p.mu.Unlock()
	}
	return fmt.Errorf("run postStart hook of container %s: %w", c.Name, err)
}

// gracePeriodOf is the pod's termination grace period.
func gracePeriodOf(spec *corev1.Pod) time.Duration {
	if spec != nil && spec.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*spec.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return corev1.DefaultTerminationGracePeriodSeconds * time.Second
}
