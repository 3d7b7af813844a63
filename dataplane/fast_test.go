package dataplane

import (
	"net/netip"
	"testing"
)

func fastKey(ip string, port uint16) feKey {
	return feKey{IP: as16(netip.MustParseAddr(ip)), Port: port, Proto: protoTCP, Scope: scopeInternal}
}

// TestFastIndexDense: a range of ClusterIPs on one port fills consecutive
// entries, so a dense Service range never collides with itself.
func TestFastIndexDense(t *testing.T) {
	const bits = 12
	seen := map[uint32]bool{}
	base := netip.MustParseAddr("10.96.0.0")
	a := base
	for range 1 << bits {
		i := fastIndex(fastKey(a.String(), 443), bits)
		if seen[i] {
			t.Fatalf("%s collides in a range of %d addresses", a, 1<<bits)
		}
		seen[i] = true
		a = a.Next()
	}
	// TCP and UDP of one port (DNS) land apart.
	tcp := fastKey("10.96.0.10", 53)
	udp := tcp
	udp.Proto = protoUDP
	if fastIndex(tcp, bits) == fastIndex(udp, bits) {
		t.Fatal("53/TCP and 53/UDP of one address share an entry")
	}
}

// TestFastTableSpill follows the entries of keys that share an index.
func TestFastTableSpill(t *testing.T) {
	const bits = 10
	// Two keys with the same index: the same address, ports whose
	// Fibonacci hashes differ by a multiple of the table size are rare,
	// so search for one.
	a := fastKey("10.96.0.1", 80)
	var b feKey
	for p := uint16(81); ; p++ {
		if k := fastKey("10.96.0.1", p); fastIndex(k, bits) == fastIndex(a, bits) {
			b = k
			break
		}
	}
	idx := fastIndex(a, bits)
	fes := map[feKey]*feState{
		a: {id: 1, val: lbFeVal{Id: 1, Count: 1}, bes: []beEntry{{key: beKey{IP: as16(netip.MustParseAddr("10.1.0.1")), Port: 8080}, id: 1}}},
		b: {id: 2, val: lbFeVal{Id: 2, Count: 0}},
	}
	tab := newFastTable(bits)
	entry := func() lbFeFast {
		t.Helper()
		var bt batch
		tab.flush(fes, &bt)
		for i, k := range bt.fastKeys {
			if k == idx {
				return bt.fastVals[i]
			}
		}
		t.Fatalf("entry %d not written", idx)
		return lbFeFast{}
	}
	tab.add(a)
	e := entry()
	if e.State != fastUsed || fromFeKey(e.Key) != a || e.Val.Flags&feInline == 0 || e.Be[0].Port != htons(8080) {
		t.Fatalf("first key: %+v", e)
	}
	tab.add(b)
	if e := entry(); e.State != fastUsed|fastSpill || fromFeKey(e.Key) != a {
		t.Fatalf("second key of the index: %+v", e)
	}
	if r, s := tab.stats(); r != 1 || s != 1 {
		t.Fatalf("stats %d/%d", r, s)
	}
	// The resident leaves: the spilled key moves in.
	tab.remove(a)
	delete(fes, a)
	if e := entry(); e.State != fastUsed || fromFeKey(e.Key) != b || e.Val.Id != 2 || e.Val.Flags&feInline != 0 {
		t.Fatalf("after the resident left: %+v", e)
	}
	tab.remove(b)
	if e := entry(); e != (lbFeFast{}) {
		t.Fatalf("after both left: %+v", e)
	}
	if len(tab.lines) != 0 {
		t.Fatalf("lines left: %v", tab.lines)
	}
}

// TestFastInline: backends are copied into the entry only when the socket
// hooks can use them from there.
func TestFastInline(t *testing.T) {
	be := func(ip string) beEntry {
		return beEntry{key: beKey{IP: as16(netip.MustParseAddr(ip)), Port: 8080}, id: 7}
	}
	for _, c := range []struct {
		name string
		st   feState
		want bool
	}{
		{"ipv4", feState{val: lbFeVal{Count: 2}, bes: []beEntry{be("10.1.0.1"), be("10.1.0.2")}}, true},
		{"none", feState{val: lbFeVal{Count: 0}}, false},
		{"affinity", feState{val: lbFeVal{Count: 1, Flags: feAffinity}, bes: []beEntry{be("10.1.0.1")}}, false},
		{"ipv6", feState{val: lbFeVal{Count: 1}, bes: []beEntry{be("fd00::1")}}, false},
		{"too many", feState{val: lbFeVal{Count: fastInline + 1}, bes: make([]beEntry, fastInline+1)}, false},
	} {
		var v lbFeFast
		v.Val = c.st.val
		inlineBackends(&c.st, &v)
		if got := v.Val.Flags&feInline != 0; got != c.want {
			t.Errorf("%s: inline %v, want %v", c.name, got, c.want)
		}
	}
}
