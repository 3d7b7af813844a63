package testbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Faults of one node, as opposed to its site's uplink: its own way to the
// hub cut while its LAN stays up, and a power cut.

// cutTable is the nftables table that cuts a node off from everything
// outside its site's LAN. It lives in the node's namespace, so deleting
// the namespace (Close, Sweep) removes it with everything else of the
// node; the state file records the namespace before the table exists.
const cutTable = "tether_lab_cut"

// nodeSite returns the site of a node host.
func (l *Lab) nodeSite(node string) (*Host, *site, error) {
	for _, s := range l.sites {
		for _, n := range s.nodes {
			if n.Name == node {
				return n, s, nil
			}
		}
	}
	return nil, nil, fmt.Errorf("no node %q", node)
}

// CutNodeUplink cuts one node's way to the hub (and to anything else
// outside its site's LAN) while its LAN to the site's other nodes stays
// up: nftables in the node's namespace drop every packet on eth0 to or
// from an address outside the LAN, existing flows included. Traffic to
// and from the router's LAN address passes, as do the node's own
// loopback and dummy interfaces. It takes effect before it returns.
func (l *Lab) CutNodeUplink(ctx context.Context, node string) error {
	h, s, err := l.nodeSite(node)
	if err != nil {
		return fmt.Errorf("cut node uplink: %w", err)
	}
	lan := fmt.Sprintf("10.213.%d.0/24", 100+s.num)
	rules := fmt.Sprintf(`table ip %[1]s
delete table ip %[1]s
table ip %[1]s {
	chain in {
		type filter hook input priority filter - 10; policy accept;
		iifname "eth0" ip saddr != %[2]s drop
	}
	chain out {
		type filter hook output priority filter - 10; policy accept;
		oifname "eth0" ip daddr != %[2]s drop
	}
}
`, cutTable, lan)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", h.Netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cut node uplink of %s: %w: %s", node, err, strings.TrimSpace(string(out)))
	}
	l.log.Info("node uplink cut", "node", node, "lan", lan)
	return nil
}

// RestoreNodeUplink undoes CutNodeUplink; restoring a node that is not
// cut is not an error.
func (l *Lab) RestoreNodeUplink(ctx context.Context, node string) error {
	h, _, err := l.nodeSite(node)
	if err != nil {
		return fmt.Errorf("restore node uplink: %w", err)
	}
	// Declaring the table first makes the delete succeed when it is absent.
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", h.Netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(fmt.Sprintf("table ip %[1]s\ndelete table ip %[1]s\n", cutTable))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("restore node uplink of %s: %w: %s", node, err, strings.TrimSpace(string(out)))
	}
	l.log.Info("node uplink restored", "node", node)
	return nil
}

// NodeUplinkCut reports whether CutNodeUplink is in force on node.
func (l *Lab) NodeUplinkCut(ctx context.Context, node string) (bool, error) {
	h, _, err := l.nodeSite(node)
	if err != nil {
		return false, fmt.Errorf("get node uplink: %w", err)
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", h.Netns, "nft", "list", "tables", "ip").CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("list tables of %s: %w: %s", node, err, strings.TrimSpace(string(out)))
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == "table ip "+cutTable {
			return true, nil
		}
	}
	return false, nil
}

// PowerOff cuts a node's power: every process in its network namespace
// (its agent, the processes of its pods, anything started there) gets
// SIGKILL at once, without a chance to say goodbye. Processes first get
// SIGSTOP, all of them, so that none sees another die and reacts; then
// SIGKILL. It returns the PIDs it killed once they are gone. The node's
// data dir, address and routes stay, as a disk does; start the agent
// again (Process.Restart) to power the node back on.
func (l *Lab) PowerOff(ctx context.Context, node string) ([]int, error) {
	h, _, err := l.nodeSite(node)
	if err != nil {
		return nil, fmt.Errorf("power off: %w", err)
	}
	var killed []int
	seen := map[int]bool{}
	// Processes may fork while we look; repeat until a pass finds none.
	for pass := 0; ; pass++ {
		pids, err := pidsInNetns(nsPath(h.Netns))
		if err != nil {
			return killed, fmt.Errorf("power off %s: %w", node, err)
		}
		var fresh []int
		for _, p := range pids {
			if !seen[p] {
				fresh = append(fresh, p)
			}
		}
		if len(fresh) == 0 {
			break
		}
		if pass > 50 {
			return killed, fmt.Errorf("power off %s: processes keep appearing: %v", node, fresh)
		}
		for _, p := range fresh {
			syscall.Kill(p, syscall.SIGSTOP)
		}
		for _, p := range fresh {
			seen[p] = true
			if syscall.Kill(p, syscall.SIGKILL) == nil {
				killed = append(killed, p)
			}
		}
	}
	for {
		pids, err := pidsInNetns(nsPath(h.Netns))
		if err != nil {
			return killed, fmt.Errorf("power off %s: %w", node, err)
		}
		if len(pids) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return killed, fmt.Errorf("power off %s: processes %v still there: %w", node, pids, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	l.log.Info("node powered off", "node", node, "killed", killed)
	return killed, nil
}

// pidsInNetns returns the live processes (not zombies, not this one) whose
// network namespace is the one at path.
func pidsInNetns(path string) ([]int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		return nil, fmt.Errorf("stat netns: %w", err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st syscall.Stat_t
		// A process that exited meanwhile, or a kernel thread, has no
		// readable namespace: it is not the node's.
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) != nil {
			continue
		}
		if st.Dev == want.Dev && st.Ino == want.Ino && alive(pid, procStart(pid)) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
