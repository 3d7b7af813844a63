package dataplane

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
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
