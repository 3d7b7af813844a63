//go:build !edge

package main

import (
	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/deploy"
)

// installHubCmds is `tether install hub`, in the full build only.
func installHubCmds() []*cobra.Command {
	return []*cobra.Command{newInstallRoleCmd(deploy.Hub, newHubCmd(),
		"hub [tether hub flags]", "Install the hub as a service of this machine")}
}
