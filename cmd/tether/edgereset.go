package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/containerd"
	"github.com/tether-edge/tether/internal/dirlock"
)

func newEdgeResetCmd() *cobra.Command {
	var (
		dataDir, runtime, containerdAddr string
		ctrdCfg                          containerd.Config
		cfg                              edge.ResetConfig
		purge                            bool
		logLevel                         string
	)
	cmd := &cobra.Command{
		Use:   "reset --data-dir DIR",
		Short: "Remove what the edge agent put on this node",
		Long: `Remove what the edge agent put on this node, once the agent is stopped:
its pods (containers, network namespaces and addresses, pod directories and
logs), the pod bridge, the containerd it started, the eBPF dataplane
(Services stop being load-balanced here) and the DNS interface. Images stay
in containerd's store; a containerd the node runs for itself stays running.
With --purge the data directory goes too, the node's key and certificate
with it: the node must join again with a token.

Use the same flags as the agent where it ran with other than their defaults;
the containerd socket is found in the data directory, where the agent
records the one it used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			if dataDir == "" {
				return errors.New("--data-dir is required")
			}
			unlock, err := lockDataDir(dataDir)
			if err != nil {
				return err
			}
			defer unlock()
			cfg.Logger = logger
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			var errs []error
			switch runtime {
			case "containerd":
				// The agent records the containerd it used; a flag given
				// here wins.
				if rec, ok := containerd.RecordedAddress(dataDir); ok && !cmd.Flags().Changed("containerd-address") {
					containerdAddr = rec
				}
				ctrdCfg.DataDir, ctrdCfg.Address, ctrdCfg.Logger = dataDir, containerdAddr, logger
				ctrdCfg.SkipImport, ctrdCfg.ImageGCHighThresholdPercent = true, 101
				rt, err := containerd.New(ctx, ctrdCfg)
				if err != nil {
					errs = append(errs, err)
				} else {
					cfg.Runtime = rt
				}
			case "sim":
			default:
				return fmt.Errorf("unknown --runtime %q: want containerd or sim", runtime)
			}
			cfg.Dataplane = os.Geteuid() == 0
			if purge {
				cfg.DataDir = dataDir
			}
			if err := edge.Reset(ctx, cfg); err != nil {
				errs = append(errs, err)
			}
			return errors.Join(errs...)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "", "the agent's data directory (required)")
	f.StringVar(&runtime, "runtime", "containerd", "the agent's container runtime: containerd or sim (nothing to remove)")
	f.StringVar(&containerdAddr, "containerd-address", defaultContainerdAddress, "the agent's containerd socket (default: the one the agent recorded in --data-dir, else this)")
	f.StringVar(&ctrdCfg.Bridge, "pod-bridge", "tether0", "bridge of the generated pod network")
	f.StringVar(&ctrdCfg.CNIConfDir, "cni-conf-dir", "", "the agent's --cni-conf-dir: with one, the bridge is the user's and stays")
	f.StringSliceVar(&ctrdCfg.CNIBinDirs, "cni-bin-dir", nil, "directories of CNI plugins (default /usr/lib/cni,/opt/cni/bin)")
	f.StringVar(&cfg.DataplaneCgroup, "dataplane-cgroup", "", "the agent's --dataplane-cgroup (default: the cgroup v2 root)")
	f.StringVar(&cfg.DataplaneBPFFS, "bpf-pin-dir", "", "the agent's --bpf-pin-dir (default /sys/fs/bpf/tether)")
	f.StringVar(&cfg.DNSInterface, "dns-interface", edge.DefaultDNSInterface, "the agent's --dns-interface; empty: none")
	f.BoolVar(&purge, "purge", false, "also remove the data directory: the node's identity and local state")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// lockDataDir takes the lock of an agent's data directory: one agent runs
// on a data directory at a time, and reset waits for none. The lock goes
// with the process, however it ends.
func lockDataDir(dir string) (unlock func(), err error) {
	l, err := dirlock.Acquire(dir, "agent.lock")
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("an agent runs on %s (%s): stop it first", dir, held.Holder())
	}
	if err != nil {
		return nil, err
	}
	return func() { _ = l.Release() }, nil
}
