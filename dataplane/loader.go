package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const bpffsMagic = 0xcafe4a11

var loadSpec = loadLb

// feature is one kernel capability the dataplane needs.
type feature struct {
	what   string
	kernel string
	probe  func() error
}

var requiredFeatures = []feature{
	{"BPF_PROG_TYPE_CGROUP_SOCK_ADDR programs (socket-level load balancing)", "4.17", func() error { return features.HaveProgramType(ebpf.CGroupSockAddr) }},
	{"BPF_PROG_TYPE_CGROUP_SOCK programs (post_bind)", "4.17", func() error { return features.HaveProgramType(ebpf.CGroupSock) }},
	{"BPF_PROG_TYPE_SCHED_CLS programs (NodePort)", "4.1", func() error { return features.HaveProgramType(ebpf.SchedCLS) }},
	{"BPF_MAP_TYPE_LRU_HASH maps", "4.10", func() error { return features.HaveMapType(ebpf.LRUHash) }},
	{"BPF_MAP_TYPE_PERCPU_ARRAY maps", "4.6", func() error { return features.HaveMapType(ebpf.PerCPUArray) }},
	{"BPF_MAP_TYPE_SK_STORAGE maps", "5.2", func() error { return features.HaveMapType(ebpf.SkStorage) }},
	{"mmapable array maps (page-aligned tables)", "5.5", func() error { return features.HaveMapFlag(features.BPF_F_MMAPABLE) }},
	{"BPF_PROG_TYPE_XDP programs, run with BPF_PROG_TEST_RUN (the frontend fast table's writer)", "4.12", func() error { return features.HaveProgramType(ebpf.XDP) }},
	{"BPF atomic compare-and-exchange (lock-free socket table)", "5.12", haveCmpXchg},
	{"cgroup sock_release programs (frees per-socket reverse translations)", "5.9", haveSockRelease},
	{"bpf_get_socket_cookie in sock programs (sock_release)", "5.10", func() error {
		return features.HaveProgramHelper(ebpf.CGroupSock, asm.FnGetSocketCookie)
	}},
	{"bpf_sk_storage_get in sock_addr programs (reverse translation per socket)", "5.10", func() error {
		return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSkStorageGet)
	}},
	{"bpf_get_socket_cookie in sock_addr programs", "5.7", func() error {
		return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetSocketCookie)
	}},
	{"bpf_get_netns_cookie in sock_addr programs (affinity per client namespace)", "5.7", func() error {
		return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetNetnsCookie)
	}},
	{"bpf_get_netns_cookie in sock programs (NodePort bind protection)", "5.8", func() error {
		return features.HaveProgramHelper(ebpf.CGroupSock, asm.FnGetNetnsCookie)
	}},
	{"bpf_fib_lookup in tc programs", "4.18", func() error { return features.HaveProgramHelper(ebpf.SchedCLS, asm.FnFibLookup) }},
	{"bpf_redirect_neigh in tc programs", "5.10", func() error {
		return features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectNeigh)
	}},
}

// haveCmpXchg loads a program with a 64-bit atomic compare-and-exchange on
// its stack, which kernels without BPF atomics (and the -mcpu=v3 code they
// imply) reject.
func haveCmpXchg() error {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SocketFilter,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 0),
			asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
			asm.Mov.Imm(asm.R1, 1),
			// r0 = cmpxchg_64(r10 - 8, r0, r1)
			{OpCode: asm.OpCode(0xdb), Dst: asm.RFP, Src: asm.R1, Offset: -8, Constant: 0xf1},
			asm.Return(),
		},
	})
	if err != nil {
		return err
	}
	return p.Close()
}

// haveSockRelease loads a trivial cgroup/sock_release program: kernels
// without the hook reject its attach type at load time.
func haveSockRelease() error {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:       ebpf.CGroupSock,
		AttachType: ebpf.AttachCgroupInetSockRelease,
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 1),
			asm.Return(),
		},
	})
	if err != nil {
		return err
	}
	return p.Close()
}

// probeKernel checks every required feature and names all that are missing.
func probeKernel() error {
	var missing []error
	for _, f := range requiredFeatures {
		if err := f.probe(); err != nil {
			missing = append(missing, fmt.Errorf("%s (Linux ≥ %s): %w", f.what, f.kernel, err))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("probe kernel features: %w", errors.Join(missing...))
	}
	return nil
}

// haveSetRetval reports whether cgroup programs can choose the errno of a
// refused call (bpf_set_retval, Linux 5.18). Without it a refused connect
// fails with EPERM instead of ECONNREFUSED.
func haveSetRetval() bool {
	return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSetRetval) == nil
}

// cgroupProgs lists the socket programs and their attach points.
func cgroupProgs(o *lbObjects) []struct {
	name   string
	prog   *ebpf.Program
	attach ebpf.AttachType
} {
	return []struct {
		name   string
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{
		// First, so that no socket gets an lb_sk_rev entry that
		// nothing frees.
		{"sock_release", o.SockRelease, ebpf.AttachCgroupInetSockRelease},
		{"connect4", o.Sock4Connect, ebpf.AttachCGroupInet4Connect},
		{"connect6", o.Sock6Connect, ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", o.Sock4Sendmsg, ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", o.Sock6Sendmsg, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg4", o.Sock4Recvmsg, ebpf.AttachCGroupUDP4Recvmsg},
		{"recvmsg6", o.Sock6Recvmsg, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername4", o.Sock4Getpeername, ebpf.AttachCgroupInet4GetPeername},
		{"getpeername6", o.Sock6Getpeername, ebpf.AttachCgroupInet6GetPeername},
		{"post_bind4", o.Sock4PostBind, ebpf.AttachCGroupInet4PostBind},
		{"post_bind6", o.Sock6PostBind, ebpf.AttachCGroupInet6PostBind},
	}
}

// loadObjects loads the BPF collection, reusing the maps pinned under
// mapsDir (creating and pinning them the first time). Pinned maps of
// another layout version (an upgrade that changed lb.h), or whose size
// differs from what this build wants (changed MapSizes), are replaced by
// new, empty ones; replaced names the maps that were.
func loadObjects(cfg *Config, mapsDir string, hostCookie uint64) (objs *lbObjects, replaced []string, err error) {
	spec, err := loadSpec()
	if err != nil {
		return nil, nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	fastBits, sockBits := pow2Bits(cfg.Maps.Frontends, 10), pow2Bits(cfg.Maps.Sockets, 10)
	// lb_sk_rev holds the reverse translations of open connections,
	// which nothing could restore in a new table: a pinned one is kept
	// at its size (a larger MapSizes.Sockets takes effect when the pins
	// are removed; until then more sockets use socket-local storage).
	if n, ok := pinnedSockTable(spec.Maps["lb_sk_rev"], filepath.Join(mapsDir, "lb_sk_rev")); ok && n != 1<<sockBits {
		cfg.Logger.Warn("keeping the pinned socket table at its size", "entries", n, "configured", 1<<sockBits)
		sockBits = uint32(bits.TrailingZeros32(n))
	}
	sizes := map[string]int{
		"lb_frontends": cfg.Maps.Frontends,
		"lb_fe_fast":   1 << fastBits,
		"lb_sk_rev":    1 << sockBits,
		"lb_backends":  cfg.Maps.Backends,
		// Two slot generations per frontend can be live at a flip.
		"lb_slots":     2 * cfg.Maps.Backends,
		"lb_affinity":  cfg.Maps.Affinity,
		"lb_sock_rnat": cfg.Maps.SockRevNAT,
		"lb_ct4":       cfg.Maps.Conntrack,
		"lb_rct4":      cfg.Maps.Conntrack,
	}
	for name, n := range sizes {
		spec.Maps[name].MaxEntries = uint32(n)
	}
	var layout uint32
	if err := spec.Variables["lb_layout"].Get(&layout); err != nil {
		return nil, nil, fmt.Errorf("read lb_layout: %w", err)
	}
	replaced, err = dropIncompatiblePins(spec, mapsDir, layout)
	if err != nil {
		return nil, nil, err
	}
	var retval uint8
	if haveSetRetval() {
		retval = 1
	}
	if err := spec.Variables["have_set_retval"].Set(retval); err != nil {
		return nil, nil, fmt.Errorf("set have_set_retval: %w", err)
	}
	if err := spec.Variables["host_netns_cookie"].Set(hostCookie); err != nil {
		return nil, nil, fmt.Errorf("set host_netns_cookie: %w", err)
	}
	if err := spec.Variables["strong_order"].Set(strongOrder()); err != nil {
		return nil, nil, fmt.Errorf("set strong_order: %w", err)
	}
	if err := spec.Variables["fe_fast_bits"].Set(fastBits); err != nil {
		return nil, nil, fmt.Errorf("set fe_fast_bits: %w", err)
	}
	if err := spec.Variables["sk_rev_mask"].Set(uint32(1)<<sockBits - 1); err != nil {
		return nil, nil, fmt.Errorf("set sk_rev_mask: %w", err)
	}
	if err := spec.Variables["sk_rev_hot_mask"].Set(uint32(1)<<min(sockBits, sockHotBits) - 1); err != nil {
		return nil, nil, fmt.Errorf("set sk_rev_hot_mask: %w", err)
	}
	if err := spec.Variables["sk_rev_warm_mask"].Set(uint32(1)<<min(sockBits, sockWarmBits) - 1); err != nil {
		return nil, nil, fmt.Errorf("set sk_rev_warm_mask: %w", err)
	}
	objs = new(lbObjects)
	err = spec.LoadAndAssign(objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapsDir}})
	if err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, nil, fmt.Errorf("load BPF objects: a map pinned in %s has another layout or size than this build expects (Uninstall, or remove the pins, to start over): %w", mapsDir, err)
		}
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, nil, fmt.Errorf("load BPF objects: verifier rejected a program: %+v", verr)
		}
		return nil, nil, fmt.Errorf("load BPF objects: %w", err)
	}
	return objs, replaced, nil
}

// strongOrder tells the programs whether this CPU keeps loads in order with
// loads and stores with stores (x86 does), so that the lock-free tables
// need no fences there.
var strongOrder = func() uint8 {
	if runtime.GOARCH == "amd64" || runtime.GOARCH == "386" {
		return 1
	}
	return 0
}

// sockHotBits sizes the hot part of lb_sk_rev (64 entries, one 4 KiB page),
// which sockets try first: small enough to stay in a CPU's caches and TLB
// while short-lived connections keep reusing it, since the work of a TCP
// connect and close between two uses of an entry evicts a larger one (256
// entries cost 40-80 ns more per connect on a busy host, 4,096 more still).
// sockWarmBits sizes the warm part (256 entries), which a socket tries when
// a live one holds its hot entry: large enough that a few hundred
// long-lived sockets leave most of it free.
const (
	sockHotBits  = 6
	sockWarmBits = 8
)

// pinnedSockTable returns the size of a pinned lb_sk_rev that this build
// can use as it is but for its size.
func pinnedSockTable(ms *ebpf.MapSpec, pin string) (uint32, bool) {
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		return 0, false
	}
	defer m.Close()
	n := m.MaxEntries()
	if m.Type() != ms.Type || m.KeySize() != ms.KeySize || m.ValueSize() != ms.ValueSize || m.Flags() != ms.Flags ||
		n < 1024 || n&(n-1) != 0 {
		return 0, false
	}
	return n, true
}

// coupledMaps refer to each other: frontend values and fast lines to slot
// ranges, slots and affinity entries to backend ids. When one of them is
// replaced, all are, so that programs still attached never read a new map
// through an old one (an old frontend value into a new slot array, an old
// affinity entry naming a reissued backend id).
var coupledMaps = []string{"lb_frontends", "lb_fe_fast", "lb_slots", "lb_backends", "lb_affinity"}

// connMaps hold the state of open connections, which nothing could
// restore in new maps: they are kept across layout versions while the
// kernel finds them compatible (see LB_LAYOUT in bpf/lb.h).
var connMaps = []string{"lb_sk_rev", "lb_sk_rnat", "lb_sock_rnat", "lb_ct4", "lb_rct4"}

// pinnedLayout returns the layout version stamped in the pinned lb_config
// (the first word of its entry), 0 when there is none.
func pinnedLayout(mapsDir string) uint32 {
	m, err := ebpf.LoadPinnedMap(filepath.Join(mapsDir, "lb_config"), nil)
	if err != nil {
		return 0
	}
	defer m.Close()
	if m.Type() != ebpf.Array || m.KeySize() != 4 || m.ValueSize() < 4 {
		return 0
	}
	v := make([]byte, m.ValueSize())
	if err := m.Lookup(uint32(0), &v); err != nil {
		return 0
	}
	return binary.NativeEndian.Uint32(v)
}

// dropIncompatiblePins removes the pins of maps that spec cannot reuse, so
// that loading creates them anew: all but connMaps when the pinned layout
// version is not layout, and any map whose type, sizes or flags differ
// (changed MapSizes). Programs still attached keep the old maps alive
// until they are replaced.
func dropIncompatiblePins(spec *ebpf.CollectionSpec, mapsDir string, layout uint32) ([]string, error) {
	otherLayout := pinnedLayout(mapsDir) != layout
	drop := map[string]bool{}
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		pin := filepath.Join(mapsDir, name)
		if !exists(pin) {
			continue
		}
		if otherLayout && !slices.Contains(connMaps, name) {
			drop[name] = true
			continue
		}
		m, err := ebpf.LoadPinnedMap(pin, nil)
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", pin, err)
		}
		cerr := ms.Compatible(m)
		m.Close()
		if cerr == nil {
			continue
		}
		if !errors.Is(cerr, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("check pinned map %s: %w", pin, cerr)
		}
		drop[name] = true
	}
	if slices.ContainsFunc(coupledMaps, func(n string) bool { return drop[n] }) {
		for _, n := range coupledMaps {
			if exists(filepath.Join(mapsDir, n)) {
				drop[n] = true
			}
		}
	}
	var replaced []string
	for name := range drop {
		pin := filepath.Join(mapsDir, name)
		if err := os.Remove(pin); err != nil {
			return nil, fmt.Errorf("replace pinned map %s: %w", pin, err)
		}
		replaced = append(replaced, name)
	}
	slices.Sort(replaced)
	return replaced, nil
}

// attachCgroup attaches or adopts the socket programs on cgroupPath. A pinned
// link is updated in place to the new program, which swaps programs
// atomically: no connect() ever runs without a hook.
func attachCgroup(o *lbObjects, cgroupPath, linksDir string) ([]link.Link, error) {
	var st unix.Stat_t
	if err := unix.Stat(cgroupPath, &st); err != nil {
		return nil, fmt.Errorf("stat cgroup %s: %w", cgroupPath, err)
	}
	var links []link.Link
	fail := func(err error) ([]link.Link, error) {
		for _, l := range links {
			l.Close()
		}
		return nil, err
	}
	for _, p := range cgroupProgs(o) {
		pin := filepath.Join(linksDir, "cgroup_"+p.name)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			info, ierr := l.Info()
			if ierr == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == st.Ino {
				if err := l.Update(p.prog); err != nil {
					l.Close()
					return fail(fmt.Errorf("update pinned %s link: %w", p.name, err))
				}
				links = append(links, l)
				continue
			}
			// Pinned for another cgroup: replace it.
			l.Unpin()
			l.Close()
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: p.attach, Program: p.prog})
		if err != nil {
			return fail(fmt.Errorf("attach %s to cgroup %s (needs the %s hook in the kernel): %w", p.name, cgroupPath, p.name, err))
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			return fail(fmt.Errorf("pin %s link (needs bpf_link for cgroups, Linux ≥ 5.7): %w", p.name, err))
		}
		links = append(links, l)
	}
	return links, nil
}

// tcAttachment remembers how the NodePort programs sit on one uplink.
type tcAttachment struct {
	ifname  string
	ifindex int
	links   []link.Link // TCX
	clsact  bool
}

// attachTC puts nodeport_ingress and nodeport_egress on every uplink. It must
// run in the node's network namespace.
func attachTC(o *lbObjects, uplinks []string, mode, linksDir string) ([]tcAttachment, error) {
	var out []tcAttachment
	for _, name := range uplinks {
		nl, err := netlink.LinkByName(name)
		if err != nil {
			return out, fmt.Errorf("find uplink %s: %w", name, err)
		}
		a := tcAttachment{ifname: name, ifindex: nl.Attrs().Index}
		if mode != "clsact" {
			a.links, err = attachTCX(o, a.ifindex, name, linksDir)
			if err == nil {
				out = append(out, a)
				continue
			}
			if mode == "tcx" || !errors.Is(err, ebpf.ErrNotSupported) {
				return out, err
			}
		}
		if err := attachClsact(o, nl); err != nil {
			return out, err
		}
		a.clsact = true
		out = append(out, a)
	}
	return out, nil
}

func attachTCX(o *lbObjects, ifindex int, ifname, linksDir string) ([]link.Link, error) {
	var links []link.Link
	for _, d := range []struct {
		dir    string
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{
		{"ingress", o.NodeportIngress, ebpf.AttachTCXIngress},
		{"egress", o.NodeportEgress, ebpf.AttachTCXEgress},
	} {
		pin := filepath.Join(linksDir, "tcx_"+ifname+"_"+d.dir)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			info, ierr := l.Info()
			if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex {
				if err := l.Update(d.prog); err != nil {
					l.Close()
					closeLinks(links)
					return nil, fmt.Errorf("update pinned tcx %s link on %s: %w", d.dir, ifname, err)
				}
				links = append(links, l)
				continue
			}
			// The interface was recreated since: the old link is gone
			// with it.
			l.Unpin()
			l.Close()
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: d.prog, Attach: d.attach})
		if err != nil {
			closeLinks(links)
			return nil, fmt.Errorf("attach tcx %s on %s: %w", d.dir, ifname, err)
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			closeLinks(links)
			return nil, fmt.Errorf("pin tcx %s link on %s: %w", d.dir, ifname, err)
		}
		links = append(links, l)
	}
	return links, nil
}

// clsact filters are owned by the kernel once added, so they survive the
// agent like pinned links do; replacing a filter with the same handle swaps
// the program atomically.
const tcFilterPrio = 1

func clsactFilter(nl netlink.Link, parent uint32, prog *ebpf.Program) *netlink.BpfFilter {
	fd := -1
	if prog != nil {
		fd = prog.FD()
	}
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: nl.Attrs().Index,
			Parent:    parent,
			Handle:    netlink.MakeHandle(0, 1),
			Protocol:  unix.ETH_P_ALL,
			Priority:  tcFilterPrio,
		},
		Fd:           fd,
		Name:         "tether-nodeport",
		DirectAction: true,
	}
}

func attachClsact(o *lbObjects, nl netlink.Link) error {
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: nl.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc on %s: %w", nl.Attrs().Name, err)
	}
	if err := netlink.FilterReplace(clsactFilter(nl, netlink.HANDLE_MIN_INGRESS, o.NodeportIngress)); err != nil {
		return fmt.Errorf("add ingress filter on %s: %w", nl.Attrs().Name, err)
	}
	if err := netlink.FilterReplace(clsactFilter(nl, netlink.HANDLE_MIN_EGRESS, o.NodeportEgress)); err != nil {
		return fmt.Errorf("add egress filter on %s: %w", nl.Attrs().Name, err)
	}
	return nil
}

// detachClsact removes tether's filters (not the qdisc: others may use it).
func detachClsact(ifname string) error {
	nl, err := netlink.LinkByName(ifname)
	if err != nil {
		return nil // interface gone, filters with it
	}
	var errs []error
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		filters, err := netlink.FilterList(nl, parent)
		if err != nil {
			continue
		}
		for _, f := range filters {
			if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == "tether-nodeport" {
				if err := netlink.FilterDel(bf); err != nil {
					errs = append(errs, fmt.Errorf("delete filter on %s: %w", ifname, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

func closeLinks(ls []link.Link) {
	for _, l := range ls {
		l.Close()
	}
}

// inNetns runs fn on a thread switched into the network namespace at path
// (or on the current thread's namespace when path is empty).
func inNetns(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: if switching back fails it must
		// die rather than serve other goroutines in the wrong namespace.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("open current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave netns %s: %w", path, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// netnsCookie returns the cookie of the calling thread's network namespace
// (SO_NETNS_COOKIE, Linux 5.14), or 0 when the kernel cannot tell.
func netnsCookie() uint64 {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	var v uint64
	l := uint32(8)
	_, _, e := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE,
		uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0
	}
	return v
}

// checkFS verifies that path is on the expected file system.
func checkFS(path string, magic int64, what string) error {
	if !isFS(path, magic) {
		return fmt.Errorf("check %s: %s is not a %s mount", what, path, what)
	}
	return nil
}

// ensureBPFFS creates dir for pins. A node that boots without bpffs on
// /sys/fs/bpf gets it mounted there, as every BPF-based network agent does.
func ensureBPFFS(dir string) error {
	const std = "/sys/fs/bpf"
	if strings.HasPrefix(dir, std+"/") && !isFS(std, bpffsMagic) {
		if err := unix.Mount("bpf", std, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs on %s: %w", std, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pin directory %s: %w", dir, err)
	}
	return checkFS(dir, bpffsMagic, "bpffs")
}
