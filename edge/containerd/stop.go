package containerd

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
)

// Stopping pods, removing them, and reporting their state.

// KillPod implements edge.Runtime.
func (r *Runtime) KillPod(ctx context.Context, uid types.UID, grace time.Duration) error {
	p := r.pod(uid)
	if p == nil {
		return nil
	}
	p.mu.Lock()
	p.killing = true
	if p.timer != nil {
		p.timer.Stop()
	}
	spec := p.spec
	var running []*ctr
	for _, c := range append(append([]*ctr{}, p.init...), p.app...) {
		if c.cur != nil && c.cur.running {
			running = append(running, c)
		}
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, cs := range running {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.stopInstance(ctx, p, spec, cs, grace)
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// stopInstance runs the preStop hook, sends SIGTERM, and SIGKILL once
// grace (counted from the start of the hook) is over.
func (r *Runtime) stopInstance(ctx context.Context, p *pod, spec *corev1.Pod, cs *ctr, grace time.Duration) {
	p.mu.Lock()
	inst := cs.cur
	p.mu.Unlock()
	deadline := time.Now().Add(grace)
	if c := containerSpec(spec, cs.name); c != nil && grace > 0 && c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		hctx, cancel := context.WithDeadline(ctx, deadline)
		if msg, err := r.runHook(hctx, p, inst, c, c.Lifecycle.PreStop); err != nil {
			r.log.Info("preStop hook failed", "pod", p.key(), "container", cs.name, "err", err)
			r.event(p, cs, true, "FailedPreStopHook", "%s", msg)
		}
		cancel()
	}
	if inst.task == nil {
		return
	}
	p.mu.Lock()
	running, why, noted := inst.running, inst.killReason, inst.killNoted
	p.mu.Unlock()
	if running && why == "" && !noted {
		r.event(p, cs, false, "Killing", "Stopping container %s", cs.name)
	}
	_ = inst.task.Kill(ctx, syscall.SIGTERM)
	select {
	case <-inst.exited:
		return
	case <-time.After(time.Until(deadline)):
	case <-ctx.Done():
	}
	_ = inst.task.Kill(context.WithoutCancel(ctx), syscall.SIGKILL, containerd.WithKillAll)
	select {
	case <-inst.exited:
	case <-time.After(10 * time.Second):
		r.log.Warn("container did not exit after SIGKILL", "pod", p.key(), "container", cs.name)
	}
}

func containerSpec(pod *corev1.Pod, name string) *corev1.Container {
	if pod == nil {
		return nil
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

// RemovePod implements edge.Runtime.
func (r *Runtime) RemovePod(ctx context.Context, uid types.UID) error {
	p := r.pod(uid)
	if p == nil {
		return nil
	}
	if err := r.KillPod(ctx, uid, 0); err != nil {
		return err
	}
	p.stopWatchers()
	p.mu.Lock()
	var insts []*instance
	for _, c := range append(append([]*ctr{}, p.init...), p.app...) {
		for _, i := range []*instance{c.cur, c.prev} {
			if i != nil {
				insts = append(insts, i)
			}
		}
	}
	spec := p.spec
	p.mu.Unlock()
	for _, i := range insts {
		r.dropInstance(ctx, i)
	}
	if spec == nil {
		spec = &corev1.Pod{}
		spec.UID, spec.Namespace, spec.Name = p.uid, p.namespace, p.name
	}
	if !spec.Spec.HostNetwork {
		if err := r.net.tearDown(ctx, spec); err != nil {
			return err
		}
	}
	if err := r.removePodDir(p); err != nil {
		return err
	}
	_ = os.RemoveAll(r.podLogDir(p))
	r.mu.Lock()
	delete(r.pods, uid)
	r.mu.Unlock()
	return nil
}

// PodStatus implements edge.Runtime.
func (r *Runtime) PodStatus(_ context.Context, uid types.UID) (*edge.PodStatus, error) {
	p := r.pod(uid)
	if p == nil {
		return nil, fmt.Errorf("pod %s: %w", uid, edge.ErrPodNotFound)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := &edge.PodStatus{UID: uid, SandboxReady: p.sandboxReady, SandboxError: p.sandboxErr}
	st.IPs = append(st.IPs, p.ips...)
	conv := func(cs *ctr) edge.ContainerStatus {
		out := edge.ContainerStatus{Name: cs.name}
		if cs.cur == nil {
			out.State, out.Reason, out.Message = edge.ContainerWaiting, cs.waitReason, cs.waitMessage
			return out
		}
		i := cs.cur
		out.ID = Name + "://" + i.id
		out.Image, out.ImageID = i.image, i.imageID
		out.RestartCount = i.attempt
		out.StartedAt = i.started
		switch {
		case i.running && i.hooking:
			// Its postStart hook runs: not Running yet.
			out.State, out.Reason = edge.ContainerWaiting, "ContainerCreating"
		case i.running:
			out.State, out.Ready = edge.ContainerRunning, i.ready
		case cs.waitReason != "":
			// Exited and waiting for its restart.
			out.State, out.Reason, out.Message = edge.ContainerWaiting, cs.waitReason, cs.waitMessage
		default:
			out.State, out.ExitCode, out.Reason, out.Message, out.FinishedAt = edge.ContainerExited, i.exitCode, i.reason, i.message, i.finished
		}
		last := cs.prev
		if out.State == edge.ContainerWaiting && !i.running {
			last = i
		}
		if last != nil && !last.running {
			out.Last = &edge.ContainerTermination{
				ID: Name + "://" + last.id, ExitCode: last.exitCode, Reason: last.reason, Message: last.message,
				StartedAt: last.started, FinishedAt: last.finished,
			}
		}
		return out
	}
	for _, c := range p.init {
		st.InitContainers = append(st.InitContainers, conv(c))
	}
	for _, c := range p.app {
		if c.ephemeral {
			st.EphemeralContainers = append(st.EphemeralContainers, conv(c))
		} else {
			st.Containers = append(st.Containers, conv(c))
		}
	}
	return st, nil
}
