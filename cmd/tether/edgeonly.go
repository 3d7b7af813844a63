//go:build edge

package main

import (
	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/edge"
)

// kubernetesVersion is the Kubernetes version the agent reports.
const kubernetesVersion = edge.KubernetesVersion

// commands are the subcommands of the edge-only binary: the agent's and
// the installer's (of the agent only).
func commands() []*cobra.Command {
	return []*cobra.Command{newEdgeCmd(), newInstallCmd(), newUninstallCmd()}
}
