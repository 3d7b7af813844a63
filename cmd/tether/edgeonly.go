//go:build edge

package main

import (
	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// kubernetesVersion is the Kubernetes version the agent reports.
const kubernetesVersion = edge.KubernetesVersion

// commands are the subcommands of the edge-only binary: the agent's and
// the installer's (of the agent only).
func commands() []*cobra.Command {
	return []*cobra.Command{newEdgeCmd(), newInstallCmd(), newUninstallCmd()}
}

// build is the build of tether this executable is, which the agent
// labels its Node with so that rollouts ask it for the same build.
const build = fleetapi.BuildEdge
