package sim

import (
	"context"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
)

// Exec implements edge.Runtime: simulated containers have no processes.
func (r *Runtime) Exec(context.Context, types.UID, string, []string, edge.Streams) (int, error) {
	return 0, fmt.Errorf("exec: %w: the sim runtime has no processes", edge.ErrNotSupported)
}

// Attach implements edge.Runtime.
func (r *Runtime) Attach(context.Context, types.UID, string, edge.Streams) error {
	return fmt.Errorf("attach: %w: the sim runtime has no processes", edge.ErrNotSupported)
}

// PortForward implements edge.Runtime.
func (r *Runtime) PortForward(context.Context, types.UID, int32, io.ReadWriteCloser) error {
	return fmt.Errorf("port-forward: %w: the sim runtime has no network", edge.ErrNotSupported)
}
