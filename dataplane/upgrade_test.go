package dataplane

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestUpgradeReplacesOtherLayout upgrades a node whose pinned maps carry
// another layout version than this build's (the running agent's lb_config
// restamped with the version before it, as a build of that version leaves
// them): the new agent replaces every map but those of open connections,
// the programs already attached keep serving from the old maps until the
// first Sync has filled the new ones, then every pinned link moves to the
// new programs. No connection fails on the way, and a connection opened
// before still shows the ClusterIP as its peer (lb_sk_rev is kept).
func TestUpgradeReplacesOtherLayout(t *testing.T) {
	l := newSockLab(t)
	serveTCP(t, l.be, 8080)
	ports := syncWeb(t, l.dp)
	countBackends(t, dialN(l.cli, "10.214.100.1:80", 10))
	held := openHeld(t, l)
	defer held.Close()

	stop := make(chan struct{})
	h := startHammer(t, l.cli, "10.214.100.1:80", stop)
	mapsDir := filepath.Join(l.pins, "maps")
	before := pinnedMapIDs(t, mapsDir)
	var layout uint32
	if err := l.dp.objs.LbLayout.Get(&layout); err != nil || layout == 0 {
		t.Fatalf("lb_layout = %d, %v", layout, err)
	}
	// What a build of the version before this one pinned: its stamp.
	cfg := make([]byte, l.dp.objs.LbConfig.ValueSize())
	if err := l.dp.objs.LbConfig.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	if got := binary.NativeEndian.Uint32(cfg); got != layout {
		t.Fatalf("lb_config is stamped with layout %d, want %d", got, layout)
	}
	binary.NativeEndian.PutUint32(cfg, layout-1)
	if err := l.dp.objs.LbConfig.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
	if err := l.dp.Close(); err != nil {
		t.Fatal(err)
	}
	l.dp = nil
	time.Sleep(50 * time.Millisecond)

	dp, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New over pins of layout %d: %v", layout-1, err)
	}
	l.dp = dp
	if !dp.deferAttach {
		t.Fatal("replaced maps but attached the new programs before they were filled")
	}
	after := pinnedMapIDs(t, mapsDir)
	for name, id := range before {
		kept := after[name] == id
		if want := slices.Contains(connMaps, name); kept != want {
			t.Errorf("%s kept %v across the layout change, want %v", name, kept, want)
		}
	}
	// Old programs, old maps: still load-balanced.
	time.Sleep(100 * time.Millisecond)
	countBackends(t, dialN(l.cli, "10.214.100.1:80", 5))

	syncWeb(t, dp)
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
	if got := pinnedLayout(mapsDir); got != layout {
		t.Errorf("pinned layout %d after the upgrade, want %d", got, layout)
	}
	time.Sleep(100 * time.Millisecond)
	// New programs, new maps: a change is applied, getpeername still
	// shows the ClusterIP, also for the connection opened before.
	dp.UpsertEndpointSlice(epSlice("web-1", "web", ports, readyEP(labBackends[2], "node-a")))
	rs := dialN(l.cli, "10.214.100.1:80", 10)
	if got := countBackends(t, rs); got[labBackends[2]] != 10 {
		t.Fatalf("change after the upgrade not applied: %v", got)
	}
	if rs[0].peer != "10.214.100.1:80" {
		t.Fatalf("getpeername = %s after the upgrade", rs[0].peer)
	}
	if p := peerOf(t, held); p != "10.214.100.1:80" {
		t.Fatalf("getpeername of a connection opened before the upgrade = %s", p)
	}
	close(stop)
	<-h.done
	ok, fail, lastErr := h.counts()
	if fail != 0 {
		t.Fatalf("%d of %d connections failed across the upgrade; last: %v", fail, ok+fail, lastErr)
	}
	t.Logf("%d connections across the upgrade, 0 failed", ok)
}

// pinnedMapIDs returns the ids of the maps pinned in mapsDir, by name.
func pinnedMapIDs(t *testing.T, mapsDir string) map[string]ebpf.MapID {
	t.Helper()
	ids := map[string]ebpf.MapID{}
	spec, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	for name := range spec.Maps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(mapsDir, name), nil)
		if err != nil {
			continue
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		ids[name] = id
	}
	if len(ids) == 0 {
		t.Fatalf("no maps pinned in %s", mapsDir)
	}
	return ids
}

// openHeld opens a connection to the lab's Service and checks that it
// shows the ClusterIP as its peer.
func openHeld(t *testing.T, l *sockLab) net.Conn {
	t.Helper()
	var c net.Conn
	if err := l.cli.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", "10.214.100.1:80", 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if p := peerOf(t, c); p != "10.214.100.1:80" {
		c.Close()
		t.Fatalf("getpeername = %s", p)
	}
	return c
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

// syncWeb gives dp the Service web, 10.214.100.1:80 on the first two lab
// backends' port 8080, and runs a Sync. It returns web's endpoint ports.
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
