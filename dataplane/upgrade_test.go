package dataplane

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/tether-edge/tether/dataplane/internal/testnet"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestUpgradeReplacesOutdatedMaps starts an agent on pins whose layout an
// older build left (frontend values without a slot range, slots as a hash
// map): the new agent replaces those maps, the programs already attached
// keep serving from the old ones until the first Sync has filled the new
// ones, and connections never fail on the way.
func TestUpgradeReplacesOutdatedMaps(t *testing.T) {
	l := newSockLab(t)
	serveTCP(t, l.be, 8080)
	web := service("web", "10.214.100.1", svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	slice := epSlice("web-1", "web", ports, readyEP(labBackends[0], "node-a"), readyEP(labBackends[1], "node-a"))
	l.dp.UpsertService(web)
	l.dp.UpsertEndpointSlice(slice)
	countBackends(t, dialN(l.cli, "10.214.100.1:80", 10))

	stop := make(chan struct{})
	h := startHammer(t, l.cli, "10.214.100.1:80", stop)
	if err := l.dp.Close(); err != nil {
		t.Fatal(err)
	}
	l.dp = nil

	// Pins as the previous layout had them. The attached programs hold
	// the current maps; only the pins change.
	mapsDir := filepath.Join(l.pins, "maps")
	old := map[string]*ebpf.MapSpec{
		"lb_frontends": {Type: ebpf.Hash, KeySize: 20, ValueSize: 12, MaxEntries: 65536, Flags: 1 /* BPF_F_NO_PREALLOC */},
		"lb_slots":     {Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 524288, Flags: 1},
	}
	for name, spec := range old {
		pin := filepath.Join(mapsDir, name)
		if err := os.Remove(pin); err != nil {
			t.Fatal(err)
		}
		spec.Name = name
		m, err := ebpf.NewMap(spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Pin(pin); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	time.Sleep(50 * time.Millisecond)

	dp, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New on outdated pins: %v", err)
	}
	l.dp = dp
	if !dp.deferAttach {
		t.Fatal("replaced maps but attached the new programs before they were filled")
	}
	// Old programs, old maps: still load-balanced.
	time.Sleep(100 * time.Millisecond)
	countBackends(t, dialN(l.cli, "10.214.100.1:80", 5))

	dp.UpsertService(web)
	dp.UpsertEndpointSlice(slice)
	if err := dp.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dp.deferAttach || len(dp.cgLinks) == 0 {
		t.Fatal("programs not attached after the first Sync")
	}
	for name := range old {
		m, err := ebpf.LoadPinnedMap(filepath.Join(mapsDir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		var spec *ebpf.MapSpec
		if name == "lb_slots" {
			spec = &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 32}
		} else {
			spec = &ebpf.MapSpec{Type: ebpf.Hash, KeySize: 20, ValueSize: 16}
		}
		if m.Type() != spec.Type || m.KeySize() != spec.KeySize || m.ValueSize() != spec.ValueSize {
			t.Errorf("%s is %v %d/%d after the upgrade", name, m.Type(), m.KeySize(), m.ValueSize())
		}
		m.Close()
	}
	time.Sleep(100 * time.Millisecond)
	// New programs, new maps: a change is applied and getpeername still
	// shows the ClusterIP.
	dp.UpsertEndpointSlice(epSlice("web-1", "web", ports, readyEP(labBackends[2], "node-a")))
	rs := dialN(l.cli, "10.214.100.1:80", 10)
	if got := countBackends(t, rs); got[labBackends[2]] != 10 {
		t.Fatalf("change after the upgrade not applied: %v", got)
	}
	if rs[0].peer != "10.214.100.1:80" {
		t.Fatalf("getpeername = %s after the upgrade", rs[0].peer)
	}
	close(stop)
	<-h.done
	ok, fail, lastErr := h.counts()
	if fail != 0 {
		t.Fatalf("%d of %d connections failed across the upgrade; last: %v", fail, ok+fail, lastErr)
	}
	t.Logf("%d connections across the upgrade, 0 failed", ok)
}

// abi2Object is the BPF object of the build before lb_fe_fast and lb_sk_rev
// (ABI 2): the layout that agents in the field have pinned.
const abi2Object = "testdata/lb_abi2_bpfel.o"

// installABI2 sets up what an agent of the ABI 2 build leaves behind: its
// maps pinned under l.pins, its socket programs attached to l.cgroup through
// pinned links, and one Service vip:port → backends:bport written in that
// build's layout.
func installABI2(t *testing.T, l *sockLab, vip string, port uint16, backends []string, bport uint16) {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(abi2Object)
	if err != nil {
		t.Fatal(err)
	}
	cfg := l.cfg
	cfg.setDefaults()
	for name, n := range map[string]int{
		"lb_frontends": cfg.Maps.Frontends, "lb_backends": cfg.Maps.Backends, "lb_slots": 2 * cfg.Maps.Backends,
		"lb_affinity": cfg.Maps.Affinity, "lb_sock_rnat": cfg.Maps.SockRevNAT, "lb_ct4": cfg.Maps.Conntrack,
		"lb_rct4": cfg.Maps.Conntrack,
	} {
		spec.Maps[name].MaxEntries = uint32(n)
	}
	var retval uint8
	if haveSetRetval() {
		retval = 1
	}
	if err := spec.Variables["have_set_retval"].Set(retval); err != nil {
		t.Fatal(err)
	}
	mapsDir, linksDir := filepath.Join(l.pins, "maps"), filepath.Join(l.pins, "links")
	for _, d := range []string{mapsDir, linksDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapsDir}})
	if err != nil {
		t.Fatalf("load the ABI 2 object: %v", err)
	}
	defer coll.Close()

	slices.Sort(backends)
	for i, b := range backends {
		s := lbSlot{Ip: toLbAddr(as16(netip.MustParseAddr(b))), Port: htons(bport), BackendId: uint32(i + 1), FeId: 1}
		if err := coll.Maps["lb_slots"].Put(uint32(i), &s); err != nil {
			t.Fatal(err)
		}
	}
	k := toFeKey(feKey{IP: as16(netip.MustParseAddr(vip)), Port: port, Proto: protoTCP, Scope: scopeInternal})
	v := lbFeVal{Id: 1, Count: uint16(len(backends))}
	if err := coll.Maps["lb_frontends"].Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name, prog string
		attach     ebpf.AttachType
	}{
		{"connect4", "sock4_connect", ebpf.AttachCGroupInet4Connect},
		{"connect6", "sock6_connect", ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", "sock4_sendmsg", ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", "sock6_sendmsg", ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg4", "sock4_recvmsg", ebpf.AttachCGroupUDP4Recvmsg},
		{"recvmsg6", "sock6_recvmsg", ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername4", "sock4_getpeername", ebpf.AttachCgroupInet4GetPeername},
		{"getpeername6", "sock6_getpeername", ebpf.AttachCgroupInet6GetPeername},
		{"post_bind4", "sock4_post_bind", ebpf.AttachCGroupInet4PostBind},
		{"post_bind6", "sock6_post_bind", ebpf.AttachCGroupInet6PostBind},
	} {
		lk, err := link.AttachCgroup(link.CgroupOptions{Path: l.cgroup, Attach: p.attach, Program: coll.Programs[p.prog]})
		if err != nil {
			t.Fatalf("attach ABI 2 %s: %v", p.name, err)
		}
		if err := lk.Pin(filepath.Join(linksDir, "cgroup_"+p.name)); err != nil {
			t.Fatal(err)
		}
		lk.Close()
	}
}

// cookieOf returns the socket cookie of a connection.
func cookieOf(t *testing.T, c net.Conn) uint64 {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ck uint64
	var cerr error
	if err := rc.Control(func(fd uintptr) { ck, cerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE) }); err != nil {
		t.Fatal(err)
	}
	if cerr != nil {
		t.Fatal(cerr)
	}
	return ck
}

// peerOf calls getpeername on a connection now (net.Conn remembers the
// address it saw at connect time).
func peerOf(t *testing.T, c net.Conn) string {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var sa unix.Sockaddr
	var serr error
	if err := rc.Control(func(fd uintptr) { sa, serr = unix.Getpeername(int(fd)) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	in, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		t.Fatalf("getpeername: %T", sa)
	}
	return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)).String()
}

// TestUpgradeFromABI2 upgrades a node that the previous build (ABI 2, its
// BPF object in testdata) serves: the new agent replaces the maps whose
// layout changed, the old programs keep serving until the first Sync has
// filled the new ones, and then the pinned links move to the new programs.
// No connection fails on the way, and a connection opened under the old
// programs (its reverse translation in socket-local storage) still shows
// the ClusterIP as its peer afterwards.
func TestUpgradeFromABI2(t *testing.T) {
	l := newSockNet(t)
	serveTCP(t, l.be, 8080)
	installABI2(t, l, "10.214.100.1", 80, labBackends[:2], 8080)
	testnet.JoinCgroup(t, l.cgroup)
	countBackends(t, dialN(l.cli, "10.214.100.1:80", 10))

	old := openHeld(t, l, "ABI 2")
	defer old.Close()
	stop := make(chan struct{})
	h := startHammer(t, l.cli, "10.214.100.1:80", stop)
	dp, _ := upgradeWeb(t, l, "ABI 2")
	time.Sleep(100 * time.Millisecond)
	checkNewServe(t, dp, l, old, "ABI 2")
	stopHammer(t, h, stop, "ABI 2")
}

// openHeld opens a connection to the lab's Service under the programs of
// the old build (abi) and checks that it shows the ClusterIP as its peer.
func openHeld(t *testing.T, l *sockLab, abi string) net.Conn {
	t.Helper()
	var old net.Conn
	if err := l.cli.Do(func() error {
		var err error
		old, err = net.DialTimeout("tcp", "10.214.100.1:80", 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if p := peerOf(t, old); p != "10.214.100.1:80" {
		old.Close()
		t.Fatalf("getpeername under the %s programs = %s", abi, p)
	}
	return old
}

// upgradeWeb starts the new agent over the pins of the old build (abi)
// while connections are being made: the old programs must keep serving
// until the first Sync has filled the new maps with the Service web, and
// then every pinned link must run a new program. It returns the agent and
// web's endpoint ports.
func upgradeWeb(t *testing.T, l *sockLab, abi string) (*Dataplane, []discoveryv1.EndpointPort) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	dp, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New over %s pins: %v", abi, err)
	}
	l.dp = dp
	if !dp.deferAttach {
		t.Fatal("replaced maps but attached the new programs before they were filled")
	}
	// Old programs, old maps: still load-balanced.
	time.Sleep(100 * time.Millisecond)
	countBackends(t, dialN(l.cli, "10.214.100.1:80", 5))

	ports := syncWeb(t, dp)
	if dp.deferAttach {
		t.Fatal("programs not attached after the first Sync")
	}
	for i, p := range cgroupProgs(dp.objs) {
		li, err := dp.cgLinks[i].Info()
		if err != nil {
			t.Fatal(err)
		}
		pi, err := p.prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		if id, _ := pi.ID(); li.Program != id {
			t.Fatalf("%s link runs program %d, not the new %d", p.name, li.Program, id)
		}
	}
	return dp, ports
}

// checkNewServe checks that the new programs translate connections and
// their peers from lb_sk_rev, and that the connection held since the old
// build (abi) still shows the ClusterIP.
func checkNewServe(t *testing.T, dp *Dataplane, l *sockLab, old net.Conn, abi string) {
	t.Helper()
	// The counters are shared with the hammer's connections, some of
	// which fall back to socket-local storage while the table is busy on
	// a loaded machine: a round of 20 dials in which none did shows the
	// new programs serving from lb_sk_rev.
	var before, after Stats
	for round := 1; ; round++ {
		var err error
		if before, err = dp.Stats(); err != nil {
			t.Fatal(err)
		}
		rs := dialN(l.cli, "10.214.100.1:80", 20)
		countBackends(t, rs)
		for _, r := range rs {
			if r.peer != "10.214.100.1:80" {
				t.Fatalf("getpeername = %s after the upgrade", r.peer)
			}
		}
		if after, err = dp.Stats(); err != nil {
			t.Fatal(err)
		}
		if after.SocketTranslations-before.SocketTranslations >= 20 && after.SocketRevLocal == before.SocketRevLocal {
			break
		}
		if round == 5 {
			t.Fatalf("new programs not serving from lb_sk_rev in 5 rounds; last: %+v → %+v", before, after)
		}
	}
	if p := peerOf(t, old); p != "10.214.100.1:80" {
		t.Fatalf("getpeername of a connection opened under the %s programs = %s after the upgrade", abi, p)
	}
}

// stopHammer stops h and fails the test if any of its connections failed.
func stopHammer(t *testing.T, h *hammer, stop chan struct{}, abi string) {
	t.Helper()
	close(stop)
	<-h.done
	ok, fail, lastErr := h.counts()
	if fail != 0 {
		t.Fatalf("%d of %d connections failed across the upgrade; last: %v", fail, ok+fail, lastErr)
	}
	t.Logf("%d connections across the upgrade from %s, 0 failed", ok, abi)
}

// oldSockHotBits sized the hot part of lb_sk_rev in the builds up to ABI 5:
// 256 entries, this build's warm part.
const oldSockHotBits = 8

// Objects of the builds whose fast frontend table had 128-byte lines: ABI 3
// gave a key one line and wrote the table through a shared mapping, ABI 4
// gave it three lines and a writer program.
const (
	abi3Object = "testdata/lb_abi3_bpfel.o"
	abi4Object = "testdata/lb_abi4_bpfel.o"
)

// wideFeFast is a line of lb_fe_fast as ABI 3 and 4 laid it out.
type wideFeFast struct {
	Seq   uint32
	State uint8
	Pad   [3]uint8
	Key   lbFeKey
	Val   lbFeVal
	Pad2  uint32
	Be    [10][8]byte
}

// installOld sets up what an agent of an older build (object) leaves
// behind: its maps pinned under l.pins (sized as that build sized them from
// l.cfg), its socket programs attached to l.cgroup through pinned links,
// and one Service vip:port → backends:bport in lb_frontends, lb_slots and
// its line of lb_fe_fast, whose lines are 128 bytes (wide: ABI 3 and 4) or
// this build's 64 (ABI 5).
func installOld(t *testing.T, l *sockLab, object string, wide bool, vip string, port uint16, backends []string, bport uint16) {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(object)
	if err != nil {
		t.Fatal(err)
	}
	cfg := l.cfg
	cfg.setDefaults()
	fastBits, sockBits := pow2Bits(cfg.Maps.Frontends, 10), pow2Bits(cfg.Maps.Sockets, 10)
	for name, n := range map[string]int{
		"lb_frontends": cfg.Maps.Frontends, "lb_fe_fast": 1 << fastBits, "lb_sk_rev": 1 << sockBits,
		"lb_backends": cfg.Maps.Backends, "lb_slots": 2 * cfg.Maps.Backends, "lb_affinity": cfg.Maps.Affinity,
		"lb_sock_rnat": cfg.Maps.SockRevNAT, "lb_ct4": cfg.Maps.Conntrack, "lb_rct4": cfg.Maps.Conntrack,
	} {
		spec.Maps[name].MaxEntries = uint32(n)
	}
	var retval uint8
	if haveSetRetval() {
		retval = 1
	}
	for name, v := range map[string]any{
		"have_set_retval": retval, "strong_order": strongOrder(), "fe_fast_bits": fastBits,
		"sk_rev_mask": uint32(1)<<sockBits - 1, "sk_rev_hot_mask": uint32(1)<<min(sockBits, oldSockHotBits) - 1,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	mapsDir, linksDir := filepath.Join(l.pins, "maps"), filepath.Join(l.pins, "links")
	for _, d := range []string{mapsDir, linksDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapsDir}})
	if err != nil {
		t.Fatalf("load %s: %v", object, err)
	}
	defer coll.Close()

	slices.Sort(backends)
	for i, b := range backends {
		s := lbSlot{Ip: toLbAddr(as16(netip.MustParseAddr(b))), Port: htons(bport), BackendId: uint32(i + 1), FeId: 1}
		if err := coll.Maps["lb_slots"].Put(uint32(i), &s); err != nil {
			t.Fatal(err)
		}
	}
	key := feKey{IP: as16(netip.MustParseAddr(vip)), Port: port, Proto: protoTCP, Scope: scopeInternal}
	k := toFeKey(key)
	v := lbFeVal{Id: 1, Count: uint16(len(backends))}
	if err := coll.Maps["lb_frontends"].Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	// The frontend's line, as the ABI 3 build wrote it through a shared
	// mapping of the array (without inline backends: the programs then
	// read lb_slots). The later builds read it the same way.
	fast := coll.Maps["lb_fe_fast"]
	wl := wideFeFast{State: fastUsed, Key: k, Val: v}
	line := unsafe.Slice((*byte)(unsafe.Pointer(&wl)), unsafe.Sizeof(wl))
	if !wide {
		nl := lbFeFast{Key: k, Val: v}
		nl.Val.State = fastUsed
		line = unsafe.Slice((*byte)(unsafe.Pointer(&nl)), unsafe.Sizeof(nl))
	}
	size := len(line)
	if int(fast.ValueSize()) != size {
		t.Fatalf("%s: fast lines of %d bytes, want %d", object, fast.ValueSize(), size)
	}
	mem, err := unix.Mmap(fast.FD(), 0, int(fast.MaxEntries())*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	off := int(fastIndex(key, fastBits)) * size
	copy(mem[off:off+size], line)
	unix.Munmap(mem)

	for _, p := range []struct {
		name, prog string
		attach     ebpf.AttachType
	}{
		{"sock_release", "sock_release", ebpf.AttachCgroupInetSockRelease},
		{"connect4", "sock4_connect", ebpf.AttachCGroupInet4Connect},
		{"connect6", "sock6_connect", ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", "sock4_sendmsg", ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", "sock6_sendmsg", ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg4", "sock4_recvmsg", ebpf.AttachCGroupUDP4Recvmsg},
		{"recvmsg6", "sock6_recvmsg", ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername4", "sock4_getpeername", ebpf.AttachCgroupInet4GetPeername},
		{"getpeername6", "sock6_getpeername", ebpf.AttachCgroupInet6GetPeername},
		{"post_bind4", "sock4_post_bind", ebpf.AttachCGroupInet4PostBind},
		{"post_bind6", "sock6_post_bind", ebpf.AttachCGroupInet6PostBind},
	} {
		lk, err := link.AttachCgroup(link.CgroupOptions{Path: l.cgroup, Attach: p.attach, Program: coll.Programs[p.prog]})
		if err != nil {
			t.Fatalf("attach %s of %s: %v", p.name, object, err)
		}
		if err := lk.Pin(filepath.Join(linksDir, "cgroup_"+p.name)); err != nil {
			t.Fatal(err)
		}
		lk.Close()
	}
}

// TestUpgradeFromABI3 upgrades a node that the ABI 3 build serves, whose
// fast frontend table had 128-byte lines, one per key, and no lb_fe_gen.
func TestUpgradeFromABI3(t *testing.T) { testUpgradeFromWideFast(t, abi3Object, "ABI 3") }

// TestUpgradeFromABI4 upgrades a node that the ABI 4 build serves, whose
// fast frontend table had 128-byte lines, three per key.
func TestUpgradeFromABI4(t *testing.T) { testUpgradeFromWideFast(t, abi4Object, "ABI 4") }

// testUpgradeFromWideFast upgrades a node that a build with 128-byte fast
// lines serves. The fast table's layout changed, so the new agent replaces
// it with the maps it refers to; the old programs keep serving from the old
// maps until the first Sync has filled the new ones, then the links move to
// the new programs. lb_sk_rev is kept: no connection fails on the way, and
// connections opened under the old programs (their reverse translations in
// lb_sk_rev) still show the ClusterIP as their peer. Every entry of the
// old build's hot part of lb_sk_rev is held, so the old programs claim
// entries of the whole table, which their build did not count: the new
// sock_release still frees them, and the agent stops looking for them once
// they are gone.
func testUpgradeFromWideFast(t *testing.T, object, abi string) {
	l, rev := oldNode(t, object, true)
	hot := min(rev.MaxEntries(), 1<<oldSockHotBits)
	holdSkRev(t, rev, hot, hot, true)
	testnet.JoinCgroup(t, l.cgroup)
	countBackends(t, dialN(l.cli, "10.214.100.1:80", 10))

	old := openHeld(t, l, abi)
	defer old.Close()
	oldIdx := uint32(cookieOf(t, old)) & (rev.MaxEntries() - 1)
	var e lbSkRev
	if err := rev.Lookup(oldIdx, &e); err != nil || e.Cookie == 0 || e.Flags != 0 {
		t.Fatalf("entry %d of the connection opened under the %s programs: %+v, %v; want held, uncounted", oldIdx, abi, e, err)
	}

	stop := make(chan struct{})
	h := startHammer(t, l.cli, "10.214.100.1:80", stop)
	dp, ports := upgradeWeb(t, l, abi)
	fast, err := ebpf.LoadPinnedMap(filepath.Join(l.pins, "maps", "lb_fe_fast"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if fast.ValueSize() != uint32(fastLineSize) {
		t.Errorf("pinned lb_fe_fast has %d-byte lines after the upgrade, want %d", fast.ValueSize(), fastLineSize)
	}
	fast.Close()
	time.Sleep(100 * time.Millisecond)
	checkNewServe(t, dp, l, old, abi)
	// The old connection's claim is not counted: the agent keeps
	// sock_release looking at every entry of the whole table.
	time.Sleep(300 * time.Millisecond)
	var cfg lbLbCfg
	if err := dp.objs.LbConfig.Lookup(uint32(0), &cfg); err != nil || cfg.SkRevUncounted == 0 {
		t.Fatalf("lb_config %+v (%v) while a socket of the %s build holds an uncounted entry", cfg, err, abi)
	}
	old.Close()
	// sock_release runs when the kernel frees the socket, which a loaded
	// machine may do a while after the close.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := rev.Lookup(oldIdx, &e)
		if err == nil && e.Cookie == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("entry %d still held 5s after the connection of the %s build closed: %+v, %v", oldIdx, abi, e, err)
		}
	}
	// The made-up holders of the old hot part go too: this build takes
	// those beyond its own hot part for claims of the old build.
	holdSkRev(t, rev, hot, hot, false)
	waitCounted(t, dp, rev)
	// A change now goes through the new writer.
	dp.UpsertEndpointSlice(epSlice("web-1", "web", ports, readyEP(labBackends[2], "node-a")))
	if got := countBackends(t, dialN(l.cli, "10.214.100.1:80", 10)); got[labBackends[2]] != 10 {
		t.Fatalf("change after the upgrade not applied: %v", got)
	}
	stopHammer(t, h, stop, abi)
}

// abi5Object is the build whose hot part of lb_sk_rev was 256 entries, and
// which marked the claims it counted there 0x01.
const abi5Object = "testdata/lb_abi5_bpfel.o"

// TestUpgradeFromABI5 upgrades a node that the ABI 5 build serves. The maps
// keep their layout, so the new agent adopts them all and its programs
// serve at once; what changed is where sockets claim lb_sk_rev entries. A
// connection opened under the old programs in an entry that is now warm,
// and one in its entry of the whole table (counted where the new build
// does not look), still show the ClusterIP as their peer, and closing them
// frees their entries; the agent stops asking sock_release to look for
// such entries once they are gone.
func TestUpgradeFromABI5(t *testing.T) {
	l, rev := oldNode(t, abi5Object, false)
	mask, oldHot := rev.MaxEntries()-1, uint32(1)<<oldSockHotBits-1
	testnet.JoinCgroup(t, l.cgroup)
	countBackends(t, dialN(l.cli, "10.214.100.1:80", 10))
	held := func(idx uint32, ck uint64, flags uint32, what string) {
		t.Helper()
		var e lbSkRev
		if err := rev.Lookup(idx, &e); err != nil || e.Cookie != ck || e.Flags != flags {
			t.Fatalf("entry %d of %s: %+v, %v; want cookie %d, flags %#x", idx, what, e, err, ck, flags)
		}
	}

	// openWhere opens connections under the old programs until one's
	// cookie is what want asks for, and keeps that one.
	openWhere := func(want func(ck uint32) bool, what string) (net.Conn, uint64) {
		t.Helper()
		for range 100 {
			c := openHeld(t, l, "ABI 5")
			if ck := cookieOf(t, c); want(uint32(ck)) {
				t.Cleanup(func() { c.Close() })
				return c, ck
			}
			c.Close()
		}
		t.Fatalf("no connection landed %s", what)
		return nil, 0
	}
	// A connection whose old hot entry is beyond the new hot part.
	warm, warmCk := openWhere(func(ck uint32) bool { return ck&oldHot >= 1<<sockHotBits }, "beyond the new hot part")
	held(uint32(warmCk)&oldHot, warmCk, 0, "the connection in the old hot part")
	// Every other entry of the old hot part held: the next connection
	// claims its entry of the whole table, counted (0x01) in its old hot
	// entry.
	holdSkRev(t, rev, oldHot+1, uint32(warmCk)&oldHot, true)
	whole, wholeCk := openWhere(func(ck uint32) bool { return ck&mask > oldHot }, "beyond the old hot part")
	held(uint32(wholeCk)&mask, wholeCk, 0x01, "the connection in the whole table")

	stop := make(chan struct{})
	h := startHammer(t, l.cli, "10.214.100.1:80", stop)
	time.Sleep(50 * time.Millisecond)
	dp, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New over ABI 5 pins: %v", err)
	}
	l.dp = dp
	if dp.deferAttach {
		t.Fatal("the maps kept their layout, yet the agent waits to attach its programs")
	}
	syncWeb(t, dp)
	checkNewServe(t, dp, l, warm, "ABI 5")
	if p := peerOf(t, whole); p != "10.214.100.1:80" {
		t.Fatalf("getpeername of the connection in the whole table = %s after the upgrade", p)
	}
	time.Sleep(300 * time.Millisecond)
	var cfg lbLbCfg
	if err := dp.objs.LbConfig.Lookup(uint32(0), &cfg); err != nil || cfg.SkRevUncounted == 0 {
		t.Fatalf("lb_config %+v (%v) while sockets of the ABI 5 build hold entries this build does not count", cfg, err)
	}
	warm.Close()
	whole.Close()
	// sock_release runs when the kernel frees the sockets, which a loaded
	// machine may do a while after the close.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var w, h lbSkRev
		if rev.Lookup(uint32(warmCk)&oldHot, &w) == nil && w.Cookie == 0 && rev.Lookup(uint32(wholeCk)&mask, &h) == nil && h.Cookie == 0 {
			break
		}
	}
	held(uint32(warmCk)&oldHot, 0, 0, "the closed connection in the old hot part")
	held(uint32(wholeCk)&mask, 0, 0, "the closed connection in the whole table")
	holdSkRev(t, rev, oldHot+1, uint32(warmCk)&oldHot, false)
	waitCounted(t, dp, rev)
	stopHammer(t, h, stop, "ABI 5")
}

// oldNode sets up a node that an older build (object, see installOld)
// serves, with the Service 10.214.100.1:80 on two backends, and returns it
// with its pinned lb_sk_rev. The new agent looks for uncounted lb_sk_rev
// entries every 100 ms.
func oldNode(t *testing.T, object string, wide bool) (*sockLab, *ebpf.Map) {
	t.Helper()
	first, every := uncountedFirst, uncountedEvery
	t.Cleanup(func() { uncountedFirst, uncountedEvery = first, every })
	uncountedFirst, uncountedEvery = 100*time.Millisecond, 100*time.Millisecond
	l := newSockNet(t)
	serveTCP(t, l.be, 8080)
	installOld(t, l, object, wide, "10.214.100.1", 80, labBackends[:2], 8080)
	rev, err := ebpf.LoadPinnedMap(filepath.Join(l.pins, "maps", "lb_sk_rev"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rev.Close() })
	return l, rev
}

// syncWeb gives dp the Service web, 10.214.100.1:80 on the first two lab
// backends' port 8080, and runs the first Sync. It returns web's endpoint
// ports.
func syncWeb(t *testing.T, dp *Dataplane) []discoveryv1.EndpointPort {
	t.Helper()
	web := service("web", "10.214.100.1", svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	dp.UpsertService(web)
	dp.UpsertEndpointSlice(epSlice("web-1", "web", ports, readyEP(labBackends[0], "node-a"), readyEP(labBackends[1], "node-a")))
	if err := dp.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ports
}

// holdSkRev gives entries [0, n) of lb_sk_rev but skip made-up holders
// (hold), cookies no socket has (the kernel counts up from 1), or frees
// them.
func holdSkRev(t *testing.T, rev *ebpf.Map, n, skip uint32, hold bool) {
	t.Helper()
	for i := range n {
		if i == skip {
			continue
		}
		var e lbSkRev
		if hold {
			e.Cookie = 1<<62 + uint64(i)
		}
		if err := rev.Put(i, &e); err != nil {
			t.Fatal(err)
		}
	}
}

// waitCounted waits until the agent no longer asks sock_release to look
// for uncounted lb_sk_rev entries.
func waitCounted(t *testing.T, dp *Dataplane, rev *ebpf.Map) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var cfg lbLbCfg
		if err := dp.objs.LbConfig.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.SkRevUncounted == 0 {
			return
		}
		if time.Now().After(deadline) {
			n, err := uncountedSockRev(rev)
			t.Fatalf("lb_config still asks sock_release for uncounted entries; %d found (%v)", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
