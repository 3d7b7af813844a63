package restarts

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Role is what a container is to its pod.
type Role int

// Roles.
const (
	// Regular is a container of spec.containers.
	Regular Role = iota
	// Init is an init container that must complete (exit 0) before the
	// next one starts.
	Init
	// Sidecar is an init container with restartPolicy Always: once it has
	// started the next one starts, and it keeps running beside the
	// regular containers, restarted whatever the pod's restartPolicy.
	Sidecar
)

func (r Role) String() string {
	switch r {
	case Init:
		return "init"
	case Sidecar:
		return "sidecar"
	}
	return "regular"
}

// InitRole is the role of init container c: Sidecar with restartPolicy
// Always, Init otherwise.
func InitRole(c *corev1.Container) Role {
	if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
		return Sidecar
	}
	return Init
}

// IsSidecar tells whether the init container named name of pod is a
// sidecar.
func IsSidecar(pod *corev1.PodSpec, name string) bool {
	for i := range pod.InitContainers {
		if pod.InitContainers[i].Name == name {
			return InitRole(&pod.InitContainers[i]) == Sidecar
		}
	}
	return false
}

// Policy is the pod's restartPolicy, Always when it is not set.
func Policy(pod *corev1.PodSpec) corev1.RestartPolicy {
	if pod.RestartPolicy == "" {
		return corev1.RestartPolicyAlways
	}
	return pod.RestartPolicy
}

// Container is what the runtime observed of one container of the pod.
type Container struct {
	Name string
	Role Role
	// Created is true once an instance of the container was created.
	Created bool
	// Running is true while its latest instance runs.
	Running bool
	// Started is true once an instance of a sidecar started in the pod's
	// current sandbox: it runs with its postStart hook returned and its
	// startup probe passed. The next init container waits for it.
	Started bool
	// ExitCode and FinishedAt describe how the latest instance ended,
	// when it was created and does not run.
	ExitCode   int32
	FinishedAt time.Time
	// Rerun is set on an init container or sidecar whose latest run was
	// in a sandbox that is gone: it runs again, in order and with no
	// back-off, as the kubelet runs a pod's init containers again in a
	// new sandbox.
	Rerun bool
	// Backoff is the container's crash-loop back-off. Decide records in
	// it the restarts it orders. Nil means no back-off.
	Backoff *Backoff
}

// Action is what to do with a container.
type Action int

// Actions.
const (
	// Keep leaves the container as it is: it runs, finished for good, or
	// waits for an earlier init container.
	Keep Action = iota
	// Start creates the container's first instance, or runs an init
	// container again in a new sandbox.
	Start
	// Restart creates a new instance of a container that exited; its
	// back-off allows it now (and recorded it).
	Restart
	// BackOff leaves an exited container waiting in CrashLoopBackOff
	// until Step.Until; the runtime looks again then.
	BackOff
	// Stop stops a running sidecar: the regular containers are done or
	// the pod's initialization failed, and it is not restarted.
	Stop
)

func (a Action) String() string {
	switch a {
	case Start:
		return "Start"
	case Restart:
		return "Restart"
	case BackOff:
		return "BackOff"
	case Stop:
		return "Stop"
	}
	return "Keep"
}

// Step is what Decide wants done with one container.
type Step struct {
	Action Action
	// Until is when a BackOff ends, and Wait the back-off it waits out
	// (counted from the exit).
	Until time.Time
	Wait  time.Duration
}

// Plan is what Decide wants done with a pod's containers.
type Plan struct {
	// Steps has one Step per container, in the order Decide got them.
	Steps []Step
	// InitFailed is set when an init container failed and the pod's
	// restartPolicy is Never: nothing more runs, the pod failed.
	InitFailed bool
	// Done is set when every regular container exited and none will be
	// restarted: the pod completed, its sidecars are stopped.
	Done bool
}

// Decide returns what to do next with the containers of a pod whose
// restartPolicy is policy (empty means Always). cs lists them as the spec
// does: init containers (Init and Sidecar) in order, then the regular
// ones. now is the time of the decision; for every Restart it returns,
// Decide records the restart in the container's Backoff.
//
// The rules are the kubelet's:
//   - init containers run one at a time in order; an Init container must
//     exit 0 before the next starts, a Sidecar must have started;
//   - a failed Init container is restarted unless the policy is Never
//     (Always counts as OnFailure for it); with Never the pod failed;
//   - regular containers start together once initialization is through;
//     Always restarts them on any exit, OnFailure on a non-zero exit,
//     Never not at all;
//   - a Sidecar is restarted on any exit whatever the policy, until the
//     regular containers are done or the initialization failed; then
//     it is stopped;
//   - every restart waits out the container's back-off, counted from its
//     exit.
func Decide(policy corev1.RestartPolicy, cs []Container, now time.Time) Plan {
	if policy == "" {
		policy = corev1.RestartPolicyAlways
	}
	plan := Plan{Steps: make([]Step, len(cs))}
	// restart marks an exited container to be restarted; the back-off
	// is applied once the plan is final, so that a restart the plan
	// takes back (a sidecar of a pod that is done) is not recorded.
	restart := func(i int) { plan.Steps[i] = Step{Action: Restart} }

	// A container after which another one was created in the current
	// sandbox had started, whatever its record says (an agent that
	// restarted knows only that the later one exists).
	later := make([]bool, len(cs))
	for i := len(cs) - 2; i >= 0; i-- {
		later[i] = later[i+1] || (cs[i+1].Created && !cs[i+1].Rerun)
	}

	// Initialization: through stays true while every init container so
	// far lets the next one start.
	through := true
	var sidecars []int
	for i := range cs {
		c := &cs[i]
		switch c.Role {
		case Init:
			if !through {
				continue
			}
			through = false
			switch {
			case !c.Created, c.Rerun:
				plan.Steps[i] = Step{Action: Start}
			case c.Running:
			case c.ExitCode == 0:
				through = true
			case policy == corev1.RestartPolicyNever:
				plan.InitFailed = true
			default:
				restart(i)
			}
		case Sidecar:
			sidecars = append(sidecars, i)
			switch {
			case !c.Created, c.Rerun:
				if through {
					plan.Steps[i] = Step{Action: Start}
				}
				through = false
			case c.Running:
				through = through && (c.Started || later[i])
			default:
				// Restarted wherever it stands; the containers after
				// it wait only if it never started.
				restart(i)
				through = through && (c.Started || later[i])
			}
		}
	}
	if plan.InitFailed {
		stopSidecars(&plan, cs, sidecars)
		return plan
	}
	if !through {
		applyBackoff(&plan, cs, now)
		return plan
	}

	done, regular := true, 0
	for i := range cs {
		c := &cs[i]
		if c.Role != Regular {
			continue
		}
		regular++
		switch {
		case !c.Created:
			plan.Steps[i] = Step{Action: Start}
			done = false
		case c.Running:
			done = false
		case policy == corev1.RestartPolicyAlways,
			policy == corev1.RestartPolicyOnFailure && c.ExitCode != 0:
			restart(i)
			done = false
		}
	}
	if done && regular > 0 {
		plan.Done = true
		stopSidecars(&plan, cs, sidecars)
	}
	applyBackoff(&plan, cs, now)
	return plan
}

// applyBackoff turns each Restart of the plan into a BackOff while the
// container's back-off lasts, and records the others as restarts.
func applyBackoff(plan *Plan, cs []Container, now time.Time) {
	for i := range plan.Steps {
		c := &cs[i]
		if plan.Steps[i].Action != Restart || c.Backoff == nil {
			continue
		}
		wait := c.Backoff.Wait(c.FinishedAt)
		if until := c.FinishedAt.Add(wait); now.Before(until) {
			plan.Steps[i] = Step{Action: BackOff, Until: until, Wait: wait}
			continue
		}
		c.Backoff.Restarted(now)
	}
}

// stopSidecars replaces the steps of the sidecars: running ones stop,
// exited ones are not restarted.
func stopSidecars(plan *Plan, cs []Container, sidecars []int) {
	for _, i := range sidecars {
		if cs[i].Running {
			plan.Steps[i] = Step{Action: Stop}
		} else {
			plan.Steps[i] = Step{}
		}
	}
}

// Reasons and messages the kubelet reports, which clients match on.
const (
	// ReasonCrashLoopBackOff is the waiting reason of a container waiting
	// out its back-off.
	ReasonCrashLoopBackOff = "CrashLoopBackOff"
	// ReasonCompleted and ReasonError end a container that exited 0 and
	// one that did not; ReasonOOMKilled one the kernel killed for memory.
	ReasonCompleted = "Completed"
	ReasonError     = "Error"
	ReasonOOMKilled = "OOMKilled"
)

// ExitReason is the terminated reason of a container that exited with
// code, oom when the kernel's OOM killer killed it.
func ExitReason(code int32, oom bool) string {
	switch {
	case oom:
		return ReasonOOMKilled
	case code != 0:
		return ReasonError
	}
	return ReasonCompleted
}

// BackOffMessage is the waiting message of a container in
// CrashLoopBackOff, as the kubelet words it.
func BackOffMessage(wait time.Duration, container, podName, namespace, uid string) string {
	return fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", wait, container, podName, namespace, uid)
}
