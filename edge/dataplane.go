package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/dataplane"
	"github.com/tether-edge/tether/dataplane/dns"
)

// The node's Service data plane and DNS server are fed from the agent's
// Service and EndpointSlice informers. Both keep what they were given when
// the hub is out of reach: the informers keep their stores while their
// watches fail, the dataplane's maps are pinned in bpffs, and the DNS server
// answers from memory.

// serviceSink receives Service and EndpointSlice changes; the eBPF
// dataplane and the DNS server are the agent's sinks.
type serviceSink = dataplane.Observer

// dataplaneResync is how often changes the dataplane could not apply are
// retried after the first full Sync.
const dataplaneResync = 30 * time.Second

// nodeNet is the agent's part of the node network: the eBPF dataplane (nil
// when the node runs none) and the DNS server (nil when off).
type nodeNet struct {
	dp        *dataplane.Dataplane
	hostPorts *hostPortFeed // the pods' host ports, fed to dp (hostports.go)
	uplinks   []string      // the dataplane's uplinks: where it can masquerade
	masqMu    sync.Mutex
	masq      netip.Prefix // the pod range the dataplane masquerades
	dns       *dns.Server
	dnsConn   net.PacketConn
	dnsLn     net.Listener
	synced    atomic.Bool // the dataplane's first full Sync succeeded

	dnsQueries, dnsForwarded, dnsFailures atomic.Int64
}

// startNodeNet loads the dataplane (probing the kernel first) and opens
// the DNS server's sockets. Any failure is fatal to the agent: a node that
// was asked for Service load balancing or cluster DNS and cannot provide
// them must not pretend to run pods correctly.
func (a *Agent) startNodeNet() (*nodeNet, error) {
	n := &nodeNet{}
	if a.cfg.Dataplane == DataplaneEBPF {
		var nodeIPs []netip.Addr
		if a.nodeIP.IsValid() {
			nodeIPs = append(nodeIPs, a.nodeIP)
		}
		n.uplinks = a.uplinks()
		dp, err := dataplane.New(dataplane.Config{
			CgroupPath: a.cfg.DataplaneCgroup,
			BPFFSPath:  a.cfg.DataplaneBPFFS,
			NodeName:   a.name,
			NodeIPs:    nodeIPs,
			Uplinks:    n.uplinks,
			Logger:     a.cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("start the eBPF dataplane (run with --dataplane none to go without Service load balancing): %w", err)
		}
		n.dp = dp
		n.hostPorts = newHostPortFeed(dp)
	}
	if a.cfg.DNSAddr.IsValid() {
		if err := a.startDNS(n); err != nil {
			n.close()
			return nil, err
		}
	}
	return n, nil
}

// masquerade has the dataplane masquerade the connections of the node's
// pods that leave on an uplink, once the node's pod range is known, and
// reports whether it does. It does only where the dataplane has uplinks
// (its tc programs translate there; with --uplinks none the pod network
// keeps masquerading) and for a node whose pod ranges are all IPv4: the
// CNI bridge's masquerading covers both families or none, and the
// dataplane translates IPv4 only.
func (a *Agent) masquerade(cidrs []netip.Prefix) bool {
	n := a.net
	if n == nil || n.dp == nil || len(n.uplinks) == 0 || len(cidrs) == 0 {
		return false
	}
	for _, c := range cidrs {
		if !c.Addr().Is4() {
			return false
		}
	}
	want := cidrs[0].Masked()
	n.masqMu.Lock()
	defer n.masqMu.Unlock()
	if n.masq == want {
		return true
	}
	if err := n.dp.SetMasquerade(want); err != nil {
		a.log.Warn("masquerade pod connections in the dataplane; the pod network does it instead", "range", want, "err", err)
		return false
	}
	n.masq = want
	a.log.Info("the dataplane masquerades pod connections leaving the node", "range", want)
	return true
}

// collectDataplane sends the eBPF dataplane's counters: nothing when the
// node runs no dataplane.
func (a *Agent) collectDataplane(out sampleWriter) {
	if a.net == nil || a.net.dp == nil {
		return
	}
	st, err := a.net.dp.Stats()
	if err != nil {
		a.log.Debug("read dataplane counters", "err", err)
		return
	}
	out.gauge("tether_edge_dataplane_frontends", "Service frontends programmed into the dataplane.", float64(st.Frontends))
	for _, m := range []struct {
		name, help string
		v          uint64
	}{
		{"tether_edge_dataplane_socket_translations_total", "Connections and datagrams of the node's sockets sent to a Service backend.", st.SocketTranslations},
		{"tether_edge_dataplane_socket_refused_total", "Connections to a Service without usable backends refused at the socket.", st.SocketRefused},
		{"tether_edge_dataplane_uplink_flows_total", "New flows to a NodePort or external address arriving on an uplink.", st.NodePortFlows},
		{"tether_edge_dataplane_uplink_snat_flows_total", "Uplink flows sent to a backend on another node behind the node's address.", st.NodePortSNAT},
		{"tether_edge_dataplane_uplink_reverse_packets_total", "Reply packets translated back on an uplink.", st.NodePortReverse},
		{"tether_edge_dataplane_uplink_refused_total", "TCP resets sent on an uplink for frontends without backends.", st.NodePortRefused},
		{"tether_edge_dataplane_uplink_dropped_total", "Packets dropped on an uplink: Local policy without a local backend, no SNAT port.", st.NodePortDropped},
		{"tether_edge_dataplane_masqueraded_total", "Connections of the node's pods given the node's address on an uplink.", st.Masqueraded},
		{"tether_edge_dataplane_masquerade_dropped_total", "Packets of the node's pods dropped for want of a free masquerade port.", st.MasqueradeDropped},
	} {
		out.counter(m.name, m.help, float64(m.v))
	}
}

// startDNS creates the DNS server and binds its sockets, after putting the
// listen address on the DNS interface.
func (a *Agent) startDNS(n *nodeNet) error {
	addr := a.cfg.DNSAddr
	if a.cfg.DNSInterface != "" {
		kind, err := ensureDNSInterface(a.cfg.DNSInterface, addr.Addr())
		if err != nil {
			return fmt.Errorf("set up the DNS address %s on %s: %w", addr.Addr(), a.cfg.DNSInterface, err)
		}
		a.log.Debug("DNS interface ready", "interface", a.cfg.DNSInterface, "type", kind)
	}
	upstreams := a.cfg.DNSUpstreams
	if len(upstreams) == 0 {
		var err error
		if upstreams, err = hostUpstreams("/etc/resolv.conf", addr.Addr()); err != nil {
			return err
		}
	}
	srv, err := dns.New(dns.Config{
		ClusterDomain: a.cfg.ClusterDomain,
		Upstreams:     upstreams,
		WaitForState:  true,
		Logger:        a.cfg.Logger,
		OnQuery: func(_ string, _ uint16, rcode int, forwarded bool) {
			n.dnsQueries.Add(1)
			if forwarded {
				n.dnsForwarded.Add(1)
			}
			if rcode == mdns.RcodeServerFailure {
				n.dnsFailures.Add(1)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("create the DNS server: %w", err)
	}
	pc, err := net.ListenPacket("udp", addr.String())
	if err != nil {
		return fmt.Errorf("listen for DNS on udp %s: %w", addr, err)
	}
	// The kernel picks the port when addr has none; TCP takes the same.
	bound := netip.AddrPortFrom(addr.Addr(), uint16(pc.LocalAddr().(*net.UDPAddr).Port))
	ln, err := net.Listen("tcp", bound.String())
	if err != nil {
		pc.Close()
		return fmt.Errorf("listen for DNS on tcp %s: %w", bound, err)
	}
	n.dns, n.dnsConn, n.dnsLn = srv, pc, ln
	a.dnsAddr = bound
	a.log.Info("DNS server listening", "addr", bound, "interface", a.cfg.DNSInterface,
		"domain", a.cfg.ClusterDomain, "upstreams", upstreams)
	return nil
}

// run serves DNS and programs the dataplane until ctx ends. Once both
// informers have synced, the DNS server starts answering the cluster zone
// and the dataplane gets its full Sync; failed changes are retried now and
// then afterwards.
func (n *nodeNet) run(ctx context.Context, a *Agent, goRun func(func())) {
	if n.dns != nil {
		goRun(func() {
			if err := n.dns.Serve(ctx, n.dnsConn, n.dnsLn); err != nil && ctx.Err() == nil {
				a.log.Error("DNS server stopped", "err", err)
			}
		})
	}
	if a.services == nil || (n.dp == nil && n.dns == nil) {
		return
	}
	goRun(func() {
		if !a.services.waitSynced(ctx) {
			return
		}
		if n.dns != nil {
			n.dns.SetReady()
		}
		if n.dp != nil {
			// The pods' host ports go in with the first Sync: wait
			// for the pod watch (from the local state after a
			// restart) and give those of the pods that run.
			if c := a.pods.ctrl.Load(); c != nil && !cache.WaitForCacheSync(ctx.Done(), (*c).HasSynced) {
				return
			}
			n.hostPorts.seed(ctx, a)
			n.syncLoop(ctx, a)
		}
	})
}

// syncLoop runs the dataplane's full Sync until it succeeds, then retries
// changes that failed to apply every dataplaneResync.
func (n *nodeNet) syncLoop(ctx context.Context, a *Agent) {
	retry := time.Second
	for {
		start := time.Now()
		err := n.dp.Sync(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			if !n.synced.Swap(true) {
				a.log.Info("dataplane programmed from the Service watches", "took", time.Since(start))
			}
			retry = dataplaneResync
		case !n.synced.Load():
			a.log.Error("program the dataplane", "err", err, "retry in", retry)
			retry = min(2*retry, dataplaneResync)
		default:
			a.log.Warn("retry dataplane changes", "err", err, "retry in", retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// close releases the handles. The dataplane stays loaded (its programs
// attached, its maps pinned), so Services keep working until the next agent
// adopts them; the DNS server stops.
func (n *nodeNet) close() {
	if n.dns != nil {
		n.dns.Close()
	}
	if n.dnsConn != nil {
		n.dnsConn.Close()
	}
	if n.dnsLn != nil {
		n.dnsLn.Close()
	}
	if n.dp != nil {
		n.dp.Close()
	}
}

// uplinks resolves Config.Uplinks: UplinkAuto becomes the interface that
// holds the node's address, or nothing when no interface holds it.
func (a *Agent) uplinks() []string {
	var out []string
	for _, u := range a.cfg.Uplinks {
		if u != UplinkAuto {
			out = append(out, u)
			continue
		}
		name, err := interfaceOf(a.nodeIP)
		if err != nil {
			// A node address that is not the host's (a NAT's public
			// address given as --node-ip) has no uplink to find.
			a.log.Warn("no uplink for NodePorts: the node address is on no interface; name them with --uplinks",
				"nodeIP", a.nodeIP, "err", err)
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// interfaceOf returns the name of the interface that holds addr.
func interfaceOf(addr netip.Addr) (string, error) {
	if !addr.IsValid() {
		return "", errors.New("no node address")
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == addr.Unmap() {
					return ifc.Name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("no interface holds %s", addr)
}

// ensureDNSInterface creates the interface name (a dummy interface, or on
// kernels built without the dummy driver a bridge without ports, which
// holds an address just as well) if it is missing, puts addr on it as a
// host address and sets it up. It returns the interface's type. Pods reach the address through their
// default route to the node, as they reach NodeLocal DNSCache's. The
// interface outlives the agent, so that a restarting agent leaves pods with
// a refused query rather than one routed off the node.
func ensureDNSInterface(name string, addr netip.Addr) (string, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return "", fmt.Errorf("look up interface: %w", err)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: attrs}); err != nil && !errors.Is(err, unix.EEXIST) {
			br := &netlink.Bridge{LinkAttrs: attrs}
			if err2 := netlink.LinkAdd(br); err2 != nil && !errors.Is(err2, unix.EEXIST) {
				return "", fmt.Errorf("create interface: dummy: %w; bridge: %w", err, err2)
			}
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return "", fmt.Errorf("look up interface: %w", err)
		}
	}
	bits := 32
	if addr.Is6() && !addr.Is4In6() {
		bits = 128
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if bits == 128 {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrReplace(l, a); err != nil {
		return "", fmt.Errorf("add address: %w", err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return "", fmt.Errorf("set interface up: %w", err)
	}
	return l.Type(), nil
}

// hostUpstreams reads the node's resolvers from a resolv.conf, leaving out
// self (queries to it would loop back to the agent). A node without
// resolvers gets an empty list: cluster names are still answered.
func hostUpstreams(path string, self netip.Addr) ([]string, error) {
	out := []string{}
	rc, err := mdns.ClientConfigFromFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		return nil, fmt.Errorf("read the node's resolvers: %w", err)
	}
	for _, s := range rc.Servers {
		if a, err := netip.ParseAddr(s); err == nil && a.Unmap() == self.Unmap() {
			continue
		}
		out = append(out, net.JoinHostPort(s, rc.Port))
	}
	return out, nil
}

// Both sinks take the same calls.
var (
	_ serviceSink = (*dataplane.Dataplane)(nil)
	_ serviceSink = (*dns.Server)(nil)
)
