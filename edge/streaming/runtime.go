package streaming

import (
	"context"
	"errors"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Runtime is what the node server asks of the node's container runtime:
// container logs and the sessions of the Streamer. edge.Runtime includes
// it.
type Runtime interface {
	// ContainerLogs writes the log of a container of the pod to w. It
	// returns an error wrapping ErrPodNotFound or ErrContainerNotFound
	// when there is no such container (or, with Previous, no previous
	// instance of it), and ErrContainerWaiting when it has not started
	// yet. With Follow it keeps writing until the container
	// instance stops or ctx ends.
	ContainerLogs(ctx context.Context, uid types.UID, container string, opts LogOptions, w io.Writer) error

	Streamer
}

// Errors of a Runtime, which the node server answers with 404 Not Found
// (no such pod or container) and 400 Bad Request (not started yet).
var (
	ErrPodNotFound       = errors.New("pod not found in the runtime")
	ErrContainerNotFound = errors.New("container not found")
	// ErrContainerWaiting is returned for the logs of a container that
	// has not started yet.
	ErrContainerWaiting = errors.New("container is waiting to start")
)

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

// Streams are the standard streams of an exec or attach session; a nil
// stream is not connected.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// TTY gives the process a terminal: Stderr is unused and Resize
	// carries the client's terminal sizes.
	TTY    bool
	Resize <-chan TermSize
}

// TermSize is a terminal's size in characters.
type TermSize struct {
	Width, Height uint16
}

// Streamer is what a runtime offers for exec, attach and port-forward.
// Runtimes that cannot do it return an error saying so (edge's
// ErrNotSupported).
type Streamer interface {
	// Exec runs cmd in a running container of the pod and returns its
	// exit code once it exited and its output was written.
	Exec(ctx context.Context, uid types.UID, container string, cmd []string, s Streams) (exitCode int, err error)
	// Attach connects s to the main process of a running container
	// until ctx ends or the process exits.
	Attach(ctx context.Context, uid types.UID, container string, s Streams) error
	// PortForward connects conn to port on the pod's loopback (its
	// network namespace) and copies both ways until either side closes.
	PortForward(ctx context.Context, uid types.UID, port int32, conn io.ReadWriteCloser) error
}
