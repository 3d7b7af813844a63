package edge

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func specPod(policy corev1.RestartPolicy, inits []string, apps ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", UID: "u1"}}
	p.Spec.RestartPolicy = policy
	for _, n := range inits {
		p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: n, Image: "busybox"})
	}
	for _, n := range apps {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: n, Image: "nginx"})
	}
	return p
}

func running(name string, ready bool) ContainerStatus {
	return ContainerStatus{Name: name, ID: "sim://" + name, Image: "nginx", ImageID: "sim-image://nginx", State: ContainerRunning, StartedAt: t0, Ready: ready}
}

func exited(name string, code int32) ContainerStatus {
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	return ContainerStatus{Name: name, ID: "sim://" + name, State: ContainerExited, Reason: reason, ExitCode: code, StartedAt: t0, FinishedAt: t0.Add(time.Second)}
}

func crashLooping(name string, restarts int32) ContainerStatus {
	return ContainerStatus{Name: name, State: ContainerWaiting, Reason: "CrashLoopBackOff", Message: "back-off 10s", RestartCount: restarts,
		Last: &ContainerTermination{ID: "sim://old", ExitCode: 1, Reason: "Error", StartedAt: t0, FinishedAt: t0.Add(time.Second)}}
}

func cond(st corev1.PodStatus, t corev1.PodConditionType) corev1.PodCondition {
	for _, c := range st.Conditions {
		if c.Type == t {
			return c
		}
	}
	return corev1.PodCondition{}
}

func compute(pod *corev1.Pod, rt *PodStatus) corev1.PodStatus {
	return computePodStatus(podStatusInput{pod: pod, rt: rt, hostIPs: []string{"192.0.2.10"}, now: t0})
}

func wantConds(t *testing.T, st corev1.PodStatus, want map[corev1.PodConditionType]corev1.ConditionStatus) {
	t.Helper()
	for ty, s := range want {
		if got := cond(st, ty).Status; got != s {
			t.Errorf("condition %s = %q, want %q (all: %+v)", ty, got, s, st.Conditions)
		}
	}
}

func TestPodStatusRunningReady(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "web")
	st := compute(pod, &PodStatus{SandboxReady: true, IPs: []netip.Addr{netip.MustParseAddr("10.42.0.5")}, Containers: []ContainerStatus{running("web", true)}})
	if st.Phase != corev1.PodRunning {
		t.Fatalf("phase %s, want Running", st.Phase)
	}
	wantConds(t, st, map[corev1.PodConditionType]corev1.ConditionStatus{
		corev1.PodScheduled: "True", corev1.PodReadyToStartContainers: "True", corev1.PodInitialized: "True",
		corev1.ContainersReady: "True", corev1.PodReady: "True",
	})
	if st.PodIP != "10.42.0.5" || len(st.PodIPs) != 1 || st.HostIP != "192.0.2.10" || st.HostIPs[0].IP != "192.0.2.10" {
		t.Fatalf("addresses: podIP %q podIPs %v hostIP %q hostIPs %v", st.PodIP, st.PodIPs, st.HostIP, st.HostIPs)
	}
	cs := st.ContainerStatuses[0]
	if cs.State.Running == nil || !cs.Ready || cs.Started == nil || !*cs.Started || cs.ContainerID != "sim://web" || cs.ImageID == "" {
		t.Fatalf("container status %+v", cs)
	}
	if st.StartTime == nil || !st.StartTime.Time.Equal(t0) || st.QOSClass != corev1.PodQOSBestEffort {
		t.Fatalf("startTime %v qos %s", st.StartTime, st.QOSClass)
	}
}

func TestPodStatusNotReady(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "a", "b")
	st := compute(pod, &PodStatus{SandboxReady: true, Containers: []ContainerStatus{running("a", true), running("b", false)}})
	if st.Phase != corev1.PodRunning {
		t.Fatalf("phase %s, want Running", st.Phase)
	}
	ready := cond(st, corev1.PodReady)
	if ready.Status != "False" || ready.Reason != "ContainersNotReady" || ready.Message != "containers with unready status: [b]" {
		t.Fatalf("Ready condition %+v", ready)
	}
}

func TestPodStatusCrashLooping(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	st := compute(pod, &PodStatus{SandboxReady: true, Containers: []ContainerStatus{crashLooping("app", 3)}})
	if st.Phase != corev1.PodRunning {
		t.Fatalf("phase %s, want Running (restarting)", st.Phase)
	}
	cs := st.ContainerStatuses[0]
	if cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" || cs.RestartCount != 3 || cs.Ready {
		t.Fatalf("container %+v", cs)
	}
	if lt := cs.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 1 || lt.ContainerID != "sim://old" {
		t.Fatalf("lastState %+v", cs.LastTerminationState)
	}
	wantConds(t, st, map[corev1.PodConditionType]corev1.ConditionStatus{corev1.PodReady: "False", corev1.ContainersReady: "False"})
}

func TestPodStatusTerminalPhases(t *testing.T) {
	for _, tt := range []struct {
		name   string
		policy corev1.RestartPolicy
		cs     []ContainerStatus
		want   corev1.PodPhase
	}{
		{"never succeeded", corev1.RestartPolicyNever, []ContainerStatus{exited("a", 0), exited("b", 0)}, corev1.PodSucceeded},
		{"never failed", corev1.RestartPolicyNever, []ContainerStatus{exited("a", 0), exited("b", 2)}, corev1.PodFailed},
		{"never one still running", corev1.RestartPolicyNever, []ContainerStatus{exited("a", 2), running("b", true)}, corev1.PodRunning},
		{"on-failure succeeded", corev1.RestartPolicyOnFailure, []ContainerStatus{exited("a", 0), exited("b", 0)}, corev1.PodSucceeded},
		{"on-failure restarting", corev1.RestartPolicyOnFailure, []ContainerStatus{exited("a", 0), crashLooping("b", 1)}, corev1.PodRunning},
		{"always exited", corev1.RestartPolicyAlways, []ContainerStatus{exited("a", 0), exited("b", 0)}, corev1.PodRunning},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := specPod(tt.policy, nil, "a", "b")
			st := compute(pod, &PodStatus{SandboxReady: true, Containers: tt.cs})
			if st.Phase != tt.want {
				t.Fatalf("phase %s, want %s", st.Phase, tt.want)
			}
			if terminal(st.Phase) {
				r := cond(st, corev1.PodReady)
				if r.Status != "False" || r.Reason != "PodCompleted" {
					t.Fatalf("Ready of a finished pod: %+v", r)
				}
			}
		})
	}
}

func TestPodStatusInitContainers(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, []string{"i1", "i2"}, "app")

	st := compute(pod, &PodStatus{SandboxReady: true, InitContainers: []ContainerStatus{exited("i1", 0), running("i2", false)}})
	if st.Phase != corev1.PodPending {
		t.Fatalf("phase while initialising: %s, want Pending", st.Phase)
	}
	init := cond(st, corev1.PodInitialized)
	if init.Status != "False" || init.Reason != "ContainersNotInitialized" || init.Message != "containers with incomplete status: [i2]" {
		t.Fatalf("Initialized %+v", init)
	}
	if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Fatalf("app while initialising: %+v", st.ContainerStatuses[0].State)
	}
	if !st.InitContainerStatuses[0].Ready || st.InitContainerStatuses[1].Ready {
		t.Fatalf("init readiness: %v %v", st.InitContainerStatuses[0].Ready, st.InitContainerStatuses[1].Ready)
	}

	st = compute(pod, &PodStatus{SandboxReady: true,
		InitContainers: []ContainerStatus{exited("i1", 0), exited("i2", 0)}, Containers: []ContainerStatus{running("app", true)}})
	if st.Phase != corev1.PodRunning || cond(st, corev1.PodInitialized).Status != "True" || cond(st, corev1.PodReady).Status != "True" {
		t.Fatalf("after init: phase %s conditions %+v", st.Phase, st.Conditions)
	}

	never := specPod(corev1.RestartPolicyNever, []string{"i1"}, "app")
	st = compute(never, &PodStatus{SandboxReady: true, InitContainers: []ContainerStatus{exited("i1", 1)}})
	if st.Phase != corev1.PodFailed {
		t.Fatalf("failed init with Never: %s, want Failed", st.Phase)
	}
	always := specPod(corev1.RestartPolicyAlways, []string{"i1"}, "app")
	st = compute(always, &PodStatus{SandboxReady: true, InitContainers: []ContainerStatus{crashLooping("i1", 2)}})
	if st.Phase != corev1.PodPending {
		t.Fatalf("crash-looping init with Always: %s, want Pending", st.Phase)
	}
}

func TestPodStatusNothingYet(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	st := compute(pod, nil)
	if st.Phase != corev1.PodPending || st.ContainerStatuses[0].State.Waiting.Reason != "ContainerCreating" {
		t.Fatalf("before the runtime: phase %s, %+v", st.Phase, st.ContainerStatuses[0].State)
	}
	if cond(st, corev1.PodReadyToStartContainers).Status != "False" {
		t.Fatalf("sandbox condition before the runtime: %+v", st.Conditions)
	}
	st = computePodStatus(podStatusInput{pod: pod, syncErr: errors.New("no pod CIDR"), now: t0})
	if w := st.ContainerStatuses[0].State.Waiting; w.Reason != "CreateContainerError" || !strings.Contains(w.Message, "no pod CIDR") {
		t.Fatalf("sync error: %+v", w)
	}
	// A pod waiting for its volumes stays in ContainerCreating, its init
	// containers' followers in PodInitializing.
	wait := fmt.Errorf("set up volumes: %w", ErrVolumeNotReady)
	pod = specPod(corev1.RestartPolicyAlways, []string{"init"}, "app")
	st = computePodStatus(podStatusInput{pod: pod, syncErr: wait, now: t0})
	if w := st.InitContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" || w.Message != "" {
		t.Errorf("init container waiting for volumes: %+v", st.InitContainerStatuses[0].State)
	}
	if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("app container waiting for volumes: %+v", st.ContainerStatuses[0].State)
	}
	pod = specPod(corev1.RestartPolicyAlways, nil, "app")
	st = computePodStatus(podStatusInput{pod: pod, syncErr: wait, now: t0})
	if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "ContainerCreating" || w.Message != "" || st.Phase != corev1.PodPending {
		t.Errorf("container waiting for volumes: phase %s, %+v", st.Phase, st.ContainerStatuses[0].State)
	}
	// So does a pod whose sandbox could not be created.
	noRuntime := fmt.Errorf("create sandbox: %w", SandboxFailed(errors.New(`no runtime for "gvisor" is configured`)))
	st = computePodStatus(podStatusInput{pod: pod, syncErr: noRuntime, now: t0})
	if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "ContainerCreating" || st.Phase != corev1.PodPending {
		t.Errorf("container waiting for its sandbox: phase %s, %+v", st.Phase, st.ContainerStatuses[0].State)
	}
}

func TestPodStatusTerminating(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "a")
	in := podStatusInput{pod: pod, now: t0, terminating: true,
		rt: &PodStatus{SandboxReady: true, Containers: []ContainerStatus{exited("a", 0)}}}
	if st := computePodStatus(in); st.Phase != corev1.PodSucceeded {
		t.Fatalf("stopped cleanly for deletion: %s, want Succeeded", st.Phase)
	}
	in.rt.Containers[0] = exited("a", 137)
	if st := computePodStatus(in); st.Phase != corev1.PodFailed {
		t.Fatalf("killed for deletion: %s, want Failed", st.Phase)
	}
}

func TestPodConditionTransitionTimesKept(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "web")
	rt := &PodStatus{SandboxReady: true, Containers: []ContainerStatus{running("web", true)}}
	first := compute(pod, rt)
	pod.Status = first
	later := computePodStatus(podStatusInput{pod: pod, rt: rt, hostIPs: []string{"192.0.2.10"}, now: t0.Add(time.Hour)})
	for _, c := range later.Conditions {
		if !c.LastTransitionTime.Time.Equal(t0) {
			t.Fatalf("condition %s moved to %v though it did not change", c.Type, c.LastTransitionTime)
		}
	}
	if !later.StartTime.Time.Equal(t0) {
		t.Fatalf("startTime moved")
	}
	rt.Containers[0].Ready = false
	changed := computePodStatus(podStatusInput{pod: pod, rt: rt, now: t0.Add(time.Hour)})
	if !cond(changed, corev1.PodReady).LastTransitionTime.Time.Equal(t0.Add(time.Hour)) {
		t.Fatalf("Ready changed without a new transition time")
	}
}

func TestQOSClass(t *testing.T) {
	rl := func(cpu, mem string) corev1.ResourceList {
		l := corev1.ResourceList{}
		if cpu != "" {
			l[corev1.ResourceCPU] = resource.MustParse(cpu)
		}
		if mem != "" {
			l[corev1.ResourceMemory] = resource.MustParse(mem)
		}
		return l
	}
	for _, tt := range []struct {
		req, lim corev1.ResourceList
		want     corev1.PodQOSClass
	}{
		{nil, nil, corev1.PodQOSBestEffort},
		{rl("100m", ""), nil, corev1.PodQOSBurstable},
		{rl("1", "1Gi"), rl("1", "1Gi"), corev1.PodQOSGuaranteed},
		{nil, rl("1", "1Gi"), corev1.PodQOSGuaranteed},
		{rl("500m", "1Gi"), rl("1", "1Gi"), corev1.PodQOSBurstable},
	} {
		spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: tt.req, Limits: tt.lim}}}}
		if got := qosClass(&spec); got != tt.want {
			t.Errorf("requests %v limits %v: %s, want %s", tt.req, tt.lim, got, tt.want)
		}
	}
}

// TestPodStatusSidecars covers init containers with restartPolicy Always:
// they initialize the pod by running, count for its readiness, keep it
// Running beside finished regular containers, and their own exits do not
// decide whether it succeeded.
func TestPodStatusSidecars(t *testing.T) {
	pod := specPod(corev1.RestartPolicyNever, []string{"s", "i1"}, "app")
	always := corev1.ContainerRestartPolicyAlways
	pod.Spec.InitContainers[0].RestartPolicy = &always

	st := compute(pod, &PodStatus{SandboxReady: true, InitContainers: []ContainerStatus{running("s", false)}})
	if st.Phase != corev1.PodPending {
		t.Fatalf("phase while initialising: %s", st.Phase)
	}
	if init := cond(st, corev1.PodInitialized); init.Status != "False" || init.Message != "containers with incomplete status: [i1]" {
		t.Fatalf("Initialized while i1 waits: %+v", init)
	}

	st = compute(pod, &PodStatus{SandboxReady: true,
		InitContainers: []ContainerStatus{running("s", true), exited("i1", 0)}, Containers: []ContainerStatus{running("app", true)}})
	if st.Phase != corev1.PodRunning || !st.InitContainerStatuses[0].Ready {
		t.Fatalf("running: phase %s, sidecar ready %v", st.Phase, st.InitContainerStatuses[0].Ready)
	}
	wantConds(t, st, map[corev1.PodConditionType]corev1.ConditionStatus{corev1.PodInitialized: "True", corev1.ContainersReady: "True", corev1.PodReady: "True"})

	st = compute(pod, &PodStatus{SandboxReady: true,
		InitContainers: []ContainerStatus{running("s", false), exited("i1", 0)}, Containers: []ContainerStatus{running("app", true)}})
	if c := cond(st, corev1.ContainersReady); c.Status != "False" || c.Message != "containers with unready status: [s]" {
		t.Fatalf("unready sidecar: %+v", c)
	}

	// A restarting sidecar does not undo the initialization.
	st = compute(pod, &PodStatus{SandboxReady: true,
		InitContainers: []ContainerStatus{crashLooping("s", 1), exited("i1", 0)}, Containers: []ContainerStatus{running("app", true)}})
	if st.Phase != corev1.PodRunning || cond(st, corev1.PodInitialized).Status != "True" {
		t.Fatalf("restarting sidecar: phase %s, conditions %+v", st.Phase, st.Conditions)
	}

	for _, tt := range []struct {
		name    string
		sidecar ContainerStatus
		app     int32
		want    corev1.PodPhase
	}{
		{"sidecar still runs", running("s", true), 0, corev1.PodRunning},
		{"sidecar stopped, app succeeded", exited("s", 143), 0, corev1.PodSucceeded},
		{"sidecar stopped, app failed", exited("s", 0), 1, corev1.PodFailed},
	} {
		st = compute(pod, &PodStatus{SandboxReady: true,
			InitContainers: []ContainerStatus{tt.sidecar, exited("i1", 0)}, Containers: []ContainerStatus{exited("app", tt.app)}})
		if st.Phase != tt.want {
			t.Errorf("%s: phase %s, want %s", tt.name, st.Phase, tt.want)
		}
	}
}
