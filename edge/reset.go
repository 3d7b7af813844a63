package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/tether-edge/tether/dataplane"
)

// ResetConfig says what Reset removes from a node. The zero value of each
// field removes nothing of that kind.
type ResetConfig struct {
	// Runtime removes the node's pods and containers and stops what the
	// agent started to run them (the containerd runtime's Reset).
	Runtime interface{ Reset(context.Context) error }
	// Dataplane uninstalls the eBPF dataplane pinned under
	// DataplaneBPFFS (empty: /sys/fs/bpf/tether) and attached to
	// DataplaneCgroup (empty: the cgroup v2 root): Services stop being
	// load-balanced, and the tc programs leave the uplinks.
	Dataplane                       bool
	DataplaneCgroup, DataplaneBPFFS string
	// DNSInterface is deleted when it holds the agent's DNS address.
	DNSInterface string
	// DataDir, when set, is removed whole: the node's key and
	// certificate, its local state and the runtime's directories. The
	// node must then join again with a token.
	DataDir string
	// Logger receives a line per step; nil discards them.
	Logger *slog.Logger
}

// Reset removes what an agent put on the node, for `tether edge reset`:
// the agent must not be running. It goes on past a step that fails and
// returns every failure.
func Reset(ctx context.Context, cfg ResetConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var errs []error
	if cfg.Runtime != nil {
		if err := cfg.Runtime.Reset(ctx); err != nil {
			errs = append(errs, fmt.Errorf("reset the runtime: %w", err))
		} else {
			log.Info("removed the node's pods and stopped the runtime the agent started")
		}
	}
	if cfg.Dataplane {
		if err := resetDataplane(cfg.DataplaneCgroup, cfg.DataplaneBPFFS, log); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.DNSInterface != "" {
		if l, err := netlink.LinkByName(cfg.DNSInterface); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete interface %s: %w", cfg.DNSInterface, err))
			} else {
				log.Info("deleted the DNS interface", "interface", cfg.DNSInterface)
			}
		}
	}
	if cfg.DataDir != "" {
		if err := os.RemoveAll(cfg.DataDir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", cfg.DataDir, err))
		} else {
			log.Info("removed the data directory", "dir", cfg.DataDir)
		}
	}
	return errors.Join(errs...)
}

// resetDataplane adopts the pinned dataplane to uninstall it (detaching
// its programs, removing the tc filters of the uplinks), then removes
// whatever is left under the pin directory: unpinned, a link detaches.
func resetDataplane(cgroup, bpffs string, log *slog.Logger) error {
	if bpffs == "" {
		bpffs = dataplane.DefaultBPFFSPath
	}
	if _, err := os.Stat(bpffs); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	dp, err := dataplane.New(dataplane.Config{CgroupPath: cgroup, BPFFSPath: bpffs, Logger: log})
	if err == nil {
		err = dp.Uninstall()
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("uninstall the dataplane: %w", err))
	}
	if err := os.RemoveAll(bpffs); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", filepath.Clean(bpffs), err))
	}
	if len(errs) == 0 {
		log.Info("uninstalled the dataplane", "pins", bpffs)
	}
	return errors.Join(errs...)
}
