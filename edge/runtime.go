package edge

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Runtime runs the pods of one node. The agent drives it from one worker
// goroutine per pod, so calls for one pod never overlap, while calls for
// different pods may run concurrently. Restarting containers according to
// the pod's restartPolicy, with the crash-loop back-off, is the runtime's
// job: the agent calls SyncPod when the pod changes and reads PodStatus when
// the runtime says something happened.
type Runtime interface {
	// Info describes the runtime and the resources of the node it runs
	// on. It is called at registration and at every status computation; an
	// error marks the node not ready.
	Info(ctx context.Context) (RuntimeInfo, error)

	// SyncPod makes the pod's sandbox and containers match pod: it creates
	// what is missing and starts containers in order (init containers one
	// by one, then the others). It is idempotent and returns without
	// waiting for containers to start. It is not called for a pod that is
	// being deleted or that reached a terminal phase.
	SyncPod(ctx context.Context, pod *corev1.Pod, net Network) error

	// KillPod stops every container of the pod, sending them the stop
	// signal and killing those still running after grace. It returns once
	// all of them stopped. The pod's status and logs stay available until
	// RemovePod. Killing an unknown pod is not an error.
	KillPod(ctx context.Context, uid types.UID, grace time.Duration) error

	// RemovePod forgets a killed pod and frees what it held (its IP).
	// Removing an unknown pod is not an error.
	RemovePod(ctx context.Context, uid types.UID) error

	// PodStatus returns the runtime's view of the pod, or an error wrapping
	// ErrPodNotFound when the runtime has never seen it (or removed it).
	// The caller owns the returned value.
	PodStatus(ctx context.Context, uid types.UID) (*PodStatus, error)

	// ContainerLogs writes the log of a container of the pod to w. It
	// returns an error wrapping ErrPodNotFound or ErrContainerNotFound
	// when there is no such container (or, with Previous, no previous
	// instance of it), and ErrContainerWaiting when it has not started
	// yet. With Follow it keeps writing until the container
	// instance stops or ctx ends.
	ContainerLogs(ctx context.Context, uid types.UID, container string, opts LogOptions, w io.Writer) error

	// Notify registers fn, called whenever the state of a pod's containers
	// changed on its own (a container started, exited, became ready, or a
	// back-off ended). fn may be called from any goroutine and must not
	// block; the agent calls Notify once, before the first SyncPod.
	Notify(fn func(uid types.UID))
}

// Errors of a Runtime.
var (
	ErrPodNotFound       = errors.New("pod not found in the runtime")
	ErrContainerNotFound = errors.New("container not found")
	// ErrContainerWaiting is returned for the logs of a container that
	// has not started yet.
	ErrContainerWaiting = errors.New("container is waiting to start")
)

// RuntimeInfo describes a runtime and its node.
type RuntimeInfo struct {
	// Name and Version make the node's containerRuntimeVersion,
	// "<name>://<version>" (for example sim://0.1.0).
	Name, Version string
	// Capacity is what the node offers to pods: cpu, memory,
	// ephemeral-storage and optionally pods (110 when absent).
	Capacity corev1.ResourceList
}

// Network is what a runtime needs to give pods their addresses.
type Network struct {
	// HostIPs are the node's addresses; host-network pods use them.
	HostIPs []netip.Addr
	// PodCIDRs are the ranges of the node's pod addresses (Node
	// spec.podCIDRs, assigned by the hub). Empty until the hub assigned
	// them.
	PodCIDRs []netip.Prefix
}

// PodStatus is a runtime's view of a pod.
type PodStatus struct {
	UID types.UID
	// SandboxReady is true once the pod's sandbox exists with its network
	// configured (the PodReadyToStartContainers condition).
	SandboxReady bool
	// SandboxError, when set, says why the sandbox could not be created.
	SandboxError string
	// IPs are the pod's addresses, primary first.
	IPs []netip.Addr
	// InitContainers and Containers list the containers of the spec that
	// the runtime created at least once, in spec order; containers never
	// created are absent.
	InitContainers []ContainerStatus
	Containers     []ContainerStatus
}

// ContainerState is the state of a container instance.
type ContainerState string

// Container states.
const (
	ContainerWaiting ContainerState = "Waiting"
	ContainerRunning ContainerState = "Running"
	ContainerExited  ContainerState = "Exited"
)

// ContainerStatus is the state of the current instance of a container.
type ContainerStatus struct {
	Name string
	// ID is "<runtime>://<id>" of the current instance; empty while none
	// was created.
	ID      string
	Image   string
	ImageID string
	State   ContainerState
	// Reason and Message explain a Waiting or Exited state (for example
	// CrashLoopBackOff and its back-off, or Error).
	Reason, Message string
	ExitCode        int32
	StartedAt       time.Time
	FinishedAt      time.Time
	// RestartCount is how many times the container was restarted.
	RestartCount int32
	// Ready is the runtime's readiness verdict for a running container.
	Ready bool
	// Last is the previous instance's termination, if any.
	Last *ContainerTermination
}

// ContainerTermination describes how a container instance ended.
type ContainerTermination struct {
	ID         string
	ExitCode   int32
	Reason     string
	Message    string
	StartedAt  time.Time
	FinishedAt time.Time
}

// LogOptions select what ContainerLogs writes; they mirror the pods/log
// query parameters.
type LogOptions struct {
	// Follow keeps the stream open while the container runs.
	Follow bool
	// TailLines, when non-negative, writes only the last TailLines lines
	// that exist when the call starts; negative means all.
	TailLines int64
	// LimitBytes, when positive, stops after that many bytes.
	LimitBytes int64
	// Since, when not zero, skips lines logged before it.
	Since time.Time
	// Timestamps prefixes every line with its RFC 3339 time (nanoseconds).
	Timestamps bool
	// Previous reads the previous instance of the container.
	Previous bool
}
