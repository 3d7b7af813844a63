package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
)

// netnsDir is where named network namespaces live (iproute2's place, so
// `ip netns` shows them).
const netnsDir = "/var/run/netns"

// network sets up pods' network namespaces through CNI.
type network struct {
	cni      *libcni.CNIConfig
	confDir  string // user's conflists; empty means the generated one
	genDir   string // where the generated conflist goes
	ipamDir  string
	bridge   string
	mtu      int
	conflist *libcni.NetworkConfigList
	cidrs    []netip.Prefix
	masq     bool // the generated conflist masquerades (ipMasq)
	portmap  bool // the generated conflist maps host ports (portmap)
}

func newNetwork(cfg *Config, stateDir string) *network {
	return &network{
		cni:     libcni.NewCNIConfigWithCacheDir(cfg.CNIBinDirs, filepath.Join(stateDir, "cni", "cache"), nil),
		confDir: cfg.CNIConfDir,
		genDir:  filepath.Join(stateDir, "cni", "net.d"),
		ipamDir: filepath.Join(stateDir, "cni", "ipam"),
		bridge:  cfg.Bridge,
		mtu:     cfg.MTU,
	}
}

// load returns the conflist for the node's pod ranges: the user's first
// conflist when CNIConfDir has one, else one generated for net.
func (n *network) load(net edge.Network) (*libcni.NetworkConfigList, error) {
	cidrs := net.PodCIDRs
	if n.confDir != "" {
		if n.conflist != nil {
			return n.conflist, nil
		}
		files, err := libcni.ConfFiles(n.confDir, []string{".conflist"})
		if err != nil || len(files) == 0 {
			return nil, fmt.Errorf("load CNI configuration from %s: no .conflist file (%v)", n.confDir, err)
		}
		sort.Strings(files)
		l, err := libcni.ConfListFromFile(files[0])
		if err != nil {
			return nil, fmt.Errorf("load CNI configuration %s: %w", files[0], err)
		}
		n.conflist = l
		return l, nil
	}
	if len(cidrs) == 0 {
		return nil, fmt.Errorf("the node has no pod CIDR yet")
	}
	_, iptErr := exec.LookPath("iptables")
	masq := iptErr == nil && !net.DataplaneMasquerades
	portmap := iptErr == nil && !net.DataplaneHostPorts
	if n.conflist != nil && equalPrefixes(n.cidrs, cidrs) && n.masq == masq && n.portmap == portmap {
		return n.conflist, nil
	}
	b := generatedConflist(n.bridge, n.ipamDir, n.mtu, cidrs, masq, portmap)
	if err := os.MkdirAll(n.genDir, 0o755); err != nil {
		return nil, fmt.Errorf("write CNI configuration: %w", err)
	}
	if err := os.WriteFile(filepath.Join(n.genDir, "10-tether.conflist"), b, 0o644); err != nil {
		return nil, fmt.Errorf("write CNI configuration: %w", err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return nil, fmt.Errorf("parse generated CNI configuration: %w", err)
	}
	n.conflist, n.cidrs, n.masq, n.portmap = l, cidrs, masq, portmap
	return l, nil
}

func equalPrefixes(a, b []netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// generatedConflist is bridge + host-local over the node's pod ranges,
// loopback, and portmap for hostPorts when portmap says so. The bridge
// masquerades the pods' connections with iptables when masq says so;
// where the eBPF dataplane does it, or without iptables, it does not (and
// without either, pods still reach the node and each other). Host ports
// are likewise the eBPF dataplane's where it runs, portmap's (iptables)
// elsewhere; without both, a pod's hostPort is not mapped.
func generatedConflist(bridge, ipamDir string, mtu int, cidrs []netip.Prefix, masq, portmap bool) []byte {
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, c := range cidrs {
		ranges = append(ranges, []map[string]string{{"subnet": c.Masked().String()}})
		if c.Addr().Is4() {
			routes = append(routes, map[string]string{"dst": "0.0.0.0/0"})
		} else {
			routes = append(routes, map[string]string{"dst": "::/0"})
		}
	}
	br := map[string]any{
		"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": masq,
		"hairpinMode": true,
		"ipam":        map[string]any{"type": "host-local", "ranges": ranges, "routes": routes, "dataDir": ipamDir},
	}
	if mtu > 0 {
		br["mtu"] = mtu
	}
	plugins := []any{br, map[string]any{"type": "loopback"}}
	if portmap {
		plugins = append(plugins, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true})
	}
	b, _ := json.MarshalIndent(map[string]any{"cniVersion": "1.0.0", "name": "tether", "plugins": plugins}, "", "  ")
	return b
}

// newNetns creates the named network namespace. It runs on a thread of
// its own that is never reused: the thread enters the new namespace.
func newNetns(name string) (string, error) {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread dies with the goroutine, so no
		// other goroutine ever runs in the pod's namespace.
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return "", fmt.Errorf("create network namespace %s: %w", name, err)
	}
	return filepath.Join(netnsDir, name), nil
}

func deleteNetns(name string) error {
	if err := netns.DeleteNamed(name); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}

// runtimeConf is the CNI runtime configuration of a pod.
func runtimeConf(pod *corev1.Pod, nsPath string) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: string(pod.UID),
		NetNS:       nsPath,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", string(pod.UID)},
			{"K8S_POD_UID", string(pod.UID)},
		},
	}
	var ports []map[string]any
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort == 0 {
				continue
			}
			proto := strings.ToLower(string(p.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			ports = append(ports, map[string]any{"hostPort": p.HostPort, "containerPort": p.ContainerPort, "protocol": proto, "hostIP": p.HostIP})
		}
	}
	if len(ports) > 0 {
		rt.CapabilityArgs = map[string]any{"portMappings": ports}
	}
	return rt
}

// setUp creates the pod's network namespace and runs CNI ADD in it.
func (n *network) setUp(ctx context.Context, pod *corev1.Pod, net edge.Network) (nsPath string, ips []netip.Addr, err error) {
	list, err := n.load(net)
	if err != nil {
		return "", nil, err
	}
	name := netnsName(pod.UID)
	// What an earlier sandbox of the pod left goes first, through the
	// plugins: a namespace of an interrupted attempt (DEL in it also
	// removes the NAT rules the bridge plugin made for its address, which
	// would otherwise keep the pod's chain referenced and make every later
	// DEL fail), or, after a reboot, the address the IPAM state on disk
	// still holds under the same container ID, which host-local refuses
	// to allocate twice.
	prevNS := filepath.Join(netnsDir, name)
	_, statErr := os.Stat(prevNS)
	prev, _ := n.cni.GetNetworkListCachedResult(list, runtimeConf(pod, ""))
	if statErr == nil || prev != nil {
		rt := runtimeConf(pod, prevNS)
		if statErr != nil {
			rt.NetNS = ""
		}
		if err := n.del(ctx, n.addedWith(list, rt), rt); err != nil {
			return "", nil, fmt.Errorf("release the previous pod network (CNI %s): %w", list.Name, err)
		}
	}
	_ = deleteNetns(name)
	nsPath, err = newNetns(name)
	if err != nil {
		return "", nil, err
	}
	res, err := n.cni.AddNetworkList(ctx, list, runtimeConf(pod, nsPath))
	if err != nil {
		_ = n.del(ctx, list, runtimeConf(pod, nsPath))
		_ = deleteNetns(name)
		return "", nil, fmt.Errorf("set up pod network (CNI %s): %w", list.Name, err)
	}
	ips, err = resultIPs(res)
	if err != nil {
		return "", nil, err
	}
	return nsPath, ips, nil
}

func resultIPs(res cnitypes.Result) ([]netip.Addr, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("read CNI result: %w", err)
	}
	var ips []netip.Addr
	for _, ip := range r.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			ips = append(ips, a.Unmap())
		}
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("CNI gave the pod no address")
	}
	return ips, nil
}

// tearDown runs CNI DEL and deletes the namespace; both are idempotent.
func (n *network) tearDown(ctx context.Context, pod *corev1.Pod) error {
	name := netnsName(pod.UID)
	nsPath := filepath.Join(netnsDir, name)
	list := n.conflist
	if list == nil {
		// After an agent restart: the configuration the pod was set up
		// with is the one on disk.
		dir := n.confDir
		if dir == "" {
			dir = n.genDir
		}
		if files, _ := libcni.ConfFiles(dir, []string{".conflist"}); len(files) > 0 {
			sort.Strings(files)
			list, _ = libcni.ConfListFromFile(files[0])
		}
	}
	var delErr error
	if list != nil {
		rt := runtimeConf(pod, nsPath)
		if _, err := os.Stat(nsPath); err != nil {
			rt.NetNS = "" // plugins release the address without a namespace
		}
		if err := n.del(ctx, n.addedWith(list, rt), rt); err != nil {
			delErr = fmt.Errorf("tear down pod network: %w", err)
		}
	}
	// The namespace goes even when a plugin failed: its containers are
	// gone, and a plugin that fails the same way every time (the bridge
	// plugin when a NAT chain of an earlier sandbox of the pod is still
	// referenced) would otherwise keep it forever. The caller's retry
	// then runs DEL without a namespace, which releases the address.
	return errors.Join(delErr, deleteNetns(name))
}

// addedWith returns the configuration a pod's network was set up with,
// which libcni cached at ADD, else list. A pod's network is released with
// the plugins and settings that made it: a pod set up while the bridge
// masqueraded with iptables leaves NAT rules that only a DEL with ipMasq
// removes, whatever the configuration is now.
func (n *network) addedWith(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *libcni.NetworkConfigList {
	b, _, err := n.cni.GetNetworkListCachedConfig(list, rt)
	if err != nil || len(b) == 0 {
		return list
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return list
	}
	return l
}

// cniDelTimeout bounds one CNI DEL.
const cniDelTimeout = 30 * time.Second

// del runs CNI DEL to the end even when ctx is cancelled (the agent
// stopping): a plugin killed halfway leaves what it had not yet removed,
// such as NAT rules, with nothing to find them by afterwards.
func (n *network) del(ctx context.Context, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cniDelTimeout)
	defer cancel()
	return n.cni.DelNetworkList(ctx, list, rt)
}

func netnsName(uid types.UID) string { return "tether-" + string(uid) }
