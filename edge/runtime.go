package edge

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	nodemetrics "github.com/tether-edge/tether/edge/metrics"
	"github.com/tether-edge/tether/edge/streaming"
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
	// by one, then the others). Ephemeral containers added to the spec
	// start at the next SyncPod, whatever the others' state, in the pod's
	// sandbox and, with a targetContainerName, in the process namespace
	// of that container. It is idempotent and returns without
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

	// Streamer serves exec, attach and port-forward.
	Streamer
}

// Errors of a Runtime. The node server (edge/streaming) answers them as
// Not Found and Bad Request.
var (
	ErrPodNotFound       = streaming.ErrPodNotFound
	ErrContainerNotFound = streaming.ErrContainerNotFound
	// ErrContainerWaiting is returned for the logs of a container that
	// has not started yet.
	ErrContainerWaiting = streaming.ErrContainerWaiting
)

// ErrPodSandbox is what a SyncPod error made by SandboxFailed is: the
// pod's sandbox could not be created, so its containers wait in
// ContainerCreating, as with the kubelet, and the runtime's
// FailedCreatePodSandBox event says why.
var ErrPodSandbox = errors.New("pod sandbox not created")

// SandboxFailed marks err as the failure to create a pod's sandbox (see
// ErrPodSandbox); err stays in the chain and its message is unchanged.
func SandboxFailed(err error) error { return sandboxFailed{err} }

type sandboxFailed struct{ error }

func (e sandboxFailed) Unwrap() error      { return e.error }
func (sandboxFailed) Is(target error) bool { return target == ErrPodSandbox }

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
	// DataplaneMasquerades says that the node's dataplane gives the pods'
	// connections leaving the node the node's address (eBPF, IPv4 pod
	// ranges only): the runtime's network must not masquerade them too.
	DataplaneMasquerades bool
	// DataplaneHostPorts says that the node's dataplane serves the pods'
	// host ports (the agent gives it each pod's): the runtime's network
	// must not map them too.
	DataplaneHostPorts bool
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
	// EphemeralContainers lists the ephemeral containers of the spec
	// the runtime created (or tried to), in spec order. The runtime
	// starts each once, when it first appears in the spec, and never
	// restarts it.
	EphemeralContainers []ContainerStatus
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
// query parameters (defined by the node server, edge/streaming).
type LogOptions = streaming.LogOptions

// Streams are the standard streams of an exec or attach session
// (streaming.Streams).
type Streams = streaming.Streams

// TermSize is a terminal's size in characters (streaming.TermSize).
type TermSize = streaming.TermSize

// Streamer is what a runtime offers for exec, attach and port-forward
// (streaming.Streamer). Runtimes that cannot do it return ErrNotSupported.
type Streamer = streaming.Streamer

// ErrNotSupported is returned by runtimes for what they cannot do.
var ErrNotSupported = errors.New("not supported by the runtime")

// Sources give a runtime the API objects a pod's volumes and environment
// are made of. The agent passes them to runtimes that implement
// SourceUser, before the first SyncPod.
type Sources interface {
	// ConfigMap and Secret return the object, or an error wrapping
	// ErrSourceNotFound when the hub says it does not exist, or
	// ErrSourceNotReady when the agent does not know yet.
	ConfigMap(namespace, name string) (*corev1.ConfigMap, error)
	Secret(namespace, name string) (*corev1.Secret, error)
	// PersistentVolumeClaim and PersistentVolume return the claims of
	// the node's pods and the volumes bound to them, with the same
	// errors.
	PersistentVolumeClaim(namespace, name string) (*corev1.PersistentVolumeClaim, error)
	PersistentVolume(name string) (*corev1.PersistentVolume, error)
	// ServiceAccountToken asks the hub for a token of the pod's service
	// account bound to the pod.
	ServiceAccountToken(ctx context.Context, pod *corev1.Pod, audience string, expirationSeconds int64) (token string, expires time.Time, err error)
	// ServiceEnv returns the Service environment variables of a
	// container of pod created now (see the package's ServiceEnv), or an
	// error wrapping ErrSourceNotReady while the node has not read the
	// Services once. The container's own env wins over them.
	ServiceEnv(pod *corev1.Pod) (map[string]string, error)
	// RuntimeHandler returns the handler of the RuntimeClass named
	// className, which a pod's spec.runtimeClassName names, or an error
	// wrapping ErrSourceNotFound when there is no such class, or
	// ErrSourceNotReady while the node has not read the classes once.
	RuntimeHandler(className string) (string, error)
}

// Errors of Sources.
var (
	ErrSourceNotFound = errors.New("object not found")
	ErrSourceNotReady = errors.New("object not known yet")
)

// SourceUser is a Runtime that reads ConfigMaps, Secrets, claims and
// service account tokens.
type SourceUser interface {
	SetSources(Sources)
}

// LocalVolumeRemover is a Runtime that keeps the data of tether's
// local-path volumes in directories on the node (see ClaimedVolume). The
// agent calls RemoveLocalVolume once the hub no longer has a volume whose
// reclaim policy was Delete and no pod of the node uses it.
type LocalVolumeRemover interface {
	// RemoveLocalVolume removes the directory of pv, a local-path volume
	// of this node. It refuses (with an error) any path that is not a
	// directory of the runtime's local-path root; a directory that does
	// not exist is not an error.
	RemoveLocalVolume(pv *corev1.PersistentVolume) error
}

// PodEvent is something a runtime did to a pod's container or saw of it,
// reported to users as a Kubernetes Event from the kubelet, the events
// `kubectl describe pod` lists (Pulling, Pulled, Created, Started, Killing,
// Unhealthy, BackOff, Failed, ...).
type PodEvent struct {
	UID             types.UID
	Namespace, Name string
	// Container is the container the event is about; empty for the pod.
	Container string
	// FieldPath names the container within the pod, as
	// "spec.containers{web}" or "spec.initContainers{init}".
	FieldPath string
	// Warning makes it a Warning event; otherwise it is Normal.
	Warning         bool
	Reason, Message string
}

// EventReporter is implemented by runtimes that report events. The agent
// calls ReportEvents once, before the first SyncPod; fn must not block and
// may drop events under load (the agent aggregates and rate-limits them as
// the kubelet does).
type EventReporter interface {
	ReportEvents(fn func(PodEvent))
}

// StatsProvider is a Runtime that measures its node and the running
// containers of its pods. The agent reads it every Config.MetricsPeriod to
// report usage to the hub, and at every scrape of the node server's
// /metrics/resource and /metrics/cadvisor. Runtimes that do not implement
// it report no usage.
type StatsProvider interface {
	// Stats reads, now, the cumulative CPU time and the memory of the
	// node and of every running container of the runtime's pods (not
	// the pods' sandboxes). A container appears once it started and
	// until it stopped; its CPU counter starts from zero with every new
	// instance (a new ID). The caller owns the returned value.
	Stats(ctx context.Context) (nodemetrics.Snapshot, error)
}
