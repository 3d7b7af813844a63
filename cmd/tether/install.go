package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tether-edge/tether/deploy"
)

func newInstallCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "install ROLE",
		Short: "Install the hub or the edge agent as a systemd service on this machine",
		Long: `Install a role of tether as a systemd service, as root: the binary (a copy
of the running one), the config file /etc/tether/ROLE.yaml with the flags
given (every flag of 'tether ROLE' may be given), and the unit
tether-ROLE.service, enabled and started. Running it again with the same
flags changes nothing and restarts nothing; with other flags it rewrites
the config file and restarts the service. Nothing is fetched from the
network: it works from an unpacked release tarball on an air-gapped
machine. 'tether uninstall' reverses it.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(installHubCmds()...)
	cmd.AddCommand(newInstallRoleCmd(deploy.Edge, newEdgeCmd(),
		"edge --hub https://HOST:6443 --token TOKEN [tether edge flags]",
		"Install the edge agent: join the hub as a service of this machine"))
	return cmd
}

// installOpts are the flags of install and uninstall themselves.
type installOpts struct {
	root, systemctl, binary string
}

func (o *installOpts) flags(f *pflag.FlagSet, withBinary bool) {
	f.StringVar(&o.root, "root", "", "install under this directory instead of /: every path written, and every path the written files name, is under it (images, tests)")
	f.StringVar(&o.systemctl, "systemctl", "systemctl", "program run with systemctl's arguments to manage the unit")
	if withBinary {
		f.StringVar(&o.binary, "binary", "", "executable to install (default: this one)")
	}
}

func (o *installOpts) check() error {
	if o.root == "" && os.Geteuid() != 0 {
		return errors.New("installing on this machine needs root (or --root DIR)")
	}
	return nil
}

// newInstallRoleCmd is `tether install ROLE`: its flags are the role
// command's own (all of them), which go to the config file, and the
// installation's.
func newInstallRoleCmd(role deploy.Role, roleCmd *cobra.Command, use, short string) *cobra.Command {
	var (
		opts   installOpts
		config string
	)
	roleFlags := roleCmd.Flags()
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.check(); err != nil {
				return err
			}
			if config != "" {
				if err := deploy.LoadConfig(roleFlags, config, deploy.ConfigOptions{}); err != nil {
					return err
				}
			}
			if role == deploy.Edge && (!roleFlags.Changed("hub") || !roleFlags.Changed("token")) {
				return errors.New("tether install edge needs --hub https://HOST:PORT and --token TOKEN (from `tether token create` on the hub), or hub and token in --config")
			}
			l := deploy.Layout{Root: opts.root}
			if !roleFlags.Changed("data-dir") {
				if err := roleFlags.Set("data-dir", l.DataDir(role)); err != nil {
					return err
				}
			}
			settings, err := deploy.RenderConfig(roleFlags,
				fmt.Sprintf("Settings of `tether %s`, one key per flag; written by `tether install %s`.", role, role), nil)
			if err != nil {
				return err
			}
			bin := opts.binary
			if bin == "" {
				if bin, err = os.Executable(); err != nil {
					return fmt.Errorf("find the running executable: %w", err)
				}
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			out := cmd.OutOrStdout()
			res, err := deploy.Install(ctx, deploy.Config{
				Role: role, Layout: l, Binary: bin, Settings: settings,
				Systemctl: opts.systemctl, Out: out,
			})
			if err != nil {
				return err
			}
			switch {
			case res.Fresh:
				fmt.Fprintf(out, "\n%s is installed and started.\n", deploy.UnitName(role))
			case res.Restarted:
				fmt.Fprintf(out, "\n%s is updated and restarted.\n", deploy.UnitName(role))
			default:
				fmt.Fprintf(out, "\n%s was installed already as asked: nothing changed.\n", deploy.UnitName(role))
			}
			nextSteps(out, role, l, roleFlags)
			return nil
		},
	}
	f := cmd.Flags()
	opts.flags(f, true)
	f.StringVar(&config, "config", "", "YAML file of `tether "+string(role)+"` settings to start from (one key per flag); flags given here win")
	// The role's flags themselves, shared with roleCmd's flag set (which
	// is rendered), not required here: the config file may give them, and
	// the data directory has a default.
	roleFlags.VisitAll(func(fl *pflag.Flag) {
		if !deploy.ConfigKeyExcluded(fl.Name) {
			delete(fl.Annotations, cobra.BashCompOneRequiredFlag)
			f.AddFlag(fl)
		}
	})
	return cmd
}

// nextSteps tells the user what to do once a role is installed.
func nextSteps(out io.Writer, role deploy.Role, l deploy.Layout, f *pflag.FlagSet) {
	dataDir, _ := f.GetString("data-dir")
	fmt.Fprintf(out, "Settings: %s (flags of `tether %s`; run the install again to change them)\n", l.ConfigFile(role), role)
	fmt.Fprintf(out, "Logs:     journalctl -u %s\n", deploy.UnitName(role))
	switch role {
	case deploy.Hub:
		listen, _ := f.GetString("listen")
		fmt.Fprintf(out, `Next:
  The cluster-admin kubeconfig is written once the hub serves:
    export KUBECONFIG=%s/admin.kubeconfig
    kubectl get --raw /readyz
  Make a join token for edges:
    %s token create --data-dir %s
  On each edge, from the release tarball (the hub's API is at %s):
    ./tether-edge install edge --hub https://HUB:PORT --token TOKEN
`, dataDir, l.Binary(role), dataDir, listen)
	case deploy.Edge:
		hub, _ := f.GetString("hub")
		name, _ := f.GetString("name")
		if name == "" {
			name, _ = os.Hostname()
		}
		fmt.Fprintf(out, `Next:
  The agent joins %s and registers node %s. On the hub:
    kubectl get node %s     (Ready within a minute)
`, hub, name, name)
	}
	fmt.Fprintf(out, "Remove with: %s uninstall %s\n", l.Binary(role), role)
}

func newUninstallCmd() *cobra.Command {
	var (
		opts     installOpts
		keepData bool
	)
	cmd := &cobra.Command{
		Use:   "uninstall [hub|edge]...",
		Short: "Remove what `tether install` put on this machine",
		Long: `Stop and disable the services 'tether install' set up (both roles, or
those named), remove their units, config files and binaries, and their
data: for the edge through 'tether edge reset --purge' with the agent's
settings (pods, pod network, dataplane, the node's identity), for the hub
its data directory (the cluster's store). With --keep-data the data
directories stay. Roles not installed are skipped.`,
		ValidArgs: []string{string(deploy.Hub), string(deploy.Edge)},
		Args:      cobra.OnlyValidArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := opts.check(); err != nil {
				return err
			}
			var rs []deploy.Role
			for _, a := range args {
				rs = append(rs, deploy.Role(a))
			}
			l := deploy.Layout{Root: opts.root}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			out := cmd.OutOrStdout()
			removed, err := deploy.Uninstall(ctx, deploy.UninstallConfig{
				Layout: l, Roles: rs, Systemctl: opts.systemctl, KeepData: keepData, Out: out,
				ResetEdge: func(ctx context.Context, configFile string, keepData bool) error {
					return resetInstalledEdge(ctx, configFile, l.DataDir(deploy.Edge), keepData)
				},
			})
			if err != nil {
				return err
			}
			if len(removed) == 0 {
				fmt.Fprintln(out, "nothing installed: nothing to remove")
			}
			for _, r := range removed {
				fmt.Fprintf(out, "uninstalled %s\n", deploy.UnitName(r))
			}
			return nil
		},
	}
	opts.flags(cmd.Flags(), false)
	cmd.Flags().BoolVar(&keepData, "keep-data", false, "keep the data directories (the hub's store, the node's identity and local state)")
	return cmd
}

// resetInstalledEdge runs `tether edge reset` on an installed agent with
// the settings of its config file that reset takes (data directory,
// runtime, containerd, pod network, dataplane, DNS interface).
func resetInstalledEdge(ctx context.Context, configFile, defDataDir string, keepData bool) error {
	reset := newEdgeResetCmd()
	f := reset.Flags()
	if err := deploy.LoadConfig(f, configFile, deploy.ConfigOptions{Optional: true, IgnoreUnknown: true}); err != nil {
		return err
	}
	if !f.Changed("data-dir") {
		if err := f.Set("data-dir", defDataDir); err != nil {
			return err
		}
	}
	if !keepData {
		if err := f.Set("purge", "true"); err != nil {
			return err
		}
	}
	reset.SetArgs([]string{})
	return reset.ExecuteContext(ctx)
}
