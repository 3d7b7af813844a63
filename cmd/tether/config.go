package main

import (
	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/deploy"
)

// withConfigFile gives a role's command the --config flag: the command's
// flags are read from that YAML file (one key per flag, without the
// dashes), flags given on the command line win. Without --config the
// role's /etc/tether/ROLE.yaml is read when it exists.
func withConfigFile(cmd *cobra.Command, role deploy.Role) *cobra.Command {
	def := deploy.DefaultConfigFile(role)
	var path string
	cmd.Flags().StringVar(&path, "config", def, "YAML file setting this command's flags, one key per flag name (e.g. data-dir: /var/lib/tether/"+string(role)+"); flags given here win; read only when it exists unless given; none: no file")
	prev := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if path != "none" && path != "" {
			opts := deploy.ConfigOptions{Optional: !cmd.Flags().Changed("config") && path == def}
			if err := deploy.LoadConfig(cmd.Flags(), path, opts); err != nil {
				return err
			}
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
	return cmd
}
