package dataplane

import (
	"log/slog"
	"net/netip"
	"os"
	"slices"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Config configures a Dataplane. The zero value of every field is usable
// except where noted.
type Config struct {
	// CgroupPath is the cgroup v2 directory the socket programs attach to.
	// Everything in it and below it is load-balanced. Default: the cgroup
	// v2 root (/sys/fs/cgroup when it is cgroup2, else
	// /sys/fs/cgroup/unified on hybrid hosts).
	CgroupPath string
	// BPFFSPath is the bpffs directory that holds tether's pins (maps/ and
	// links/ below it). Default /sys/fs/bpf/tether.
	BPFFSPath string
	// NodeName selects the node-local endpoints (EndpointSlice nodeName)
	// for the Local traffic policies. Empty: no endpoint is local.
	NodeName string
	// NodeIPs are the node addresses NodePorts answer on: for traffic
	// that arrives on the uplinks, and for connections of the node's own
	// processes and pods, which the socket programs balance. The first
	// IPv4 one is also the SNAT source for externalIP traffic to remote
	// backends. NodePorts and host ports also answer the processes of the
	// node's namespace (NetnsPath) on 127.0.0.1 and ::1, never a pod's
	// connections to its own loopback.
	NodeIPs []netip.Addr
	// Uplinks are the interfaces that carry NodePort and externalIP
	// traffic. Empty: no tc programs are attached.
	Uplinks []string
	// NetnsPath is the node's network namespace (uplinks, the namespace
	// whose binds are kept off NodePorts). Empty: the namespace of the
	// thread that calls New, which for an agent is the host's.
	NetnsPath string
	// TCAttach chooses how tc programs attach: "tcx" (kernel ≥ 6.6),
	// "clsact" (a clsact qdisc with a direct-action cls_bpf filter), or
	// "" for tcx with clsact as the fallback.
	TCAttach string
	// SNATPortMin and SNATPortMax bound the source ports used when
	// NodePort traffic is forwarded to another node. Default 61000-65535,
	// above Linux's default ephemeral range.
	SNATPortMin, SNATPortMax uint16
	// Masquerade is the node's IPv4 pod range. Connections its pods open
	// to addresses outside it that leave on an uplink take the first IPv4
	// node address and a port of the SNAT range, and their replies are
	// turned back, per packet in the tc programs: the masquerading the CNI
	// bridge plugin's ipMasq does with iptables rules. The zero Prefix
	// masquerades nothing; SetMasquerade changes it later (the range is
	// assigned by the hub after the node registers).
	Masquerade netip.Prefix
	// Maps sizes the maps. The frontend, slot and socket tables are
	// preallocated, so their memory follows these sizes, not the number of
	// Services.
	// Changing a size of an existing installation replaces the affected
	// pinned maps with new, empty ones (see New).
	Maps MapSizes
	// Logger receives the dataplane's logs. Default slog.Default().
	Logger *slog.Logger
	// Observers receive every Upsert and Delete call after the dataplane
	// has recorded it (the DNS server is one).
	Observers []Observer
}

// MapSizes bounds the number of entries of the main maps. Zero values take
// the defaults in parentheses.
type MapSizes struct {
	// (65536) Service frontends: ClusterIP/externalIP/NodePort × port ×
	// scope, and each NodePort once more per node address and loopback
	// address of its family (for the node's own sockets). The socket hooks' fast table has the next power of two of
	// lines (64 bytes each). With ClusterIPs drawn at random, as
	// Kubernetes draws them, a quarter-full table has 88 % of its
	// frontends in the first line they look in and 1 % in none (left to
	// the slower lb_frontends), a half-full one 76 % and 5 %, a full one
	// 56 % and 21 %. Size it at two to four times the frontends a node
	// must serve fast.
	Frontends  int
	Backends   int // (262144) backends, counted once per frontend they serve; lb_slots holds twice as many
	Affinity   int // (65536) affinity entries (sessionAffinity: ClientIP)
	Sockets    int // (65536, rounded up to a power of two) connected sockets whose reverse translation lb_sk_rev holds; the rest use socket-local storage
	SockRevNAT int // (65536) unconnected UDP translations (socket, backend) remembered for recvmsg
	Conntrack  int // (65536) north-south flows
}

// Observer receives the same Service and EndpointSlice changes as the
// Dataplane. dns.Server implements it.
type Observer interface {
	UpsertService(*corev1.Service)
	DeleteService(namespace, name string)
	UpsertEndpointSlice(*discoveryv1.EndpointSlice)
	DeleteEndpointSlice(namespace, name string)
}

// DefaultBPFFSPath is where the dataplane pins its maps and links when
// Config.BPFFSPath is empty.
const DefaultBPFFSPath = "/sys/fs/bpf/tether"

const (
	defaultBPFFSPath = DefaultBPFFSPath
	defaultSNATMin   = 61000
	defaultSNATMax   = 65535
)

func (c *Config) setDefaults() {
	if c.CgroupPath == "" {
		c.CgroupPath = defaultCgroupRoot()
	}
	if c.BPFFSPath == "" {
		c.BPFFSPath = defaultBPFFSPath
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.SNATPortMin == 0 || c.SNATPortMax < c.SNATPortMin {
		c.SNATPortMin, c.SNATPortMax = defaultSNATMin, defaultSNATMax
	}
	m := &c.Maps
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&m.Frontends, 65536)
	def(&m.Backends, 262144)
	def(&m.Affinity, 65536)
	def(&m.Sockets, 65536)
	def(&m.SockRevNAT, 65536)
	def(&m.Conntrack, 65536)
}

// defaultCgroupRoot finds the cgroup v2 root: /sys/fs/cgroup on unified
// hosts, /sys/fs/cgroup/unified on hybrid ones.
func defaultCgroupRoot() string {
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if isFS(p, unix.CGROUP2_SUPER_MAGIC) {
			return p
		}
	}
	return "/sys/fs/cgroup"
}

func isFS(path string, magic int64) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return int64(st.Type) == magic
}

// nodeAddrs returns the usable node addresses of ips in their order,
// IPv4-mapped ones unmapped and each once.
func nodeAddrs(ips []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range ips {
		a = a.Unmap().WithZone("")
		if !a.IsValid() || a.IsUnspecified() || slices.Contains(out, a) {
			continue
		}
		out = append(out, a)
	}
	return out
}

// sockAddrs returns the addresses on which NodePorts and host ports answer
// the node's own sockets: the node addresses, and 127.0.0.1 and ::1 when
// hostCookie names the node's network namespace, in which alone the
// socket programs translate loopback (a pod's loopback is its own). Without
// the cookie (Linux < 5.14 has no SO_NETNS_COOKIE) loopback is not served.
func sockAddrs(nodeIPs []netip.Addr, hostCookie uint64) []netip.Addr {
	if hostCookie == 0 {
		return nodeIPs
	}
	return nodeAddrs(append(slices.Clone(nodeIPs), netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()))
}

// pow2Bits returns the smallest b ≥ min with 1<<b ≥ n.
func pow2Bits(n int, min uint32) uint32 {
	b := min
	for 1<<b < n {
		b++
	}
	return b
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
