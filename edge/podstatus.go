package edge

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge/restarts"
)

// Reasons the agent reports, as the kubelet does (clients match on them).
const (
	reasonContainerCreating   = "ContainerCreating"
	reasonPodInitializing     = "PodInitializing"
	reasonCreateContainerErr  = "CreateContainerError"
	reasonContainersNotReady  = "ContainersNotReady"
	reasonContainersNotInit   = "ContainersNotInitialized"
	reasonPodCompleted        = "PodCompleted"
	reasonReadinessGatesNotOK = "ReadinessGatesNotReady"
)

// podStatusInput is what the pod's API status is computed from.
type podStatusInput struct {
	pod     *corev1.Pod // the API object; its status is the previous one
	rt      *PodStatus  // the runtime's view; nil when it has none
	syncErr error       // the last SyncPod error, if any
	hostIPs []string
	// terminating is true once the pod was killed for deletion: its
	// phase becomes terminal whatever the restart policy.
	terminating bool
	now         time.Time
}

// computePodStatus returns the API status of a pod as the kubelet would
// report it. It is a pure function of its input.
func computePodStatus(in podStatusInput) corev1.PodStatus {
	pod, old := in.pod, in.pod.Status
	st := corev1.PodStatus{
		QOSClass:          old.QOSClass,
		NominatedNodeName: old.NominatedNodeName,
		StartTime:         old.StartTime,
	}
	if st.QOSClass == "" {
		st.QOSClass = qosClass(&pod.Spec)
	}
	if st.StartTime == nil {
		t := metav1.NewTime(in.now).Rfc3339Copy()
		st.StartTime = &t
	}
	if len(in.hostIPs) > 0 {
		st.HostIP = in.hostIPs[0]
		for _, ip := range in.hostIPs {
			st.HostIPs = append(st.HostIPs, corev1.HostIP{IP: ip})
		}
	}
	rt := in.rt
	if rt == nil {
		rt = &PodStatus{UID: pod.UID}
	}
	for _, ip := range rt.IPs {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	if len(st.PodIPs) > 0 {
		st.PodIP = st.PodIPs[0].IP
	}

	// A regular container exists only once the initialization was
	// through: the pod was initialized, even while a sidecar restarts.
	regularCreated := len(rt.Containers) > 0
	initDone := true
	for _, c := range pod.Spec.InitContainers {
		cs := find(rt.InitContainers, c.Name)
		if restarts.InitRole(&c) == restarts.Sidecar {
			if !regularCreated && (cs == nil || cs.State != ContainerRunning) {
				initDone = false
			}
		} else if cs == nil || cs.State != ContainerExited || cs.ExitCode != 0 {
			initDone = false
		}
	}
	waitReason, waitMsg := reasonContainerCreating, ""
	createErr := in.syncErr != nil && !errors.Is(in.syncErr, ErrVolumeNotReady) && !errors.Is(in.syncErr, ErrPodSandbox)
	if createErr {
		// A pod waiting for its volumes or its sandbox stays in
		// ContainerCreating, as with the kubelet; its FailedMount or
		// FailedCreatePodSandBox events say why.
		waitReason, waitMsg = reasonCreateContainerErr, in.syncErr.Error()
	}
	for _, c := range pod.Spec.InitContainers {
		st.InitContainerStatuses = append(st.InitContainerStatuses,
			containerStatus(c, find(rt.InitContainers, c.Name), reasonPodInitializing, "", true))
	}
	appReason, appMsg := waitReason, waitMsg
	if !initDone && !createErr {
		appReason = reasonPodInitializing
	}
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses,
			containerStatus(c, find(rt.Containers, c.Name), appReason, appMsg, false))
	}

	for _, c := range pod.Spec.EphemeralContainers {
		st.EphemeralContainerStatuses = append(st.EphemeralContainerStatuses, ephemeralStatus(c, find(rt.EphemeralContainers, c.Name), waitReason, waitMsg))
	}

	st.Phase = podPhase(pod, st.InitContainerStatuses, st.ContainerStatuses, in.terminating)
	st.Conditions = podConditions(pod, old.Conditions, rt, st, initDone, regularCreated, in.now)
	// Reason and message belong to whoever ended the pod (eviction,
	// deadline); the agent keeps them.
	st.Reason, st.Message = old.Reason, old.Message
	return st
}

func find(list []ContainerStatus, name string) *ContainerStatus {
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

func apiTime(t time.Time) metav1.Time {
	return metav1.NewTime(t).Rfc3339Copy()
}

// containerStatus converts the runtime's view of one container; cs is nil
// when the runtime has not created it yet.
func containerStatus(c corev1.Container, cs *ContainerStatus, waitReason, waitMsg string, isInit bool) corev1.ContainerStatus {
	out := corev1.ContainerStatus{Name: c.Name, Image: c.Image}
	// A sidecar is ready as a regular container is; an init container
	// that completed counts as ready.
	sidecar := isInit && restarts.InitRole(&c) == restarts.Sidecar
	started := false
	out.Started = &started
	if cs == nil {
		out.State.Waiting = &corev1.ContainerStateWaiting{Reason: waitReason, Message: waitMsg}
		return out
	}
	out.ImageID, out.ContainerID, out.RestartCount = cs.ImageID, cs.ID, cs.RestartCount
	if cs.Image != "" {
		out.Image = cs.Image
	}
	switch cs.State {
	case ContainerRunning:
		out.State.Running = &corev1.ContainerStateRunning{StartedAt: apiTime(cs.StartedAt)}
		started = true
		out.Ready = cs.Ready && (!isInit || sidecar)
	case ContainerExited:
		out.State.Terminated = &corev1.ContainerStateTerminated{
			ExitCode: cs.ExitCode, Reason: cs.Reason, Message: cs.Message,
			StartedAt: apiTime(cs.StartedAt), FinishedAt: apiTime(cs.FinishedAt), ContainerID: cs.ID,
		}
		// A completed init container counts as ready, as upstream.
		out.Ready = isInit && !sidecar && cs.ExitCode == 0
	default:
		reason := cs.Reason
		if reason == "" {
			reason = waitReason
		}
		out.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: cs.Message}
	}
	if l := cs.Last; l != nil {
		out.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{
			ExitCode: l.ExitCode, Reason: l.Reason, Message: l.Message,
			StartedAt: apiTime(l.StartedAt), FinishedAt: apiTime(l.FinishedAt), ContainerID: l.ID,
		}
	}
	return out
}

// podPhase computes the phase from the container statuses as the kubelet
// does. A terminating pod whose containers all stopped ends Succeeded when
// they all exited 0 and Failed otherwise, whatever its restart policy.
// Sidecars (init containers with restartPolicy Always) keep the pod
// Pending until they run, count as running beside the regular containers,
// and their exits do not decide whether the pod succeeded.
func podPhase(pod *corev1.Pod, inits, apps []corev1.ContainerStatus, terminating bool) corev1.PodPhase {
	policy := restarts.Policy(&pod.Spec)
	regularStarted := false
	for _, s := range apps {
		if s.State.Running != nil || s.State.Terminated != nil || s.LastTerminationState.Terminated != nil {
			regularStarted = true
		}
	}
	initPending, initFailed, sidecarsPending := 0, false, 0
	running, waiting, stopped, succeeded := 0, 0, 0, 0
	for _, s := range inits {
		if restarts.IsSidecar(&pod.Spec, s.Name) {
			switch {
			case s.State.Running != nil:
				running++
			case s.State.Terminated != nil:
				// Stopped or restarting: it does not decide the phase.
			case s.LastTerminationState.Terminated == nil:
				sidecarsPending++
			}
			continue
		}
		switch {
		case s.State.Terminated != nil && s.State.Terminated.ExitCode == 0:
		case s.State.Terminated != nil:
			initFailed = true
		case s.State.Waiting != nil && s.LastTerminationState.Terminated != nil && s.LastTerminationState.Terminated.ExitCode != 0:
			initFailed = true
		default:
			initPending++
		}
	}
	if !regularStarted {
		// Not initialized while a sidecar has not run yet; once a
		// regular container ran, a restarting sidecar changes nothing.
		initPending += sidecarsPending
	}
	if initFailed && policy == corev1.RestartPolicyNever {
		return corev1.PodFailed
	}
	if terminating && initPending+boolInt(initFailed) > 0 {
		// Killed before its regular containers could run.
		return corev1.PodFailed
	}
	if initPending > 0 || initFailed {
		return corev1.PodPending
	}
	for _, s := range apps {
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case s.State.Waiting != nil && s.LastTerminationState.Terminated != nil:
			// Waiting to restart after having run.
			stopped++
		default:
			waiting++
		}
	}
	switch {
	case terminating && running == 0:
		if stopped > 0 && stopped == succeeded && waiting == 0 {
			return corev1.PodSucceeded
		}
		return corev1.PodFailed
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case stopped > 0:
		switch {
		case policy == corev1.RestartPolicyAlways:
			return corev1.PodRunning
		case stopped == succeeded:
			return corev1.PodSucceeded
		case policy == corev1.RestartPolicyNever:
			return corev1.PodFailed
		}
		// OnFailure: the failed containers are restarting.
		return corev1.PodRunning
	}
	return corev1.PodPending
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// podConditions computes the pod's conditions, keeping the transition times
// of those that did not change.
func podConditions(pod *corev1.Pod, old []corev1.PodCondition, rt *PodStatus, st corev1.PodStatus, initDone, regularCreated bool, now time.Time) []corev1.PodCondition {
	terminal := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed
	var conds []corev1.PodCondition
	set := func(t corev1.PodConditionType, ok bool, reason, msg string) {
		status := corev1.ConditionFalse
		if ok {
			status, reason, msg = corev1.ConditionTrue, "", ""
		}
		c := corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: msg, LastTransitionTime: apiTime(now)}
		for _, o := range old {
			if o.Type == t && o.Status == status {
				c.LastTransitionTime = o.LastTransitionTime
				c.LastProbeTime = o.LastProbeTime
			}
		}
		conds = append(conds, c)
	}

	sandbox := rt.SandboxReady && !(terminal && !anyRunning(st))
	set(corev1.PodReadyToStartContainers, sandbox, "", "")

	var notInit, unready []string
	for _, s := range st.InitContainerStatuses {
		if restarts.IsSidecar(&pod.Spec, s.Name) {
			// A sidecar must run to initialize the pod, and be
			// ready for its containers to be.
			if !regularCreated && s.State.Running == nil {
				notInit = append(notInit, s.Name)
			}
			if !s.Ready {
				unready = append(unready, s.Name)
			}
			continue
		}
		if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			notInit = append(notInit, s.Name)
		}
	}
	initialized := initDone || (terminal && len(notInit) == 0)
	set(corev1.PodInitialized, initialized, reasonContainersNotInit, incomplete("incomplete status", notInit))

	for _, s := range st.ContainerStatuses {
		if !s.Ready {
			unready = append(unready, s.Name)
		}
	}
	switch {
	case terminal:
		set(corev1.ContainersReady, false, reasonPodCompleted, "")
	case !initialized:
		set(corev1.ContainersReady, false, reasonContainersNotReady, incomplete("unready status", unready))
	default:
		set(corev1.ContainersReady, len(unready) == 0, reasonContainersNotReady, incomplete("unready status", unready))
	}

	var gatesNotOK []string
	for _, g := range pod.Spec.ReadinessGates {
		ok := false
		for _, c := range pod.Status.Conditions {
			if c.Type == g.ConditionType && c.Status == corev1.ConditionTrue {
				ok = true
			}
		}
		if !ok {
			gatesNotOK = append(gatesNotOK, string(g.ConditionType))
		}
	}
	switch {
	case terminal:
		set(corev1.PodReady, false, reasonPodCompleted, "")
	case !initialized:
		set(corev1.PodReady, false, reasonContainersNotReady, incomplete("unready status", unready))
	case len(unready) > 0:
		set(corev1.PodReady, false, reasonContainersNotReady, incomplete("unready status", unready))
	case len(gatesNotOK) > 0:
		set(corev1.PodReady, false, reasonReadinessGatesNotOK, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist or is not True", strings.Join(gatesNotOK, ", ")))
	default:
		set(corev1.PodReady, true, "", "")
	}

	// Conditions owned by others (PodScheduled from the scheduler,
	// readiness gates, DisruptionTarget) are kept as they are.
	mine := []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady}
	var out []corev1.PodCondition
	scheduled := false
	for _, o := range old {
		if o.Type == corev1.PodScheduled {
			scheduled = true
		}
		if !slices.Contains(mine, o.Type) {
			out = append(out, o)
		}
	}
	if !scheduled {
		// Bound directly (spec.nodeName set at creation): scheduled by
		// definition, as upstream reports.
		out = append([]corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: apiTime(now)}}, out...)
	}
	return append(out, conds...)
}

func anyRunning(st corev1.PodStatus) bool {
	for _, s := range st.ContainerStatuses {
		if s.State.Running != nil {
			return true
		}
	}
	return false
}

func incomplete(what string, names []string) string {
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf("containers with %s: [%s]", what, strings.Join(names, " "))
}

// qosClass computes the quality-of-service class from the requests and
// limits of cpu and memory, for pods the hub did not classify.
func qosClass(spec *corev1.PodSpec) corev1.PodQOSClass {
	all := append(slices.Clone(spec.InitContainers), spec.Containers...)
	classified, guaranteed := false, true
	for _, c := range all {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[r]
			lim, hasLim := c.Resources.Limits[r]
			if (hasReq && !req.IsZero()) || (hasLim && !lim.IsZero()) {
				classified = true
			}
			if !hasLim || lim.IsZero() || (hasReq && req.Cmp(lim) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case !classified:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

// ephemeralStatus converts the runtime's view of an ephemeral container.
// As the kubelet reports them, ephemeral containers are never ready and
// have no started field: no probe runs for them.
func ephemeralStatus(c corev1.EphemeralContainer, cs *ContainerStatus, waitReason, waitMsg string) corev1.ContainerStatus {
	out := containerStatus(corev1.Container(c.EphemeralContainerCommon), cs, waitReason, waitMsg, false)
	out.Ready, out.Started = false, nil
	return out
}
